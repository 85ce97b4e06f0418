"""A payload codec that encrypts what Temporal stores (AES-256-GCM).

Histories would otherwise hold task inputs and results (customer ids, amounts) in clear. The key
comes from the environment (``BRIDGE_CODEC_KEY``: base64 of 32 bytes); old keys stay readable
through ``BRIDGE_CODEC_OLD_KEYS`` (comma-separated) during a rotation. Payloads that were never
encrypted pass through, so a codec can be switched on for a running system.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Sequence

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ENV = "BRIDGE_CODEC_KEY"
OLD_KEYS_ENV = "BRIDGE_CODEC_OLD_KEYS"
_NONCE = 12


class CodecKeyError(ValueError):
    """A codec key that is not base64 of 32 bytes, or a payload whose key is unknown."""


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


class EncryptionCodec(PayloadCodec):
    """Encrypts each payload with the current key; decrypts with whichever key wrote it.

    Args:
        key: the current 32-byte key.
        old_keys: keys of earlier rotations, for decoding only.
    """

    def __init__(self, key: bytes, old_keys: Iterable[bytes] = ()) -> None:
        self._current = _key_id(key)
        self._keys = {_key_id(k): AESGCM(k) for k in (key, *old_keys)}

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
        """Decrypts encrypted payloads; others pass through unchanged.

        Raises:
            CodecKeyError: a payload was encrypted with a key this codec does not have.
        """
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
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
    return EncryptionCodec(parse_key(text), old)
