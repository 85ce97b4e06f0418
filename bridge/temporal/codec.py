"""A payload codec that encrypts what Temporal stores (AES-256-GCM).

Histories would otherwise hold task inputs and results (customer ids, amounts) in clear. The key
comes from the environment (``BRIDGE_CODEC_KEY``: base64 of 32 bytes); old keys stay readable
through ``BRIDGE_CODEC_OLD_KEYS`` (comma-separated) during a rotation.

With a key set, a payload that is not encrypted is refused (``PlaintextPayload``, naming the
workflow it belongs to): a history written in clear, or a payload injected by a client without
the key, fails loudly instead of being read. To switch encryption on for a system with open
workflows in clear, set ``BRIDGE_CODEC_ALLOW_PLAINTEXT=1`` until they have finished (each one
read in clear is logged). Without a key nothing is encrypted, and ``warn_if_unencrypted`` (run
at worker start) logs it loudly.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Self

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)

ENCODING = b"binary/encrypted"
KEY_ENV = "BRIDGE_CODEC_KEY"
OLD_KEYS_ENV = "BRIDGE_CODEC_OLD_KEYS"
ALLOW_PLAINTEXT_ENV = "BRIDGE_CODEC_ALLOW_PLAINTEXT"
_NONCE = 12
log = logging.getLogger(__name__)


class CodecKeyError(ValueError):
    """A codec key that is not base64 of 32 bytes, or a payload whose key is unknown."""


class PlaintextPayload(ValueError):
    """A payload that is not encrypted reached a codec that has a key: refused."""


def parse_key(text: str) -> bytes:
    """Decodes a base64 key and checks it is 32 bytes (AES-256).

    Raises:
        CodecKeyError: it is not.
    """
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CodecKeyError(f"{KEY_ENV} must be base64: {exc}") from exc
    if len(key) != 32:
        raise CodecKeyError(f"{KEY_ENV} must decode to 32 bytes, not {len(key)}")
    return key


def new_key() -> str:
    """A fresh random key, base64, for ``BRIDGE_CODEC_KEY``."""
    return base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).hexdigest()[:16].encode()


def _whose(context: SerializationContext | None) -> str:
    if isinstance(context, WorkflowSerializationContext):
        return f"workflow {context.workflow_id!r}"
    if isinstance(context, ActivitySerializationContext):
        name = context.workflow_id or context.activity_id
        return f"workflow {name!r}" if context.workflow_id else f"activity {name!r}"
    return "a workflow (no context given)"


class EncryptionCodec(PayloadCodec, WithSerializationContext):
    """Encrypts each payload with the current key; decrypts with whichever key wrote it.

    Args:
        key: the current 32-byte key.
        old_keys: keys of earlier rotations, for decoding only.
        allow_plaintext: read payloads that are not encrypted (logged) instead of refusing
            them: only while switching encryption on for workflows started in clear.
    """

    def __init__(
        self, key: bytes, old_keys: Iterable[bytes] = (), *, allow_plaintext: bool = False
    ) -> None:
        self._current = _key_id(key)
        self._keys = {_key_id(k): AESGCM(k) for k in (key, *old_keys)}
        self._allow_plaintext = allow_plaintext
        self._context: SerializationContext | None = None

    def with_context(self, context: SerializationContext) -> Self:
        """This codec, knowing whose payloads it handles (for the error that names them)."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._context = context
        return copy

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Encrypts every payload (the whole serialized payload, metadata included)."""
        aead = self._keys[self._current]
        out = []
        for payload in payloads:
            nonce = os.urandom(_NONCE)
            sealed = aead.encrypt(nonce, payload.SerializeToString(), self._current)
            out.append(
                Payload(
                    metadata={"encoding": ENCODING, "encryption-key-id": self._current},
                    data=nonce + sealed,
                )
            )
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Decrypts the payloads.

        Raises:
            CodecKeyError: a payload was encrypted with a key this codec does not have.
            PlaintextPayload: a payload is not encrypted (unless plaintext is allowed).
        """
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                whose = _whose(self._context)
                if not self._allow_plaintext:
                    raise PlaintextPayload(
                        f"refused a payload of {whose} that is not encrypted: "
                        f"{KEY_ENV} is set, so every payload must be (set {ALLOW_PLAINTEXT_ENV}=1 "
                        "only while workflows started in clear finish)"
                    )
                log.warning("read a payload of %s in clear (%s=1)", whose, ALLOW_PLAINTEXT_ENV)
                out.append(payload)
                continue
            key_id = payload.metadata.get("encryption-key-id", b"")
            aead = self._keys.get(key_id)
            if aead is None:
                raise CodecKeyError(f"payload encrypted with unknown key {key_id.decode()!r}")
            plain = aead.decrypt(payload.data[:_NONCE], payload.data[_NONCE:], key_id)
            decoded = Payload()
            decoded.ParseFromString(plain)
            out.append(decoded)
        return out


def codec_from_env() -> EncryptionCodec | None:
    """The codec configured by the environment, or None when no key is set."""
    text = os.environ.get(KEY_ENV, "").strip()
    if not text:
        return None
    old = [parse_key(k) for k in os.environ.get(OLD_KEYS_ENV, "").split(",") if k.strip()]
    allow = os.environ.get(ALLOW_PLAINTEXT_ENV, "").strip().lower() in ("1", "true", "yes")
    return EncryptionCodec(parse_key(text), old, allow_plaintext=allow)


def warn_if_unencrypted(codec: EncryptionCodec | None) -> bool:
    """Logs a loud warning when payloads go to Temporal in clear; returns whether it warned."""
    if codec is not None:
        return False
    log.warning(
        "PAYLOADS ARE NOT ENCRYPTED: task inputs and results (customer ids, amounts) are stored "
        "in clear in Temporal's histories. Set %s (python -c 'from bridge.temporal.codec "
        "import new_key; print(new_key())') on every worker and client.",
        KEY_ENV,
    )
    return True
