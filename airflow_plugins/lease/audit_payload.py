"""What an audit row may hold of a task's input or output: masked, and bounded in size.

Secrets are masked by ``masking`` (key names, connection strings, credentials in text);
a payload over the limit is replaced by its size, digest and a short preview, so the audit never
holds a secret in clear and never grows without bound.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from airflow_plugins.lease import masking
from airflow_plugins.lease.errors import InvalidLeaseInput

MASK = masking.MASK
DEFAULT_MAX_BYTES = 16 * 1024
_PREVIEW_CHARS = 512


def to_json_value(value: Any, *, what: str) -> Any:
    """Checks that ``value`` survives a JSON round trip and returns the round-tripped value.

    Raises:
        InvalidLeaseInput: the value is not JSON-serialisable (or holds NaN/Infinity).
    """
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidLeaseInput(f"{what} must be JSON-serialisable: {exc}") from exc


def mask(value: Any) -> Any:
    """Returns a copy of ``value`` with secrets masked (see ``airflow_plugins.lease.masking``)."""
    return masking.mask(value)


def for_audit(value: Any, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The form of ``value`` that is written to the audit: masked, then bounded in size.

    Values that are not JSON-serialisable are recorded by their type and repr preview rather
    than refused: the audit must never be the reason protected work fails.
    """
    text = audit_text(value, max_bytes=max_bytes)
    return None if text is None else json.loads(text)


def audit_text(
    value: Any, *, max_bytes: int = DEFAULT_MAX_BYTES, plain_json: bool = False
) -> str | None:
    """``for_audit(value)`` as the JSON text that is sent to the audit (None stays None).

    Args:
        value: what to record.
        max_bytes: a larger value is recorded as its size, digest and preview.
        plain_json: ``value`` is known to be plain JSON already (``to_json_value`` made it),
            so the round trip that makes it so is skipped.
    """
    if value is None:
        return None
    if plain_json:
        clean = mask(value)
    else:
        try:
            clean = mask(json.loads(json.dumps(value, allow_nan=False, default=_unserialisable)))
        except (TypeError, ValueError):
            clean = {"_unserialisable": type(value).__name__}
    text = json.dumps(clean, sort_keys=True)
    size = len(text.encode())
    if size <= max_bytes:
        return text
    return json.dumps(
        {
            "_truncated": True,
            "bytes": size,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "preview": text[:_PREVIEW_CHARS],
        }
    )


def _unserialisable(obj: Any) -> str:
    return f"<{type(obj).__name__}>"
