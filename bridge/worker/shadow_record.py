"""What a shadow task records on its shadow lease: its result and what it captured.

A shadow writes nothing that lasts, so the capture (the ledger items its rolled-back
transactions claimed, their rows, the external calls it would have sent) exists only in the
attempt that ran. Recorded with the lease's result, it survives that attempt: a retry that finds
the shadow lease succeeded (the first answer never reached Temporal) hands the comparison the
same capture instead of an empty one, which would read as "the shadow would have done nothing".
"""

from __future__ import annotations

import json
from typing import Any

from bridge.worker.activity_fence import BridgeFence

#: The field that marks a lease result as a shadow record (a result recorded before this
#: format, or by a primary, has no such field and is returned as it is).
SHADOW_RECORD = "bridge_shadow_record"


def captured(fence: BridgeFence) -> dict[str, Any]:
    """What the shadow run on ``fence`` would have done: its rolled-back ledger items and
    rows, and the requests its external calls would have sent."""
    would_send = fence.would_send
    return {
        "items": sorted(fence.captured_items + [c["item"] for c in would_send]),
        "rows": fence.captured_rows,
        "calls": would_send,
    }


def encode(result: Any, capture: dict[str, Any], *, max_bytes: int) -> Any:
    """The lease result that records ``result`` with what the comparison compares of
    ``capture``: its items and its would-be calls.

    The captured rows are left out: they are shown beside the comparison, never compared, and
    a lease result is kept (and audited) as it is, where sink rows do not belong. A record
    that would still not fit the store's result limit is ``result`` alone (a retry then hands
    the comparison no capture, as before this record existed) rather than failing a shadow
    that did its work.
    """
    kept = {k: capture[k] for k in ("items", "calls") if k in capture}
    record = {SHADOW_RECORD: 1, "result": result, "captured": kept | {"rows_omitted": True}}
    try:
        fits = len(json.dumps(record)) <= max_bytes
    except (TypeError, ValueError):
        return result  # not JSON: the store refuses it as it refuses any such result
    return record if fits else result


def decode(recorded: Any) -> tuple[Any, dict[str, Any]]:
    """The result and the capture (items and calls) of a recorded shadow lease; an empty
    capture for a result recorded without one."""
    if isinstance(recorded, dict) and recorded.get(SHADOW_RECORD) == 1:
        return recorded.get("result"), dict(recorded.get("captured") or {})
    return recorded, {}
