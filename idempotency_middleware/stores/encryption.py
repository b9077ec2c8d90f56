"""Encryption of stored responses and results: AES-256-GCM, once, before any store.

A door with ``encryption=Encryption(...)`` seals each response (status, headers, body, in
their compact encoding) into a :class:`~idempotency_middleware.records.SealedResponse`
before it reaches the store, and opens it again when it is replayed. Stores carry the
envelope as they carry any response, the S3 overflow included; they never see a key.

The envelope is ``version | key id length | key id | nonce (12 bytes) | ciphertext + tag``.
The key id is stored beside the ciphertext so a record sealed under an older key still
opens while that key is listed (rotation). The associated data binds the ciphertext to
its record's key hash and request fingerprint: a sealed response copied under another key
does not open. What cannot be opened (unknown key id, tampered with, swapped) is an
:class:`~idempotency_middleware.records.UnreadableResponse`: never replayed, never re-run.

Records written before encryption was turned on are plain (format 1 or 2) and replay as
they are; records are only ever sealed on the way in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .records import (
    Record,
    SealedResponse,
    StoredResponse,
    UnreadableResponse,
    decode_response,
    deferred_by,
)
from .records import encode_response as _encode_response

KEY_BYTES = 32
NONCE_BYTES = 12
_VERSION = 1
_AAD_PREFIX = b"idempotency-middleware/sealed/1\0"
_MAX_KEY_ID_BYTES = 64


def _aesgcm() -> Any:
    """The ``AESGCM`` class of the ``cryptography`` package, or an error naming the extra."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ModuleNotFoundError(
            "Encryption needs cryptography, which is not installed: "
            'pip install "idempotency-middleware[encryption]"',
            name="cryptography",
        ) from None
    return AESGCM


def _check_key_id(key_id: object) -> bytes:
    if not isinstance(key_id, str) or not key_id:
        raise TypeError(f"an encryption key id must be a non-empty str, got {key_id!r}")
    encoded = key_id.encode("utf-8")
    if len(encoded) > _MAX_KEY_ID_BYTES or not key_id.isprintable():
        raise ValueError(
            f"encryption key id {key_id!r} must be printable and at most "
            f"{_MAX_KEY_ID_BYTES} bytes (it is stored beside every record), such as '2026-11'"
        )
    return encoded


