"""The bridge worker: one command, one Temporal worker per priority lane.

    BRIDGE_LEASE_DSN=postgresql://... BRIDGE_TEMPORAL_ADDR=temporal:7233 python -m bridge.worker

Each lane (``billing``, ``default``, ``analytics``...) is its own task queue with its own activity
slots, so a backlog of analytics runs never delays billing. A DAG's runs are handed to its lane's
queue. SIGTERM drains: running activities finish (or are retried elsewhere), then it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from airflow_plugins.lease import LeaseStore
from bridge.config import BridgeConfig, ConfigError
from bridge.cutover import ModeStore, migrate_bridge
from bridge.temporal.client import connect
from bridge.temporal.codec import codec_from_env, warn_if_unencrypted
from bridge.worker.activities import BridgeActivities
from bridge.worker.attempt_watch import TemporalAttemptWatch
from bridge.worker.catalog import TaskCatalog
from bridge.worker.workflows import DagRunWorkflow, MappedChunkWorkflow, ScheduledDagWorkflow

log = logging.getLogger(__name__)
WORKFLOWS = [DagRunWorkflow, MappedChunkWorkflow, ScheduledDagWorkflow]


def build_workers(
    client: Client,
    config: BridgeConfig,
    activities: BridgeActivities,
    *,
    lanes: Sequence[str] | None = None,
) -> list[Worker]:
    """One worker per lane, each with its lane's share of activity slots and threads."""
    workers = []
    for lane in lanes or list(config.lanes):
        slots = config.lanes[lane]
        workers.append(
            Worker(
                client,
                task_queue=config.task_queue(lane),
                workflows=WORKFLOWS,
                activities=activities.all(),
                activity_executor=ThreadPoolExecutor(slots, thread_name_prefix=f"bridge-{lane}"),
                max_concurrent_activities=slots,
                graceful_shutdown_timeout=timedelta(seconds=10),
            )
        )
    return workers


async def serve(config: BridgeConfig, lanes: Sequence[str] | None = None) -> None:
    """Runs the lanes' workers until SIGTERM or SIGINT."""
    if not config.lease_dsn:
        raise ConfigError("the worker needs the lease store: set BRIDGE_LEASE_DSN")
    if os.environ.get("BRIDGE_MIGRATE_AT_START", "1") != "0":
        # a least-privilege role cannot migrate: docker/ migrates in airflow-init and sets 0
        migrate_bridge(config.lease_dsn)
    codec = codec_from_env()
    warn_if_unencrypted(codec)
    client = await connect(config, codec=codec)
    store = LeaseStore(config.lease_dsn)
    catalog = TaskCatalog(config.dags_folder)
    catalog.load()  # on the main thread (see TaskCatalog.load)
    watch = TemporalAttemptWatch(client, asyncio.get_running_loop())
    activities = BridgeActivities(store, catalog, ModeStore(store), watch)
    workers = build_workers(client, config, activities, lanes=lanes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(w.run()) for w in workers]
    log.info("bridge worker up on %s", [w.task_queue for w in workers])
    print("bridge worker ready", flush=True)
    await stop.wait()
    await asyncio.gather(*(w.shutdown() for w in workers))
    await asyncio.gather(*runs, return_exceptions=True)
    store.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m bridge.worker [--lane billing ...]``."""
    parser = argparse.ArgumentParser(prog="bridge-worker", description=__doc__)
    parser.add_argument("--lane", action="append", help="serve only these lanes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    code = 0
    try:
        asyncio.run(serve(BridgeConfig.load(), args.lane))
    except Exception:
        log.exception("bridge worker stopped")
        code = 1
    # temporalio's runtime can abort at interpreter exit; leave without it
    os._exit(code)


if __name__ == "__main__":
    main()
