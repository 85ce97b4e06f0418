"""What a request to the lease agent may ask: the bounds the store's Python API applies.

``LeaseStore`` checks what it sends (a TTL of at most 7 days, its own retention horizon, a
masked and bounded input, a result of at most 1 MiB of JSON). A process that writes to the
agent's socket directly skips ``LeaseStore``; without these checks the agent would relay a
23-day TTL, a horizon of 100000 days or an unmasked 2 MB input as sent. So the agent checks
every parameter of every request again here and refuses (runs nothing) what the API would not
send.

Who asks is known too: the kernel tells the agent the pid of the process on the other end of
the socket (``SO_PEERCRED``). A request that names a holder must come from that holder's
process, so a process cannot take, or finish, a lease in another's name; and a finish names
its holder, which the statement matches against the lease's, so key and token alone (read
from a log, say) do not let anyone finish a lease.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from datetime import date
from typing import Any

from airflow_plugins.lease import audit_payload, masking
from airflow_plugins.lease.errors import InvalidLeaseInput
from airflow_plugins.lease.keys import check_key
from airflow_plugins.lease.store import check_ttl
from airflow_plugins.lease.wire import Peer

# what each relayed statement takes: exactly these parameters
PARAMETERS: dict[str, frozenset[str]] = {
    "acquire": frozenset({"key", "holder", "ttl_ms", "business_date", "horizon_days", "input"}),
    "acquire_batch": frozenset({"keys", "holder", "ttl_ms", "business_date", "horizon_days"}),
    "renew": frozenset({"key", "token", "ttl_ms"}),
    "finish": frozenset({"key", "token", "state", "result", "output", "error", "holder"}),
}
PARAMETERS["acquire_decided"] = PARAMETERS["acquire"]
FINISHED_STATES = frozenset({"succeeded", "failed", "released"})
MAX_ERROR_CHARS = 2000


class RequestRefused(ValueError):
    """A request the agent does not run: the reason is sent back as ``refused``."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """The agent's bounds (a store's: ``LeaseStore`` has the same arguments)."""

    horizon_days: int
    max_audit_bytes: int = audit_payload.DEFAULT_MAX_BYTES
    max_result_bytes: int = 1024 * 1024


def checked(
    name: str, params: Mapping[str, Any], limits: Limits, peer: Peer | None
) -> dict[str, Any]:
    """The parameters of statement ``name`` as the store's API would send them.

    Inputs and outputs are masked and bounded again (a no-op for what ``LeaseStore`` sent).

    Raises:
        RequestRefused: a parameter the API would not send, or a holder that is not the peer.
    """
    expected = PARAMETERS.get(name)
    if expected is None:
        raise RequestRefused(f"not a statement this agent runs: {name!r}")
    if set(params) != expected:
        raise RequestRefused(f"{name} takes exactly {sorted(expected)}, not {sorted(params)}")
    try:
        return _checked(name, dict(params), limits, peer)
    except InvalidLeaseInput as exc:
        raise RequestRefused(str(exc)) from exc


def _checked(
    name: str, params: dict[str, Any], limits: Limits, peer: Peer | None
) -> dict[str, Any]:
    if "key" in params:
        check_key(params["key"])
    if "keys" in params:
        keys = params["keys"]
        if not isinstance(keys, list) or not keys:
            raise RequestRefused("keys must be a non-empty list of lease keys")
        for key in keys:
            check_key(key)
    if "holder" in params:
        _check_holder(params["holder"], peer)
    _check_numbers(params, limits)
    if params.get("business_date") is not None and not isinstance(params["business_date"], date):
        raise RequestRefused("business_date must be a date")
    if "input" in params:
        params["input"] = _audit(params["input"], limits, plain_json=False)
    if name == "finish":
        _check_finish(params, limits)
    return params


def _integer(params: Mapping[str, Any], name: str, least: int) -> int | None:
    if name not in params:
        return None
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise RequestRefused(f"{name} must be an integer of at least {least}, not {value!r}")
    return value


def _check_numbers(params: Mapping[str, Any], limits: Limits) -> None:
    ttl_ms = _integer(params, "ttl_ms", 0)
    if ttl_ms is not None:
        check_ttl(ttl_ms / 1000)
    days = _integer(params, "horizon_days", 1)
    if days is not None and days > limits.horizon_days:
        raise RequestRefused(
            f"a horizon of {days} days is wider than this agent's retention horizon "
            f"({limits.horizon_days} days)"
        )
    _integer(params, "token", 1)


def _check_holder(text: object, peer: Peer | None) -> None:
    if not isinstance(text, str):
        raise RequestRefused("holder must be the holder's JSON text")
    try:
        holder = json.loads(text)
    except ValueError as exc:
        raise RequestRefused(f"holder is not JSON: {exc}") from exc
    if not isinstance(holder, dict) or holder.get("engine") not in (
        "airflow",
        "temporal",
        "process",
    ):
        raise RequestRefused("holder must be a holder object with its engine")
    if peer is None or peer.pid <= 0:
        raise RequestRefused("the agent cannot tell which process asks (no peer pid)")
    if holder.get("pid") != peer.pid:
        raise RequestRefused(
            f"the holder named (pid {holder.get('pid')!r}) is not the process asking "
            f"(pid {peer.pid})"
        )


def _check_finish(params: dict[str, Any], limits: Limits) -> None:
    state, result, error = params["state"], params["result"], params["error"]
    if state not in FINISHED_STATES:
        raise RequestRefused(f"a lease finishes {sorted(FINISHED_STATES)}, not {state!r}")
    if result is not None:
        if state != "succeeded":
            raise RequestRefused("only a succeeded lease records a result")
        if not isinstance(result, str) or len(result) > limits.max_result_bytes:
            raise RequestRefused(
                f"a lease result must be at most {limits.max_result_bytes} bytes of JSON"
            )
        audit_payload.to_json_value(_json(result, "result"), what="a lease result")
    if error is not None:
        if not isinstance(error, str):
            raise RequestRefused("error must be text")
        params["error"] = masking.mask_text(error)[:MAX_ERROR_CHARS]
    params["output"] = _audit(params["output"], limits, plain_json=True)


def _audit(text: object, limits: Limits, *, plain_json: bool) -> str | None:
    # the JSON text LeaseStore sent, masked and bounded again as LeaseStore would have
    if text is None:
        return None
    if not isinstance(text, str):
        raise RequestRefused("an audit payload must be JSON text")
    value = _json(text, "an audit payload")
    if len(text) > limits.max_audit_bytes:
        # what the API records of it (its size and digest), without masking megabytes first;
        # no preview: a cut through a secret would not be masked
        data = text.encode()
        digest = {
            "_truncated": True,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        return json.dumps(digest)
    return audit_payload.audit_text(value, max_bytes=limits.max_audit_bytes, plain_json=plain_json)


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RequestRefused(f"{what} is not JSON: {exc}") from exc
