"""The codec with a key refuses plaintext, the worker warns without one, and TLS is configurable.

No Temporal server needed: the data converter the bridge's client uses decodes payloads as a
worker does when it reads a history (with the workflow's serialization context), and the TLS
settings are turned into the SDK's ``TLSConfig`` the client connects with.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from temporalio.converter import DataConverter, WorkflowSerializationContext

from bridge.config import BridgeConfig, ConfigError
from bridge.temporal.client import data_converter, tls_config
from bridge.temporal.codec import (
    EncryptionCodec,
    PlaintextPayload,
    new_key,
    parse_key,
    warn_if_unencrypted,
)

WORKFLOW = "billing_nightly/2024-02-15"
CONTEXT = WorkflowSerializationContext(namespace="default", workflow_id=WORKFLOW)


def test_a_codec_with_a_key_refuses_a_plaintext_payload_naming_the_workflow() -> None:
    injected = asyncio.run(DataConverter.default.encode(["charge customer 7 twice"]))  # no key
    reader = data_converter(EncryptionCodec(parse_key(new_key()))).with_context(CONTEXT)
    with pytest.raises(PlaintextPayload, match=WORKFLOW):
        asyncio.run(reader.decode(injected, [str]))


def test_encrypted_payloads_round_trip_and_plaintext_is_read_only_when_allowed() -> None:
    key = parse_key(new_key())
    writer = data_converter(EncryptionCodec(key)).with_context(CONTEXT)
    sealed = asyncio.run(writer.encode(["c1"]))
    assert b"c1" not in b"".join(p.data for p in sealed)
    assert asyncio.run(data_converter(EncryptionCodec(key)).decode(sealed, [str])) == ["c1"]
    clear = asyncio.run(DataConverter.default.encode(["c2"]))
    during_switch = data_converter(EncryptionCodec(key, allow_plaintext=True))
    assert asyncio.run(during_switch.decode(clear, [str])) == ["c2"]


def test_the_worker_warns_loudly_when_payloads_are_not_encrypted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="bridge.temporal.codec"):
        assert warn_if_unencrypted(None)
        assert not warn_if_unencrypted(EncryptionCodec(parse_key(new_key())))
    assert [r.getMessage()[:28] for r in caplog.records] == ["PAYLOADS ARE NOT ENCRYPTED: "]


def test_tls_settings_become_the_clients_tls_options(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert, key):
        path.write_bytes(f"-----{path.name}-----".encode())
    assert tls_config(BridgeConfig()) is False
    plain_tls = tls_config(BridgeConfig(temporal_tls=True))
    assert not isinstance(plain_tls, bool)
    assert plain_tls.server_root_ca_cert is None
    assert plain_tls.client_cert is None
    mtls = tls_config(
        BridgeConfig(
            temporal_tls_ca_file=str(ca),
            temporal_tls_cert_file=str(cert),
            temporal_tls_key_file=str(key),
            temporal_tls_server_name="temporal.internal",
        )
    )
    assert not isinstance(mtls, bool)
    assert (mtls.server_root_ca_cert, mtls.client_cert, mtls.client_private_key) == (
        b"-----ca.pem-----",
        b"-----client.pem-----",
        b"-----client.key-----",
    )
    assert mtls.domain == "temporal.internal"
    for broken in (
        BridgeConfig(temporal_tls_cert_file=str(cert)),
        BridgeConfig(temporal_tls_key_file=str(key)),
        BridgeConfig(temporal_tls_ca_file=str(tmp_path / "missing.pem")),
    ):
        with pytest.raises(ConfigError):
            tls_config(broken)


def test_the_settings_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BRIDGE_TEMPORAL_TLS", "true")
    monkeypatch.setenv("BRIDGE_TEMPORAL_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("BRIDGE_TEMPORAL_SNI", "temporal.internal")
    loaded = BridgeConfig.load()
    assert loaded.temporal_tls
    assert loaded.temporal_tls_ca_file == str(tmp_path / "ca.pem")
    assert loaded.temporal_tls_server_name == "temporal.internal"
