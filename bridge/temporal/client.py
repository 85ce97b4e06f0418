"""The Temporal client the bridge uses: the configured server, with the payload codec."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.service import TLSConfig

from bridge.config import BridgeConfig, ConfigError, TemporalUnavailable
from bridge.temporal.codec import EncryptionCodec, codec_from_env


def data_converter(codec: EncryptionCodec | None) -> DataConverter:
    """The default converter, with ``codec`` (encryption) when given."""
    if codec is None:
        return DataConverter.default
    return dataclasses.replace(DataConverter.default, payload_codec=codec)


def tls_config(config: BridgeConfig) -> TLSConfig | bool:
    """Temporal's TLS options from the settings: False (plain), or TLS / mTLS.

    Raises:
        ConfigError: a client certificate without its key (or a key alone), or a file that
            cannot be read.
    """
    files = (config.temporal_tls_ca_file, config.temporal_tls_cert_file)
    wanted = config.temporal_tls or any(files) or bool(config.temporal_tls_server_name)
    if not wanted and not config.temporal_tls_key_file:
        return False
    if bool(config.temporal_tls_cert_file) != bool(config.temporal_tls_key_file):
        raise ConfigError("mTLS needs both BRIDGE_TEMPORAL_CERT and BRIDGE_TEMPORAL_KEY")

    def read(path: str | None, what: str) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the Temporal TLS {what} {path!r}: {exc}") from exc

    return TLSConfig(
        server_root_ca_cert=read(config.temporal_tls_ca_file, "CA file"),
        client_cert=read(config.temporal_tls_cert_file, "certificate"),
        client_private_key=read(config.temporal_tls_key_file, "key"),
        domain=config.temporal_tls_server_name or None,
    )


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
                tls=tls_config(config),
            ),
            timeout=timeout_s,
        )
    except (RuntimeError, OSError, TimeoutError) as exc:
        raise TemporalUnavailable(
            f"Temporal at {config.temporal_address} is unreachable: {exc}"
        ) from exc
