"""The Temporal client the bridge uses: the configured server, with the payload codec."""

from __future__ import annotations

import asyncio
import dataclasses

from temporalio.client import Client
from temporalio.converter import DataConverter

from bridge.codec import EncryptionCodec, codec_from_env
from bridge.config import BridgeConfig


class TemporalUnavailable(RuntimeError):
    """The Temporal server could not be reached: nothing was started; retry later."""


def data_converter(codec: EncryptionCodec | None) -> DataConverter:
    """The default converter, with ``codec`` (encryption) when given."""
    if codec is None:
        return DataConverter.default
    return dataclasses.replace(DataConverter.default, payload_codec=codec)


async def connect(
    config: BridgeConfig, *, codec: EncryptionCodec | None = None, timeout_s: float = 10.0
) -> Client:
    """Connects to Temporal (codec from the environment unless given).

    Raises:
        TemporalUnavailable: the server did not answer.
    """
    codec = codec if codec is not None else codec_from_env()
    try:
        return await asyncio.wait_for(
            Client.connect(
                config.temporal_address,
                namespace=config.namespace,
                data_converter=data_converter(codec),
            ),
            timeout=timeout_s,
        )
    except (RuntimeError, OSError, TimeoutError) as exc:
        raise TemporalUnavailable(
            f"Temporal at {config.temporal_address} is unreachable: {exc}"
        ) from exc
