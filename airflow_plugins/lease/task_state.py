"""The durable state of a lease key's work: values and submitted jobs, fenced by the token.

Airflow 3.3's task state store (and ``ResumableJobMixin`` on top of it) keeps a job's id per
task instance, written by whichever try writes: two tries running at once both read "no job"
and both submit, and a second DAG run of the same business date sees nothing. ``TaskState``
keeps the values in the lease store instead, keyed by the lease key (the business identity)
and its re-run generation, so every try and every run of the date reads the same ones, and only
the key's current holder can write: each write is one statement that locks the lease row and
writes only while it runs under the writer's token (``sql/task_state.sql``). A superseded
holder's write raises ``LeaseLost`` and changes nothing. Every write is audited.

``submit_once`` closes the window between submitting a job and recording its id, the way
``ExternalCalls`` closes it for a payment: the intent is claimed (fenced) before the submit,
the submit carries an idempotency key that is the same for every holder, and the id is recorded
(fenced) after it. A holder that finds an intent an earlier holder left without an id knows a
job may exist: it asks ``find`` (a lookup by the idempotency key) and re-attaches to what it
finds; without ``find`` it raises ``JobInDoubt`` rather than submitting a second job.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from airflow_plugins.lease import audit_payload
from airflow_plugins.lease.errors import InvalidLeaseInput, LeaseError, LeaseLost
from airflow_plugins.lease.queries import QueryBook
from airflow_plugins.lease.sink_fence import idempotency_key
from airflow_plugins.lease.store import Lease, LeaseStore

query = QueryBook("airflow_plugins.lease", "sql/task_state.sql")

MAX_NAME_CHARS = 512
# a retention this long (Airflow's NEVER_EXPIRE is timedelta.max) is kept without expiry
_FOREVER = timedelta(days=365 * 1000)


class JobInDoubt(LeaseError):
    """An earlier holder claimed a job's submission and recorded no job id: it may have
    submitted one. Submitting again could run the job twice, so nothing is submitted; find the
    job by ``idempotency_key`` in the job system (or give the operator a ``find_job``)."""

    def __init__(self, key: str, name: str, idempotency_key: str, claims: int) -> None:
        self.key = key
        self.name = name
        self.idempotency_key = idempotency_key
        super().__init__(
            f"{key}: job {name!r} was claimed by {claims - 1} earlier holder(s) and no job id "
            f"was recorded: one may have been submitted (idempotency key {idempotency_key}). "
            "Not submitting a second job. Look the job up by that key in the job system "
            "(an operator's find_job(idempotency_key, context) does it for every later try)"
        )


@dataclasses.dataclass(frozen=True)
class JobIntent:
    """One claimed submission: what ``submit`` and ``find`` receive.

    Attributes:
        key: the lease key.
        name: the state name the job id is stored under (an operator's ``external_id_key``).
        round: 1 for the key's first job of this name; one more for each new submission after
            a recorded job (one that ended in failure and is submitted afresh).
        idempotency_key: the same for every holder of this round: pass it to the job system
            (a client token, a job name) so a repeated submit is recognised.
        claims: holders that claimed this round; more than 1: an earlier one may have
            submitted.
    """

    key: str
    name: str
    round: int
    idempotency_key: str
    claims: int

    @property
    def in_doubt(self) -> bool:
        """Whether an earlier holder may have submitted this round's job."""
        return self.claims > 1


Submit = Callable[[JobIntent], Any]
Find = Callable[[JobIntent], Any]


def job_idempotency_key(key: str, name: str, round: int, generation: int = 0) -> str:
    """The idempotency key of a job's submission round (the same for every holder)."""
    return idempotency_key(key, f"job\x1f{name}\x1f{round}", generation)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise InvalidLeaseInput(f"a task state name is a string of 1 to {MAX_NAME_CHARS} chars")
    return name


def _retention_seconds(retention: object) -> float | None:
    if retention is None:
        return None
    if not isinstance(retention, timedelta):
        raise InvalidLeaseInput(f"retention is a timedelta or None, not {retention!r}")
    if retention < timedelta(0):
        raise InvalidLeaseInput("retention must not be negative")
    if retention >= _FOREVER:
        return None
    return retention.total_seconds()


class TaskState:
    """The task state of one held lease: read by anyone, written only by its holder.

    Args:
        store: the lease store holding the lease.
        lease: the held lease; values are those of its key and re-run generation.
        check: called before a job is submitted; raises when the holder must stop (the
            fence's ``check``). The writes do not depend on it: the store refuses them.
        max_value_bytes: the largest value, as JSON (default: the store's result limit).
    """

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        *,
        check: Callable[[], None] = lambda: None,
        max_value_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self._check = check
        self.max_value_bytes = max_value_bytes or store.max_result_bytes
        self._intents: dict[str, JobIntent] = {}

    @property
    def key(self) -> str:
        """The lease key the values belong to."""
        return self.lease.key

    def _args(self, **more: Any) -> dict[str, Any]:
        return {
            "key": self.lease.key,
            "token": self.lease.token,
            "generation": self.lease.generation,
            **more,
        }

    def _one(self, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
        with self.store.connection() as conn:
            row = conn.execute(query(name), args).fetchone()
        return None if row is None else dict(row)

    def _lost(self, what: str) -> LeaseLost:
        return LeaseLost(
            self.lease.key, self.lease.token, f"{what} refused: a newer holder has the key"
        )

    # -- values -------------------------------------------------------------------------------

    def get(self, name: str, default: Any = None) -> Any:
        """The value stored under ``name`` for the key (by any holder), or ``default``."""
        row = self._one("state_get", self._args(name=_check_name(name)))
        return default if row is None else row["value"]

    def items(self) -> dict[str, Any]:
        """Every value stored for the key, by name."""
        with self.store.connection() as conn:
            rows = conn.execute(query("state_all"), self._args()).fetchall()
        return {row["name"]: row["value"] for row in rows}

    def set(self, name: str, value: Any, *, retention: timedelta | None = None) -> None:
        """Stores ``value`` under ``name``, if this holder still holds the lease.

        Args:
            name: the value's name.
            value: JSON (not None).
            retention: how long the value is kept; None (and Airflow's ``NEVER_EXPIRE``): as
                long as the key's lease record.

        Raises:
            InvalidLeaseInput: a bad name, None, not JSON, too large or a bad retention;
                nothing written.
            LeaseLost: a newer holder has the key; nothing written.
            LeaseStoreUnavailable: the store did not answer.
        """
        if value is None:
            raise InvalidLeaseInput("Cannot set value as None")
        clean = audit_payload.to_json_value(value, what="a task state value")
        text = json.dumps(clean)
        if len(text.encode()) > self.max_value_bytes:
            raise InvalidLeaseInput(
                f"a task state value must be at most {self.max_value_bytes} bytes of JSON, "
                f"not {len(text.encode())}; store a reference to it instead"
            )
        row = self._one(
            "state_set",
            self._args(
                name=_check_name(name),
                value=text,
                retention_s=_retention_seconds(retention),
                audit=audit_payload.audit_text(clean, plain_json=True),
            ),
        )
        if row is None or not row["written"]:
            raise self._lost(f"writing task state {name!r}")

    def delete(self, name: str) -> None:
        """Deletes ``name`` (nothing happens when it is not there).

        Raises:
            LeaseLost: a newer holder has the key; nothing deleted.
        """
        row = self._one("state_delete", self._args(name=_check_name(name)))
        if row is None or not row["held"]:
            raise self._lost(f"deleting task state {name!r}")

    def clear(self) -> None:
        """Deletes every value of the key's generation (job submissions stay recorded).

        Raises:
            LeaseLost: a newer holder has the key; nothing deleted.
        """
        row = self._one("state_delete", self._args(name=None))
        if row is None or not row["held"]:
            raise self._lost("clearing task state")

    # -- jobs ---------------------------------------------------------------------------------

    def intent(self, name: str) -> JobIntent | None:
        """The submission of ``name`` this holder has claimed and not recorded yet."""
        return self._intents.get(name)

    def job(self, name: str) -> dict[str, Any] | None:
        """The key's submission record of ``name`` (round, state, external_id, claims)."""
        return self._one("job_get", self._args(name=_check_name(name)))

    def submit_once(self, name: str, submit: Submit, *, find: Find | None = None) -> Any:
        """Submits the key's job ``name`` once for every holder, and records its id.

        Claims the submission (fenced), then: when an earlier holder claimed it and recorded
        no id, asks ``find`` for the job submitted with the intent's idempotency key and
        records what it finds; otherwise (or when ``find`` finds nothing) calls ``submit``
        with the intent and records the id it returns under ``name`` (``get(name)`` returns
        it from then on). ``submit`` should pass ``intent.idempotency_key`` to the job system.

        Returns:
            The job's id (None when ``submit`` returned None: nothing is recorded then, and
            the next holder finds the intent in doubt).

        Raises:
            JobInDoubt: an earlier holder may have submitted and there is no ``find``.
            LeaseLost: a newer holder has the key (before the submit: nothing submitted;
                after it: the id is not recorded, the newer holder finds the job).
            FenceStopped: the holder was told to stop before the submit.
        """
        intent = self._intend(_check_name(name))
        self._intents[name] = intent
        try:
            if intent.in_doubt:
                if find is None:
                    raise JobInDoubt(self.key, name, intent.idempotency_key, intent.claims)
                found = find(intent)
                if found is not None:
                    self._record(intent, found, found=True)
                    return found
                # the job system knows no job by this key: this submit is the first
            self._check()
            external_id = submit(intent)
            if external_id is not None:
                self._record(intent, external_id, found=False)
            return external_id
        finally:
            self._intents.pop(name, None)

    def _intend(self, name: str) -> JobIntent:
        row = self._one("job_intend", self._args(name=name))
        if row is None:
            raise self._lost(f"claiming the submission of job {name!r}")
        round_ = int(row["round"])
        return JobIntent(
            key=self.key,
            name=name,
            round=round_,
            idempotency_key=job_idempotency_key(self.key, name, round_, self.lease.generation),
            claims=int(row["claims"]),
        )

    def _record(self, intent: JobIntent, external_id: Any, *, found: bool) -> None:
        clean = audit_payload.to_json_value(external_id, what="a job id")
        row = self._one(
            "job_record",
            self._args(
                name=intent.name,
                round=intent.round,
                external_id=json.dumps(clean),
                audit=audit_payload.audit_text(clean, plain_json=True),
                found=found,
            ),
        )
        if row is None or not row["recorded"]:
            raise self._lost(f"recording job {intent.name!r} ({external_id!r})")
