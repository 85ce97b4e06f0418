"""``python -m bridge.cli``: the migration's commands.

    inventory [--dags-folder D]                 translatability report of every DAG
    mode list | mode get DAG                    cutover modes
    mode check DAG [--dags-folder D]            would `mode set DAG shadow` pass the gate?
    mode set DAG MODE --actor A --reason R      change a mode (audited; --force to skip gates)
        [--overlap buffer_one] [--no-airflow-pause]
    compare DAG [--limit N]                     comparison rows and readiness
    cancel WORKFLOW_ID                          cancel a handed-over run
    tasks WORKFLOW_ID...                        per-task states of handed-over runs (history)
    worker [--lane L]                           the bridge worker
    handover                                    (internal) JSON request on stdin

Settings come from the environment / airflow.cfg (see ``bridge.config``). ``--json`` (before or
after the command) prints JSON lines for scripts. Exit codes: 0 done, 1 refused (the message
says why), 2 usage or configuration, 3 unreachable (Temporal or the lease store).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
from temporalio.converter import value_to_type

from airflow_plugins.lease import InvalidLeaseInput, LeaseStore, LeaseStoreUnavailable
from airflow_plugins.lease.command_line import (
    EXIT_CODES,
    EXIT_USAGE,
    CommandParser,
    add_global_options,
    fail,
)
from bridge.comparison import readiness, recent, waits
from bridge.config import BridgeConfig, ConfigError, TemporalUnavailable
from bridge.cutover import CutoverMode, ModeChangeRefused, ModeStore, migrate_bridge
from bridge.spec import DagSpec
from bridge.temporal.client import connect

EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3


def _store(config: BridgeConfig) -> LeaseStore:
    dsn = config.lease_dsn
    if not dsn:
        try:
            from airflow_plugins.protection.config import lease_dsn

            dsn = lease_dsn()
        except Exception as exc:
            raise ConfigError(f"no lease store: set BRIDGE_LEASE_DSN ({exc})") from exc
    migrate_bridge(dsn)
    return LeaseStore(dsn)


def _dags(folder: str | None, errors: list[str] | None = None) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    if folder and os.path.abspath(folder) not in map(os.path.abspath, sys.path):
        # as Airflow does for its own DAG folder: DAG files import their folder's modules
        sys.path.insert(0, os.path.abspath(folder))
    with contextlib.redirect_stdout(sys.stderr):  # Airflow logs the parse on stdout: keep
        bag = DagBag(folder, safe_mode=False) if folder else DagBag(safe_mode=False)  # it clean
    for path, error in bag.import_errors.items():
        last = str(error).strip().splitlines()[-1] if str(error).strip() else "import failed"
        print(f"import error in {path}: {last}", file=sys.stderr)
        if errors is not None:
            errors.append(path)
    return dict(bag.dags)


def cmd_inventory(args: argparse.Namespace, config: BridgeConfig) -> int:
    """Prints the translatability report; exit 1 when any DAG is not translatable (or does not
    import)."""
    from bridge.in_airflow.translate import inventory

    errors: list[str] = []
    with contextlib.redirect_stdout(sys.stderr):  # Airflow's log lines, not the report
        found = inventory(_dags(args.dags_folder or config.dags_folder, errors).values())
    for translation in found:
        if args.json:
            refused = [dataclasses.asdict(u) for u in translation.untranslatable]
            line = {"dag_id": translation.dag_id, "translatable": translation.ok}
            print(json.dumps({**line, "untranslatable": refused, "notes": list(translation.notes)}))
        else:
            print(translation.report())
    summary = {"dags": len(found), "translatable": sum(t.ok for t in found)}
    print(json.dumps({**summary, "import_errors": len(errors)} if errors else summary))
    return 0 if all(t.ok for t in found) and not errors else EXIT_REFUSED


def cmd_mode(args: argparse.Namespace, config: BridgeConfig) -> int:
    """Reads, checks or changes cutover modes."""
    if args.action == "check":
        return cmd_mode_check(args, config)
    with _store(config) as store:
        modes = ModeStore(store)
        if args.action == "list":
            for row in modes.describe():
                if args.json:
                    print(json.dumps(row, default=str, sort_keys=True))
                else:
                    print(f"{row['dag_id']}\t{row['mode']}\tv{row['version']}\t{row['changed_by']}")
            return 0
        if args.action == "get":
            mode = modes.get(args.dag_id).value
            print(json.dumps({"dag_id": args.dag_id, "mode": mode}) if args.json else mode)
            return 0
        return _mode_set(args, config, store, modes)


def _mode_set(
    args: argparse.Namespace, config: BridgeConfig, store: LeaseStore, modes: ModeStore
) -> int:
    """``mode set DAG MODE``: the gates, the change, and for ``temporal-scheduled`` its
    Schedule and the Airflow DAG's pause. Entering it, the Schedule is made before the mode
    changes (a Schedule whose DAG is not in the mode starts nothing), so a failure changes
    nothing; leaving it, the mode changes first and Airflow is unpaused before the Schedule is
    deleted, so a rollback never waits on Temporal (a Schedule that could not be deleted is
    said, and the command still succeeds)."""
    target = CutoverMode.parse(args.mode)
    current = modes.get(args.dag_id)
    if target is CutoverMode.SHADOW and not args.force:
        note = _check_shadow(args, config)
        if note:
            print(f"note: {note}", file=sys.stderr)
    entering = target is CutoverMode.TEMPORAL_SCHEDULED and current is not target
    leaving = current is CutoverMode.TEMPORAL_SCHEDULED and target is not current
    said: dict[str, str] = {}
    if entering:
        # the DAG must translate and its timetable fit a Schedule before anything is made
        said["schedule"] = _create_schedule(args, config, _scheduled_spec(args, config))
    verdict = readiness(store, args.dag_id, config.ready_after)
    try:
        change = modes.set(
            args.dag_id,
            target,
            actor=args.actor,
            reason=args.reason,
            force=args.force,
            ready=verdict.ready,
            why_not_ready=verdict.why_not(),
        )
    except BaseException:
        if entering:  # the mode did not change: the Schedule made for it goes
            _delete_schedule(args, config)
        raise
    if entering:
        _airflow_pause(args, "pause")
    if leaving:
        _airflow_pause(args, "unpause")
        left = _delete_schedule(args, config)
        if left:
            said["schedule_left"] = left
    if args.json:
        print(
            json.dumps(
                {
                    "dag_id": args.dag_id,
                    "previous": change.previous.value,
                    "current": change.current.value,
                    "version": change.version,
                    **said,
                }
            )
        )
    else:
        print(
            f"{args.dag_id}: {change.previous.value} -> {change.current.value} (v{change.version})"
        )
    return 0


def _check_shadow(args: argparse.Namespace, config: BridgeConfig) -> str | None:
    """The shadow gate (``bridge.in_airflow.shadow_gate.check_shadow``) on the DAG folder.

    Returns:
        A note when shadow is allowed but nothing hands the DAG to Temporal.

    Raises:
        ModeChangeRefused: no DAG folder, the DAG is not in it, or it has tasks Temporal would
            run with effects (named).
    """
    from bridge.in_airflow.shadow_gate import check_shadow

    folder = args.dags_folder or config.dags_folder
    if not folder:
        raise ModeChangeRefused(
            f"{args.dag_id}: cannot tell which of its tasks Temporal would run in shadow without "
            "the DAG folder: give --dags-folder (or BRIDGE_DAGS_FOLDER), or --force"
        )
    return check_shadow(args.dag_id, _dags(folder), folder)


def cmd_mode_check(args: argparse.Namespace, config: BridgeConfig) -> int:
    """``mode check DAG``: whether ``mode set DAG shadow`` would pass the shadow gate (reads
    the DAG folder only, changes nothing; what the plugin's page runs before a change)."""
    try:
        note = _check_shadow(args, config)
    except ModeChangeRefused as exc:
        if args.json:
            print(json.dumps({"dag_id": args.dag_id, "shadow": "refused", "why": str(exc)}))
            return EXIT_REFUSED
        raise
    if args.json:
        print(json.dumps({"dag_id": args.dag_id, "shadow": "allowed", "note": note}))
    else:
        print(f"{args.dag_id}: shadow allowed" + (f" (note: {note})" if note else ""))
    return 0


def _scheduled_spec(args: argparse.Namespace, config: BridgeConfig) -> DagSpec:
    """The spec a Temporal Schedule of ``args.dag_id`` would start (checked, nothing changed).

    Raises:
        ConfigError: no DAG folder, or the DAG is not in it.
        UntranslatableDag: tasks the bridge cannot run (named).
        NoCronSchedule: no cron, or a timetable a Schedule cannot reproduce (named).
    """
    from bridge.in_airflow.translate import UntranslatableDag, translate
    from bridge.temporal.schedule import schedule_spec

    folder = args.dags_folder or config.dags_folder
    if not folder:
        raise ConfigError(
            f"{args.dag_id}: temporal-scheduled runs the DAG's code from the DAG folder: give "
            "--dags-folder (or BRIDGE_DAGS_FOLDER)"
        )
    dag = _dags(folder).get(args.dag_id)
    if dag is None:
        raise ConfigError(f"{args.dag_id} is not in the DAG folder {folder}")
    translation = translate(dag)
    if translation.spec is None:
        raise UntranslatableDag(translation)
    schedule_spec(translation.spec)
    return translation.spec


#: how long a Schedule call and ``airflow dags pause`` may take before the command gives up
SCHEDULE_RPC_TIMEOUT_S = 15.0
PAUSE_TIMEOUT_S = 120.0


def _create_schedule(args: argparse.Namespace, config: BridgeConfig, spec: DagSpec) -> str:
    """Creates the DAG's Temporal Schedule (one left from before is replaced); returns its id.

    Raises:
        TemporalUnavailable: Temporal did not answer; nothing was made.
    """
    from bridge.temporal import schedule

    async def create() -> str:
        client = await connect(config)
        return await schedule.create_schedule(
            client,
            spec,
            config.task_queue(spec.lane),
            overlap=args.overlap,
            rpc_timeout_s=SCHEDULE_RPC_TIMEOUT_S,
        )

    sid = asyncio.run(create())
    print(f"created Temporal schedule {sid}", file=sys.stderr if args.json else sys.stdout)
    return sid


def _delete_schedule(args: argparse.Namespace, config: BridgeConfig) -> str:
    """Deletes the DAG's Temporal Schedule; returns "" when it is gone, else its id (and says
    how to delete it): its ticks start nothing outside ``temporal-scheduled``."""
    from bridge.temporal import schedule

    sid = schedule.schedule_id(args.dag_id)

    async def delete() -> None:
        client = await connect(config)
        await schedule.delete_schedule(client, args.dag_id, rpc_timeout_s=SCHEDULE_RPC_TIMEOUT_S)

    try:
        asyncio.run(delete())
    except Exception as exc:
        print(
            f"warning: {args.dag_id}: the Temporal schedule {sid} could not be deleted "
            f"({type(exc).__name__}); its ticks start nothing outside temporal-scheduled. Delete "
            f"it when Temporal is back: temporal schedule delete --schedule-id {sid} --address "
            f"{config.temporal_address} --namespace {config.namespace}",
            file=sys.stderr,
        )
        return sid
    print(f"deleted Temporal schedule {sid}", file=sys.stderr if args.json else sys.stdout)
    return ""


def _airflow_pause(args: argparse.Namespace, verb: str) -> None:
    """``airflow dags pause|unpause DAG`` (unless ``--no-airflow-pause``), bounded."""
    if args.no_airflow_pause:
        return
    try:
        done = subprocess.run(
            ["airflow", "dags", verb, args.dag_id], capture_output=True, timeout=PAUSE_TIMEOUT_S
        )
        code: object = done.returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        code = type(exc).__name__
    out = sys.stderr if args.json else sys.stdout
    print(f"airflow dags {verb} {args.dag_id}: exit {code}", file=out)


def cmd_compare(args: argparse.Namespace, config: BridgeConfig) -> int:
    """Prints a DAG's latest comparisons and whether it is ready to cut over."""
    with _store(config) as store:
        for wait in waits(store, args.dag_id):
            if args.json:
                print(json.dumps({"pending": True, **wait}, default=str, sort_keys=True))
                continue
            print(f"{wait['business_date']}\tpending since {wait['since']:%Y-%m-%d %H:%M:%S%z}")
            print(f"    {wait['reason']}")
        for row in recent(store, args.dag_id, args.limit):
            if args.json:
                print(json.dumps(row, default=str, sort_keys=True))
                continue
            verdict = "match" if row["matched"] else "DIFF"
            print(
                f"{row['business_date']}\t{verdict}\tairflow={row['primary_status']} "
                f"{row['primary_ms']}ms\ttemporal={row['shadow_status']} {row['shadow_ms']}ms"
            )
            for diff in row["differences"]:
                print(f"    {json.dumps(diff)}")
        gate = readiness(store, args.dag_id, config.ready_after)
        summary = {"dag_id": args.dag_id, "ready": gate.ready, "needs": config.ready_after}
        print(json.dumps({**summary, **({"why": gate.why_not()} if not gate.ready else {})}))
    return 0


def cmd_cancel(args: argparse.Namespace, config: BridgeConfig) -> int:
    """Cancels a handed-over run."""
    from bridge.temporal.handover import cancel

    async def run() -> None:
        await cancel(await connect(config), args.workflow_id)

    asyncio.run(run())
    if args.json:
        print(json.dumps({"workflow_id": args.workflow_id, "cancel_requested": True}))
    return 0


def cmd_tasks(args: argparse.Namespace, config: BridgeConfig) -> int:
    """Prints the per-task view of handed-over runs (``bridge.temporal.run_view``): one JSON
    line per workflow with ``--json`` (what the plugin's handover page reads), else a table.
    Exit 3 when Temporal is unreachable, 1 when a workflow is not found."""
    from temporalio.service import RPCError, RPCStatusCode

    from bridge.temporal.run_view import read_run_view

    async def run() -> list[dict[str, Any]]:
        client = await connect(config, timeout_s=args.timeout)
        answers: list[dict[str, Any]] = []
        for wid in args.workflow_ids:
            try:
                view = await read_run_view(client, wid, timeout_s=args.timeout)
                answers.append({"ok": True, **dataclasses.asdict(view)})
            except RPCError as exc:
                missing = exc.status is RPCStatusCode.NOT_FOUND
                error = "no such workflow" if missing else f"Temporal refused: {exc.status.name}"
                answers.append({"ok": False, "workflow_id": wid, "error": error})
            except TimeoutError:
                answers.append(
                    {
                        "ok": False,
                        "workflow_id": wid,
                        "error": f"Temporal gave no history within {args.timeout:.0f} s",
                    }
                )
        return answers  # fmt: skip

    answers = asyncio.run(run())
    for answer in answers:
        if args.json:
            print(json.dumps(answer, default=str, sort_keys=True))
        elif not answer["ok"]:
            print(f"{answer['workflow_id']}: {answer['error']}")
        else:
            print(f"{answer['workflow_id']}\t{answer['status']}")
            for task in answer["tasks"]:
                name = task["task_id"] + (f"[{task['map_key']}]" if task["map_key"] else "")
                print(f"    {name}\t{task['state']}\tattempts={task['attempts']}\t"
                      f"{task['duration_ms']}ms\t{task['failure'] or ''}")  # fmt: skip
    return 0 if all(a["ok"] for a in answers) else EXIT_REFUSED


EXAMPLES = """examples:
  bridge inventory --dags-folder /opt/airflow/dags --json
  bridge mode set billing_nightly shadow --actor alice --reason "start dual run"
  bridge mode get billing_nightly --json
  bridge compare billing_nightly --limit 5
  bridge worker --lane billing

"""


def cmd_handover(args: argparse.Namespace, config: BridgeConfig | None) -> int:
    """Reads a handover request (JSON, with its resolved settings) on stdin, answers one JSON
    line on stdout. Never reads Airflow's configuration: see ``bridge.in_airflow.handoff``."""
    from bridge.spec import AirflowRun, DagSpec, RunMode
    from bridge.temporal.handover import Handover

    request = json.loads(sys.stdin.read())
    config = value_to_type(BridgeConfig, request["config"])
    spec = value_to_type(DagSpec, request["spec"])
    handed = request.get("airflow_run")

    async def run() -> dict[str, Any]:
        client = await connect(config)
        with _store(config) as store:
            got = await Handover(
                client,
                config.task_queue(spec.lane),
                store=store,
                max_payload_bytes=config.max_payload_bytes,
            ).start_or_attach(
                spec,
                request["business_date"],
                mode=RunMode(request["mode"]),
                part=request.get("part"),
                map_key=request.get("map_key"),
                source=request.get("source", ""),
                compare_poll_s=config.compare_poll_s,
                partition_key=request.get("partition_key"),
                partition_date=request.get("partition_date"),
                airflow_run=value_to_type(AirflowRun, handed) if handed else None,
            )
        return {"ok": True, **got.__dict__}

    try:
        answer = asyncio.run(run())
    except (TemporalUnavailable, LeaseStoreUnavailable) as exc:
        answer = {"ok": False, "error_type": "TemporalUnavailable", "error": str(exc)}
    except (InvalidLeaseInput, ConfigError) as exc:
        answer = {"ok": False, "error_type": type(exc).__name__, "error": str(exc)}
    print(json.dumps(answer, default=str), flush=True)
    return 0 if answer["ok"] else EXIT_REFUSED


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = CommandParser(prog="bridge", description=__doc__, epilog=EXAMPLES + EXIT_CODES)
    add_global_options(top, top=True)
    sub = top.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        examples = [line for line in EXAMPLES.splitlines() if line.startswith(f"  bridge {name}")]
        epilog = "examples:\n" + "\n".join(examples) + "\n\n" if examples else ""
        made = sub.add_parser(name, help=text, description=text, epilog=epilog + EXIT_CODES)
        add_global_options(made, top=False)
        return made

    inv = command("inventory", "translatability report")
    inv.add_argument("--dags-folder")
    inv.set_defaults(run=cmd_inventory)
    mode = command("mode", "cutover modes")
    mode.add_argument("action", choices=["list", "get", "check", "set"])
    mode.add_argument("dag_id", nargs="?")
    mode.add_argument("mode", nargs="?")
    mode.add_argument("--actor", default=os.environ.get("USER", ""))
    mode.add_argument("--reason", default="")
    mode.add_argument("--force", action="store_true")
    mode.add_argument("--overlap", default="buffer_one")
    mode.add_argument("--no-airflow-pause", action="store_true")
    mode.add_argument("--dags-folder")
    mode.set_defaults(run=cmd_mode)
    cmp = command("compare", "shadow comparisons")
    cmp.add_argument("dag_id")
    cmp.add_argument("--limit", type=int, default=10)
    cmp.set_defaults(run=cmd_compare)
    can = command("cancel", "cancel a handed-over run")
    can.add_argument("workflow_id")
    can.set_defaults(run=cmd_cancel)
    tasks = command("tasks", "per-task states of handed-over runs, from their Temporal history")
    tasks.add_argument("workflow_ids", nargs="+", metavar="WORKFLOW_ID")
    tasks.add_argument("--timeout", type=float, default=15.0)
    tasks.set_defaults(run=cmd_tasks)
    hand = command("handover", "(internal) start or attach, JSON on stdin")
    hand.set_defaults(run=cmd_handover)
    work = command("worker", "run the bridge worker")
    work.add_argument("--lane", action="append")
    work.set_defaults(run=None)
    return top


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point; leaves with ``os._exit`` (temporalio can abort at interpreter exit)."""
    args = parser().parse_args(argv)
    if args.command == "worker":
        from bridge.worker.lanes import main as worker_main

        worker_main([arg for lane in args.lane or [] for arg in ("--lane", lane)])
    if args.command == "mode" and args.action != "list" and not args.dag_id:
        os._exit(fail("bridge", "mode get/set needs a DAG id", EXIT_USAGE))
    if args.command == "mode" and args.action == "set" and not args.mode:
        os._exit(fail("bridge", "mode set needs a mode", EXIT_USAGE))
    try:
        config = None if args.command == "handover" else BridgeConfig.load()
        code = args.run(args, config)
    except (TemporalUnavailable, LeaseStoreUnavailable, psycopg.OperationalError) as exc:
        code = fail("bridge", exc, EXIT_UNREACHABLE)
    except ConfigError as exc:
        code = fail("bridge", exc, EXIT_USAGE)
    except (InvalidLeaseInput, ValueError, psycopg.Error) as exc:
        code = fail("bridge", exc, EXIT_REFUSED)
    except Exception as exc:  # one line, never a traceback (fail closed: nothing half-done)
        code = fail("bridge", f"{type(exc).__name__}: {exc}", EXIT_REFUSED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
