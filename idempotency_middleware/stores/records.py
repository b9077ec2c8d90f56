"""The stored record of one key: its fields, the headers that are stored, and the compact
encoding of a response (plain, compressed or sealed). What every store reads and writes."""

from __future__ import annotations

import base64
import enum
import math
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple, TypeGuard, TypeVar

import orjson

Headers = list[tuple[bytes, bytes]]

# Never stored nor replayed: hop-by-hop headers (RFC 9110 7.6.1) belong to one connection,
# Set-Cookie belongs to one client session. Content-Length is kept in place (header order is
# part of "byte for byte") and its value recomputed on replay.
DROPPED_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"set-cookie",
        b"idempotent-replayed",
    }
)

REPLAYED_HEADER = (b"idempotent-replayed", b"true")


# Bodies above this size are zlib-compressed when that makes them smaller.
COMPRESS_THRESHOLD = 1024
_FORMAT_PLAIN = 1
_FORMAT_ZLIB = 2
# An encrypted response (``encryption.Encryption``): the body of a ``SealedResponse``
# follows the format byte as it is; only the doors, which hold the keys, can open it.
FORMAT_SEALED = 3


class Status(str, enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    # The handler handed the work on (``defer_completion``): its response is the interim
    # one, replayed until the work's final response completes the key.
    DEFERRED = "deferred"


# The members as module constants, for the hot paths: reading one off the class goes through
# the enum metaclass's attribute hook, several times the cost of a plain class attribute,
# on every claim, completion and replay.
IN_PROGRESS = Status.IN_PROGRESS
COMPLETED = Status.COMPLETED
DEFERRED = Status.DEFERRED


class StoredResponse(NamedTuple):
    """Status, end-to-end headers and body of a completed response."""

    status: int
    headers: Headers
    body: bytes

    def replay_headers(self) -> Headers:
        """Headers for a replay: the stored ones in order, a correct Content-Length, and the
        ``Idempotent-Replayed: true`` marker."""
        headers = with_content_length(self.headers, len(self.body))
        headers.append(REPLAYED_HEADER)
        return headers


class SealedResponse(StoredResponse):
    """An encrypted response as the stores carry it: ``body`` is the sealed envelope (key
    id, nonce, ciphertext; ``encryption.Encryption.seal``), status and headers are inside
    it. A store keeps and returns it as it keeps any response; a door opens it."""

    __slots__ = ()

    @classmethod
    def of(cls, envelope: bytes) -> SealedResponse:
        return cls(0, [], envelope)


class UnreadableResponse(StoredResponse):
    """A stored response that cannot be read back: its bytes cannot be decoded (corrupt in
    the store), or it cannot be opened (its key id unknown, or tampered with). It is never
    replayed and its key never re-run; ``reason`` says why (for logs, never for clients)."""

    reason: str

    @classmethod
    def because(cls, reason: str) -> UnreadableResponse:
        unreadable = cls(0, [], b"")
        unreadable.reason = reason
        return unreadable


def with_content_length(headers: Headers, length: int) -> Headers:
    """``headers`` in order with one Content-Length, ``length``: in place of the first one
    (later ones dropped), or at the end when there was none."""
    value = str(length).encode("ascii")
    fixed: Headers = []
    has_length = False
    for name, old in headers:
        if name.lower() == b"content-length":
            if has_length:
                continue
            has_length = True
            old = value
        fixed.append((name, old))
    if not has_length:
        fixed.append((b"content-length", value))
    return fixed


def storable_headers(headers: Headers) -> Headers:
    """Drop what must not be persisted: :data:`DROPPED_HEADERS`, and the headers a
    ``Connection`` header names (RFC 9110 7.6.1: ``Connection: x-hop`` makes ``X-Hop``
    hop-by-hop), case-insensitively, from every ``Connection`` header's comma-separated
    list. A new list of ``(name, value)`` tuples."""
    dropped = DROPPED_HEADERS
    if type(headers) is not list:
        headers = list(headers)  # (any iterable of pairs: read twice below)
    # The usual response: a list of tuples with nothing to drop, copied in C (a list
    # comprehension would rebuild every tuple).
    for header in headers:
        if type(header) is not tuple or header[0].lower() in DROPPED_HEADERS:
            break
    else:
        return headers.copy()
    for name, value in headers:
        if name.lower() == b"connection":
            dropped = dropped.union(option.strip().lower() for option in value.split(b","))
    return [(name, value) for name, value in headers if name.lower() not in dropped]


class Record(NamedTuple):
    """One key's state in a store.

    ``lock_expires_at`` and ``expires_at`` are epoch seconds with sub-second precision.
    ``response`` is set once completed (the interim response while deferred);
    ``response_not_stored`` marks a completed key whose body was not kept, because it was
    too large or streamed (its handler still never runs again within the TTL).
    """

    key_hash: str
    status: Status
    fingerprint: str
    owner: str
    lock_expires_at: float
    expires_at: float
    response: StoredResponse | None = None
    response_not_stored: bool = False
    response_size: int = 0

    def is_expired(self, now: float) -> bool:
        return self.expires_at <= now

    def is_lock_stale(self, now: float, clock_skew_seconds: float = 0.0) -> bool:
        """An in-progress claim whose lock expired at least ``clock_skew_seconds`` ago."""
        return self.status is IN_PROGRESS and self.lock_expires_at <= now - clock_skew_seconds

    def is_claimable(self, now: float, clock_skew_seconds: float = 0.0) -> bool:
        """Whether a new claim at ``now`` may replace this record (the store's claim
        condition): an in-progress claim once its lock is stale by the skew margin, any
        other record once expired."""
        if self.status is IN_PROGRESS:
            return self.is_lock_stale(now, clock_skew_seconds)
        return self.is_expired(now)


def deferred_by(record: Record | None, owner: str) -> bool:
    """Whether a deferral token of ``owner`` may still finish ``record``: its owner's, not
    completed yet (deferred, or in progress when the work finished before the interim
    response was stored)."""
    return record is not None and record.owner == owner and record.status is not COMPLETED


def handed_over(record: Record | None, owner: str | None) -> bool:
    """Whether an interim completion handing its key to ``owner`` (``Completion.deferred_to``)
    finds it done already, its condition failed: the key is ``owner``'s and no longer in
    progress (the same completion landed before its answer was lost, and the work may have
    finished it since)."""
    return (
        owner is not None
        and record is not None
        and record.owner == owner
        and record.status is not IN_PROGRESS
    )


def encode_response(response: StoredResponse) -> bytes:
    """A compact binary form: a format byte, a length-prefixed JSON head, then the body (a
    sealed response: its format byte, then its envelope)."""
    if type(response) is SealedResponse:
        return bytes([FORMAT_SEALED]) + response.body
    head = orjson.dumps(
        [response.status, [[n.decode("latin-1"), v.decode("latin-1")] for n, v in response.headers]]
    )
    payload = len(head).to_bytes(4, "big") + head + response.body
    if len(payload) >= COMPRESS_THRESHOLD:
        packed = zlib.compress(payload, 6)
        if len(packed) < len(payload):
            return bytes([_FORMAT_ZLIB]) + packed
    return bytes([_FORMAT_PLAIN]) + payload


def decode_response(blob: bytes) -> StoredResponse:
    """Inverse of :func:`encode_response`; ``ValueError`` when ``blob`` is not one."""
    if not blob:
        raise ValueError("the stored response is empty")
    fmt, payload = blob[0], blob[1:]
    if fmt == FORMAT_SEALED:
        return SealedResponse.of(bytes(payload))
    if fmt == _FORMAT_ZLIB:
        try:
            payload = zlib.decompress(payload)
        except zlib.error as error:
            raise ValueError(f"the stored response does not decompress: {error}") from None
    elif fmt != _FORMAT_PLAIN:
        raise ValueError(f"unknown stored response format {fmt}")
    head_length = int.from_bytes(payload[:4], "big")
    if len(payload) < 4 or head_length > len(payload) - 4:
        raise ValueError("the stored response's head is cut short")
    try:
        status, headers = orjson.loads(payload[4 : 4 + head_length])
        decoded = StoredResponse(
            status=status,
            headers=[(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
            body=bytes(payload[4 + head_length :]),
        )
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"the stored response's head is not readable: {error!r}") from None
    if not is_status(decoded.status):
        raise ValueError(f"the stored response's status is not one: {decoded.status!r}")
    return decoded


def read_response(blob: bytes) -> StoredResponse:
    """:func:`decode_response` for a store reading a record: bytes that cannot be decoded
    (corrupt in the store) give an :class:`UnreadableResponse`, which the doors answer as
    such, instead of an exception out of the claim."""
    try:
        return decode_response(blob)
    except ValueError as error:
        return UnreadableResponse.because(str(error))


# The fingerprint of a record whose fields cannot be decoded (no request has it): the
# record is answered as unreadable whatever the request, never as a mismatched key.
UNKNOWN_FINGERPRINT = ""
T = TypeVar("T")


_STATUSES = {status.value: status for status in Status}


def record_from_fields(
    key_hash: str,
    status: object,
    fingerprint: object,
    owner: object,
    lock_expires_at: object,
    expires_at: object,
    response: object,
    too_large: object = False,
    size: object = 0,
) -> Record:
    """The record a store read back, its fields as the backend returns them (text or bytes,
    numbers or their text, ``None`` for a missing one; ``response`` encoded, or decoded
    already). Every store decodes its records here: a record that cannot be decoded (an
    unknown status, text that is not UTF-8, a deadline that is no number, a missing field, a
    corrupt response) comes back completed with an :class:`UnreadableResponse`, answered
    as such instead of an exception out of the claim, and never expiring (never re-run)."""
    if (
        type(status) is str
        and type(fingerprint) is str
        and type(owner) is str
        and (response is None or type(response) is bytes or isinstance(response, StoredResponse))
    ):
        # The common case, fields of the types they should be, without a check per field
        # (anything unreadable raises here, and the checked path says what).
        try:
            return Record(
                key_hash,
                _STATUSES[status],
                fingerprint,
                owner,
                float(lock_expires_at),  # type: ignore[arg-type]
                float(expires_at),  # type: ignore[arg-type]
                read_response(response) if type(response) is bytes else response,  # type: ignore[arg-type]
                bool(too_large),
                int(size),  # type: ignore[call-overload]
            )
        except (KeyError, TypeError, ValueError):
            pass  # the checked path below says which field is unreadable
    try:
        if response is not None and not isinstance(response, StoredResponse):
            response = read_response(_field("response", response, bytes))
        return Record(
            key_hash,
            Status(_field("status", status, _text)),
            _field("fingerprint", fingerprint, _text),
            _field("owner", owner, _text),
            _field("lock_expires_at", lock_expires_at, float),
            _field("expires_at", expires_at, float),
            response,
            bool(too_large),
            _field("response_size", size, int),
        )
    except ValueError as error:
        unreadable = UnreadableResponse.because(f"the stored record is corrupt: {error}")
        return Record(
            key_hash, Status.COMPLETED, UNKNOWN_FINGERPRINT, "", 0.0, math.inf, unreadable
        )


def _field(name: str, value: Any, decode: Callable[[Any], T]) -> T:
    if value is None:
        raise ValueError(f"its {name} is missing")
    try:
        return decode(value)
    except (TypeError, ValueError):
        raise ValueError(f"its {name} is not readable: {value!r:.80}") from None


def _text(value: object) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    if type(value) is not str:
        raise TypeError(value)
    return value


def is_status(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an HTTP status code a stored response may have (100-599)."""
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599


def decode_response_document(text: str | bytes) -> StoredResponse:
    """A response written as JSON by something other than this package (a Step Functions
    state finishing a deferred key): ``{"status": 200, "headers": {...} or [[name, value],
    ...], "body": "text"}``, with ``"json": value`` (its compact JSON) or ``"body_base64"``
    instead of ``"body"``. ``ValueError`` when it is not of that shape."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"the stored response is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValueError("the stored response must be a JSON object")
    status = document.get("status")
    if not is_status(status):
        raise ValueError(f"the stored response's status must be an integer 100-599: {status!r}")
    raw_headers = document.get("headers", [])
    pairs = list(raw_headers.items()) if isinstance(raw_headers, dict) else raw_headers
    if not isinstance(pairs, list):
        raise ValueError("the stored response's headers must be an object or a list of pairs")
    headers: Headers = []
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2) or not all(
            isinstance(part, str) for part in pair
        ):
            raise ValueError(f"a stored response header must be a [name, value] pair: {pair!r}")
        try:
            headers.append((pair[0].lower().encode("latin-1"), pair[1].encode("latin-1")))
        except UnicodeEncodeError:
            raise ValueError(f"a stored response header is not Latin-1: {pair!r}") from None
    bodies = [name for name in ("body", "json", "body_base64") if name in document]
    if len(bodies) > 1:
        raise ValueError(f"the stored response has more than one body: {bodies}")
    body = b""
    if bodies == ["body"]:
        if not isinstance(document["body"], str):
            raise ValueError("the stored response's body must be a string")
        body = document["body"].encode("utf-8")
    elif bodies == ["json"]:
        body = orjson.dumps(document["json"])
        if not any(name == b"content-type" for name, _ in headers):
            headers.append((b"content-type", b"application/json"))
    elif bodies == ["body_base64"]:
        try:
            body = base64.b64decode(document["body_base64"], validate=True)
        except (ValueError, TypeError):
            raise ValueError("the stored response's body_base64 is not base64") from None
    return StoredResponse(status, storable_headers(headers), body)
