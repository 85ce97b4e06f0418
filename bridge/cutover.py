"""Cutover modes per DAG, stored in Postgres, changed by a command, fixed for a run at its start.

    airflow -> shadow -> temporal -> temporal-scheduled

Forward one step at a time (``shadow -> temporal`` only once the comparison says the DAG is
ready, unless forced); back to any earlier mode at any time. Every change is audited in the
lease store (event ``cutover_mode_changed`` under the key ``<dag_id>/cutover``) in the same
transaction. A run reads its mode once: the first reader fixes it for the whole run, so a change
applies to the next run.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from psycopg.types.json import Jsonb

from airflow_plugins.lease import InvalidLeaseInput, LeaseStore
from airflow_plugins.lease.migrations import Component, migrate
from bridge.sql import query

BRIDGE_SCHEMA = Component(schema="bridge", folder="migrations", package="bridge.sql")
DEFAULT_READY_AFTER = 5


class UnknownMode(InvalidLeaseInput):
    """A mode name that is not one of the cutover modes."""


class ModeChangeRefused(InvalidLeaseInput):
    """A change the cutover rules do not allow (skipping a step, not ready, a race)."""


class CutoverMode(enum.StrEnum):
    """Which engine runs a DAG's business runs."""

    AIRFLOW = "airflow"
    SHADOW = "shadow"
    TEMPORAL = "temporal"
    TEMPORAL_SCHEDULED = "temporal-scheduled"

    @classmethod
    def parse(cls, text: object) -> CutoverMode:
        """The mode named ``text``.

        Raises:
            UnknownMode: no such mode; the message lists the valid ones.
        """
        for mode in cls:
            if text == mode.value:
                return mode
        valid = ", ".join(m.value for m in cls)
        raise UnknownMode(f"unknown cutover mode {text!r}: use one of {valid}")

    @property
    def step(self) -> int:
        """The position of the mode on the path (airflow is 0)."""
        return list(CutoverMode).index(self)

    @property
    def temporal_primary(self) -> bool:
        """True when Temporal's run is the one whose effects count."""
        return self in (CutoverMode.TEMPORAL, CutoverMode.TEMPORAL_SCHEDULED)


@dataclasses.dataclass(frozen=True)
class ModeChange:
    """A recorded mode change."""

    dag_id: str
    previous: CutoverMode
    current: CutoverMode
    version: int


def migrate_bridge(conninfo: str) -> list[int]:
    """Creates or upgrades the bridge's tables in the lease store's database."""
    return migrate(conninfo, BRIDGE_SCHEMA)


_migrated: set[str] = set()


def mode_store(store: LeaseStore, dsn: str) -> ModeStore:
    """The mode store on ``store`` (at ``dsn``), its schema migrated once per process: what
    Airflow's side (the router, the bridge operator) reads each run's mode from."""
    if dsn not in _migrated:
        migrate_bridge(dsn)
        _migrated.add(dsn)
    return ModeStore(store)


def business_run_id(business_date: str) -> str:
    """The run id a business run's mode is fixed under (``FixedModeInput.run_id`` of a tick)."""
    return f"scheduled__{business_date}"


def audit_key(dag_id: str) -> str:
    """The audit key under which a DAG's mode changes are recorded."""
    return f"{dag_id}/cutover"


