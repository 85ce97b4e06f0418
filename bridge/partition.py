"""The asset partition of a run: its key in every name the run is known by, and its date.

Airflow 3.3 runs a partitioned DAG (``CronPartitionTimetable``, ``PartitionedAssetTimetable``,
``PartitionedAtRuntime``) once per partition key: regions ``us``, ``eu`` and ``apac`` of one day
are three runs. A bridge run carries the key, so its workflow id, lease keys and comparison row
name the partition after the business date (``2024-02-15@us``); a run without one is named as
before, character for character.

Imports nothing from Temporal; Airflow only inside ``resolve``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_plugins.lease import InvalidLeaseInput
from airflow_plugins.lease.keys import PARTITION_SEPARATOR, partitioned_date

if TYPE_CHECKING:
    from bridge.spec import DagSpec

#: Between a business date and its partition key in a key's date part (no business date has it).
SEPARATOR = PARTITION_SEPARATOR
#: Airflow's ``ID_LEN``: the longest partition key its trigger accepts.
MAX_KEY_CHARS = 250


#: The Airflow 3.3 timetables whose runs take a partition key (the spec's ``timetable``).
PARTITIONED_TIMETABLES = frozenset(
    {"CronPartitionTimetable", "PartitionedAssetTimetable", "PartitionedAtRuntime"}
)


class InvalidPartition(InvalidLeaseInput):
    """A partition key the DAG's timetable rejects (or a key for an unpartitioned DAG)."""


def check_partition(spec: DagSpec, partition_key: str | None) -> None:
    """Refuses, before anything starts, a partition key a run of ``spec`` cannot have: any key
    of a DAG whose timetable is not partitioned, an empty or over-long one. (The key's form is
    the timetable's to judge: ``resolve``, on the Airflow side, which has the DAG.)

    Raises:
        InvalidPartition: such a key.
    """
    if partition_key is None:
        return
    if spec.timetable not in PARTITIONED_TIMETABLES:
        raise InvalidPartition(
            f"{spec.dag_id} is not a partitioned DAG (timetable {spec.timetable}) and takes "
            f"no partition key (given {partition_key!r})"
        )
    _check_text(spec.dag_id, partition_key)


def _check_text(dag_id: str, partition_key: object) -> None:
    if not isinstance(partition_key, str) or not partition_key.strip():
        raise InvalidPartition(f"{dag_id}: a partition key must be non-empty text")
    if len(partition_key) > MAX_KEY_CHARS:
        raise InvalidPartition(f"{dag_id}: a partition key is at most {MAX_KEY_CHARS} characters")


def keyed_date(business_date: str, partition_key: str | None) -> str:
    """The date part of a run's keys: the business date, then ``@`` and the partition key.

    The key is escaped as a mapped item's name is (``escape_map_key``: a ``/`` or a trailing
    ``#shadow`` cannot break the key), so two partitions never share a key; no partition: the
    business date itself (every existing key unchanged).

    >>> keyed_date("2024-02-15", "us"), keyed_date("2024-02-15", None)
    ('2024-02-15@us', '2024-02-15')
    """
    return partitioned_date(business_date, partition_key)  # the Airflow side keys alike


def resolve(dag: Any, partition_key: str | None) -> datetime | None:
    """The partition date of ``partition_key`` as Airflow resolves it for ``dag``'s run
    (``dag.timetable.resolve_partition_date``), after Airflow's own checks of the key.

    Returns:
        The period start the key stands for; None without a key, or for a key with no date
        (a region, a runtime partition).

    Raises:
        InvalidPartition: the DAG is not partitioned, or its timetable rejects the key (the
            message is Airflow's), before anything runs.
    """
    if partition_key is None:
        return None
    from airflow.serialization.encoders import coerce_to_core_timetable

    timetable = coerce_to_core_timetable(dag.timetable)
    if not (timetable.partitioned or timetable.partitioned_at_runtime):
        raise InvalidPartition(
            f"{dag.dag_id} is not a partitioned DAG and takes no partition key "
            f"(given {partition_key!r})"
        )
    _check_text(dag.dag_id, partition_key)
    try:
        resolved: datetime | None = timetable.resolve_partition_date(partition_key)
    except Exception as exc:  # InvalidPartitionKeyError, a mapper's ValueError
        raise InvalidPartition(
            f"{dag.dag_id}: partition key {partition_key!r} is refused by its timetable: {exc}"
        ) from exc
    return resolved
