"""A protected body's result as the lease records it, and back, with its Python types.

The lease store keeps results as JSON and imports nothing from Airflow. A body may return what
Airflow's XCom serializes happily but JSON cannot hold (``datetime``, ``Decimal``, a tuple):
such a result is encoded here, on the Airflow side, with Airflow's own serialization
(``airflow.sdk.serde``) inside a marked envelope, and decoded where a recorded result is handed
back, so a later run of the business date, and XCom downstream, see the same types. A plain
JSON result is recorded as it is (results recorded before keep their meaning).
"""

from __future__ import annotations

import math
from typing import Any

ENVELOPE = "__exactly_once_serde__"


def _plain_json(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if type(value) is list:
        return all(_plain_json(v) for v in value)
    if type(value) is dict:
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    return False


def encode(result: Any) -> Any:
    """The JSON value the lease records for ``result``.

    Raises:
        TypeError: Airflow's serialization cannot encode it either (XCom could not carry it).
    """
    if _plain_json(result) and not (isinstance(result, dict) and ENVELOPE in result):
        return result
    from airflow.sdk import serde

    try:
        encoded = serde.serialize(result)
    except (TypeError, ValueError, AttributeError) as exc:
        raise TypeError(f"{type(result).__name__} cannot be serialized: {exc}") from exc
    return {ENVELOPE: 1, "value": encoded}


def decode(recorded: Any) -> Any:
    """The result a recorded value stands for (what the body returned)."""
    if isinstance(recorded, dict) and recorded.keys() == {ENVELOPE, "value"}:
        from airflow.sdk import serde

        return serde.deserialize(recorded["value"])
    return recorded