class ModeStore:
    """The cutover modes of DAGs, on the lease store's database (its pool and its errors)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    def _rows(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self.store.connection() as conn:
            return conn.execute(query(name), params).fetchall()

    def get(self, dag_id: str) -> CutoverMode:
        """The DAG's current mode (``airflow`` when never set)."""
        rows = self._rows("mode_get", {"dag_id": dag_id})
        return CutoverMode.parse(rows[0]["mode"]) if rows else CutoverMode.AIRFLOW

    def describe(self) -> list[dict[str, Any]]:
        """Every DAG with a mode row: mode, version, who changed it when and why."""
        return self._rows("mode_list", {})

    def fix_for_business_run(self, dag_id: str, business_date: str) -> CutoverMode:
        """The mode of one business run of ``dag_id``, whoever asks first (a driver's try, a
        retry, a second driver run of the date, a schedule tick): the same run id as the
        Temporal schedule's tick fixes (``bridge.ScheduledDag``)."""
        return self.fix_for_run(dag_id, business_run_id(business_date))

    def fix_route_for_business_run(self, dag_id: str, business_date: str, route: str) -> str:
        """The shadow route of one business run whose mode is fixed (``whole`` or ``task``):
        ``route`` if this caller is the first to fix it, else the one fixed before, so a DAG
        file changed mid-run cannot give the run both a whole-DAG and a per-task shadow."""
        params = {"dag_id": dag_id, "run_id": business_run_id(business_date), "route": route}
        rows = self._rows("route_fix_for_run", params)
        if not rows:
            raise LookupError(f"{dag_id} {business_date}: its mode is not fixed yet")
        return str(rows[0]["route"])

    def fix_for_run(self, dag_id: str, run_id: str) -> CutoverMode:
        """The mode of one run: fixed by the first caller, the same for every later one."""
        rows = self._rows("mode_fix_for_run", {"dag_id": dag_id, "run_id": run_id})
        return CutoverMode.parse(rows[0]["mode"])

    def set(
        self,
        dag_id: str,
        mode: CutoverMode | str,
        *,
        actor: str,
        reason: str,
        force: bool = False,
        ready: bool | None = None,
        why_not_ready: str = "",
    ) -> ModeChange:
        """Changes the DAG's mode, audited in the same transaction.

        Args:
            dag_id: the DAG.
            mode: the new mode.
            actor: who changes it.
            reason: why.
            force: allow skipping steps forward and cutting over before the DAG is ready.
            ready: whether the comparison says the DAG is ready (needed for shadow -> temporal).
            why_not_ready: what the comparison says stands in the way (for the refusal).

        Raises:
            UnknownMode: ``mode`` is not a mode.
            ModeChangeRefused: the change breaks the cutover rules, or raced another change.
        """
        target = CutoverMode.parse(mode)
        if not actor.strip() or not reason.strip():
            raise ModeChangeRefused("a mode change needs an actor and a reason")
        with self.store.connection() as conn, conn.transaction():
            rows = conn.execute(query("mode_get"), {"dag_id": dag_id}).fetchall()
            current = CutoverMode.parse(rows[0]["mode"]) if rows else CutoverMode.AIRFLOW
            version = rows[0]["version"] if rows else 0
            _check_transition(
                dag_id, current, target, force=force, ready=ready, why_not_ready=why_not_ready
            )
            done = conn.execute(
                query("mode_set"),
                {
                    "dag_id": dag_id,
                    "mode": target.value,
                    "actor": actor,
                    "reason": reason,
                    "expected_version": version,
                },
            ).fetchall()
            if not done:
                raise ModeChangeRefused(f"{dag_id}: its mode changed meanwhile; read it again")
            conn.execute(
                query("audit_mode_change"),
                {
                    "key": audit_key(dag_id),
                    "input": Jsonb({"from": current.value}),
                    "output": Jsonb({"to": target.value, "forced": force}),
                    "mode": target.value,
                    "actor": actor,
                    "reason": reason,
                },
            )
        return ModeChange(dag_id, current, target, int(done[0]["version"]))


def _check_transition(
    dag_id: str,
    current: CutoverMode,
    target: CutoverMode,
    *,
    force: bool,
    ready: bool | None,
    why_not_ready: str = "",
) -> None:
    if target == current:
        raise ModeChangeRefused(f"{dag_id} is already in mode {current.value}")
    if target.step < current.step or force:
        return  # rollback to any earlier step is always allowed
    if target.step > current.step + 1:
        raise ModeChangeRefused(
            f"{dag_id}: {current.value} -> {target.value} skips a step; go one step at a time "
            "(or --force)"
        )
    if current is CutoverMode.SHADOW and not ready:
        why = why_not_ready or "its last shadow runs did not all match"
        raise ModeChangeRefused(
            f"{dag_id} is not ready to cut over: {why} (see `bridge compare {dag_id}`), or --force"
        )
