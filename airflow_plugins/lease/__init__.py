"""Run-leases with fencing tokens on Postgres, and fencing at the sink.

Imports nothing from Airflow or Temporal: any Python process can take a lease.

    store = LeaseStore("postgresql://.../leases")
    got = store.acquire("billing_nightly/charge/2024-02-15", Holder.process("billing"))
    if got.granted:
        lease = got.lease
        with LeaseKeeper(store, lease) as keeper, sink.connect() as conn:
            with fenced_transaction(conn, lease.key, lease.token) as tx:
                for customer in tx.claim_many(customers):
                    charge(tx.conn, customer)
        store.complete(lease, {"charged": n})
"""

from __future__ import annotations

from airflow_plugins.lease.audit_payload import for_audit, mask
from airflow_plugins.lease.connection_bounds import connect_sink
from airflow_plugins.lease.errors import (
    FenceBusy,
    InvalidLeaseInput,
    LeaseError,
    LeaseLost,
    LeaseStoreUnavailable,
    StaleToken,
)
from airflow_plugins.lease.external_call import (
    CallAnswer,
    CallResult,
    ExternalCalls,
    MalformedAnswer,
    NeedsReconciliation,
    OutgoingCall,
    ProcessorRefusedToken,
    ProcessorUnavailable,
    RetryPolicy,
)
from airflow_plugins.lease.holder import Holder
from airflow_plugins.lease.keeper import LeaseKeeper
from airflow_plugins.lease.keys import check_key
from airflow_plugins.lease.migrations import LEASE_STORE, SINK_FENCE, migrate
from airflow_plugins.lease.sink_fence import (
    FencedWrite,
    advance_fence,
    done_items,
    fence_token,
    fenced_transaction,
    http_headers,
    idempotency_key,
)
from airflow_plugins.lease.store import (
    Acquisition,
    Lease,
    LeaseStore,
    Outcome,
    check_ttl,
)
from airflow_plugins.lease.task_state import JobInDoubt, JobIntent, TaskState

__all__ = [
    "LEASE_STORE",
    "SINK_FENCE",
    "Acquisition",
    "CallAnswer",
    "CallResult",
    "ExternalCalls",
    "FenceBusy",
    "FencedWrite",
    "Holder",
    "InvalidLeaseInput",
    "JobInDoubt",
    "JobIntent",
    "Lease",
    "LeaseError",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseStore",
    "LeaseStoreUnavailable",
    "MalformedAnswer",
    "NeedsReconciliation",
    "Outcome",
    "OutgoingCall",
    "ProcessorRefusedToken",
    "ProcessorUnavailable",
    "RetryPolicy",
    "StaleToken",
    "TaskState",
    "advance_fence",
    "check_key",
    "check_ttl",
    "connect_sink",
    "done_items",
    "fence_token",
    "fenced_transaction",
    "for_audit",
    "http_headers",
    "idempotency_key",
    "mask",
    "migrate",
]