class Encryption:
    """AES-256-GCM for what the doors store: ``keys`` maps key ids to 32-byte keys,
    ``current`` names the one new records are sealed with. Records sealed under any key
    listed in ``keys`` replay; to rotate, add a new key and make it ``current``, and remove
    the old one once its records have expired (one ``ttl_seconds`` later).

    Generate a key with ``os.urandom(32)`` (or ``AESGCM.generate_key(bit_length=256)``) and
    keep it where your other secrets live. Needs the ``cryptography`` package
    (``pip install "idempotency-middleware[encryption]"``).
    """

    __slots__ = ("_ciphers", "_current", "_current_id", "current")

    def __init__(self, *, keys: Mapping[str, bytes], current: str) -> None:
        aesgcm = _aesgcm()
        if not isinstance(keys, Mapping) or not keys:
            raise ValueError(
                "Encryption needs keys: a mapping of key ids to 32-byte keys, such as "
                "{'2026-11': os.urandom(32)}"
            )
        ciphers: dict[bytes, Any] = {}
        for key_id, key in keys.items():
            encoded_id = _check_key_id(key_id)
            if not isinstance(key, (bytes, bytearray)):
                raise TypeError(
                    f"encryption key {key_id!r} must be bytes (32 of them), got "
                    f"{type(key).__name__}; decode a base64 or hex secret first"
                )
            if len(key) != KEY_BYTES:
                raise ValueError(
                    f"encryption key {key_id!r} is {len(key)} bytes; AES-256 needs exactly "
                    f"{KEY_BYTES} (generate one with os.urandom(32))"
                )
            ciphers[encoded_id] = aesgcm(bytes(key))
        if not isinstance(current, str) or current not in keys:
            raise ValueError(
                f"current={current!r} must name one of the keys ({sorted(keys)}): new "
                "records are sealed with it"
            )
        self.current = current
        self._current_id = current.encode("utf-8")
        self._current = ciphers[self._current_id]
        self._ciphers = ciphers

    def __repr__(self) -> str:
        # Never the keys themselves.
        names = sorted(key_id.decode("utf-8") for key_id in self._ciphers)
        return f"Encryption(keys={names}, current={self.current!r})"

    def seal(self, response: StoredResponse, key_hash: str, fingerprint: str) -> SealedResponse:
        """``response`` encrypted under the current key, bound to its record."""
        key_id = self._current_id
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = self._current.encrypt(
            nonce, _encode_response(response), _associated(key_id, key_hash, fingerprint)
        )
        head = bytes([_VERSION, len(key_id)]) + key_id
        return SealedResponse.of(head + nonce + ciphertext)

    def open(self, sealed: StoredResponse, key_hash: str, fingerprint: str) -> StoredResponse:
        """The response in ``sealed``, or an :class:`UnreadableResponse` saying why not."""
        envelope = sealed.body
        if len(envelope) < 2 or envelope[0] != _VERSION:
            return UnreadableResponse.because("the encrypted record's envelope is malformed")
        end = 2 + envelope[1]
        key_id = envelope[2:end]
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            shown = key_id.decode("utf-8", "replace")
            return UnreadableResponse.because(
                f"the record was encrypted under key id {shown!r}, which is not in keys"
            )
        nonce, ciphertext = envelope[end : end + NONCE_BYTES], envelope[end + NONCE_BYTES :]
        try:
            plain = cipher.decrypt(nonce, ciphertext, _associated(key_id, key_hash, fingerprint))
        except Exception:  # InvalidTag, or a nonce cut short (ValueError)
            return UnreadableResponse.because(
                "the encrypted record does not authenticate: tampered with, moved from "
                "another key, or sealed with another key under the same id"
            )
        try:
            return decode_response(plain)
        except ValueError as error:
            return UnreadableResponse.because(str(error))


def _associated(key_id: bytes, key_hash: str, fingerprint: str) -> bytes:
    return b"".join(
        (_AAD_PREFIX, key_id, b"\0", key_hash.encode(), b"\0", fingerprint.encode("utf-8"))
    )


def open_response(
    response: StoredResponse, encryption: Encryption | None, key_hash: str, fingerprint: str
) -> StoredResponse:
    """A held record's response as a door may replay it: plain ones as they are, sealed
    ones opened (unreadable without ``encryption``), unreadable ones as they are."""
    if type(response) is not SealedResponse:
        return response
    if encryption is None:
        return UnreadableResponse.because(
            "the record is encrypted and this door has no encryption= to open it"
        )
    return encryption.open(response, key_hash, fingerprint)


def check_encryption(value: object) -> Encryption | None:
    """``encryption=`` as a door takes it: ``None`` or an :class:`Encryption`."""
    if value is not None and not isinstance(value, Encryption):
        raise TypeError(
            "encryption must be an Encryption(keys={...}, current=...) or None, got "
            f"{type(value).__name__}"
        )
    return value


def seal_final(
    holder: Record | None,
    token: Any,  # stores.protocol.DeferredToken: its key_hash and owner
    response: StoredResponse,
    encryption: Encryption | None,
) -> StoredResponse | None:
    """The final response ``token`` may write over ``holder``, the key's record (``None``
    unless ``deferred_by`` the token's owner). With ``encryption`` it is sealed, bound to
    the holder's fingerprint as the door that opens it expects (the token does not carry
    it; the write is fenced by the owner, so it lands on that very record)."""
    if holder is None or not deferred_by(holder, token.owner):
        return None
    if encryption is None:
        return response
    return encryption.seal(response, token.key_hash, holder.fingerprint)


__all__ = ["KEY_BYTES", "Encryption", "check_encryption", "open_response", "seal_final"]
