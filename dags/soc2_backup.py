"""SOC 2 nightly backup: a real ``pg_dump`` of a database into a file, verified.

Compliance job: it must run every night and never be missed. The DAG opts into the cluster
policy (tag ``exactly-once``), so a second run for the same night returns the first run's
recorded result instead of dumping again, and a run whose scheduler dies is taken over; the
missed-run watcher reports a night with no succeeded backup. The dump is checked with
``pg_restore --list`` and its SHA-256 is recorded in the audit trail (the task's result).

Params: ``source_conn_id`` (the database to back up), ``backup_dir``, ``pg_bin`` (folder of
``pg_dump``/``pg_restore``; default: found on PATH or under /usr/lib/postgresql).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from airflow_plugins.protection.config import sink_dsn


def _pg_tool(name: str, folder: str) -> str:
    if folder:
        return str(Path(folder) / name)
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not candidates:
        raise FileNotFoundError(f"{name} not found: set the pg_bin param")
    return str(candidates[-1])


with DAG(
    dag_id="soc2_nightly_backup",
    schedule="0 1 * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["compliance", "soc2", "example", "exactly-once"],
    params={
        "source_conn_id": Param("billing_db", type="string"),
        "backup_dir": Param("/tmp/soc2-backups", type="string"),
        "pg_bin": Param("", type="string"),
    },
    doc_md=__doc__,
):

    @task(retries=4, retry_delay=pendulum.duration(seconds=30))
    def backup() -> dict[str, Any]:
        """Dumps the source database (custom format) and verifies the archive."""
        context = get_current_context()
        params = context["params"]
        conf = context["dag_run"].conf or {}
        night = str(conf.get("business_date") or context["ds"])
        dsn = sink_dsn(params["source_conn_id"])
        folder = Path(params["backup_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{params['source_conn_id']}-{night}.dump"
        partial = target.with_suffix(".partial")
        subprocess.run(
            [_pg_tool("pg_dump", params["pg_bin"]), "--format=custom", "--file", str(partial), dsn],
            check=True,
            capture_output=True,
            timeout=3600,
        )
        listing = subprocess.run(
            [_pg_tool("pg_restore", params["pg_bin"]), "--list", str(partial)],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(partial, target)  # only a verified dump gets the final name
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        return {
            "path": str(target),
            "bytes": target.stat().st_size,
            "sha256": digest,
            "objects": sum(1 for line in listing.stdout.splitlines() if line and line[0] != ";"),
        }

    backup()
