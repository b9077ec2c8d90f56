"""Deferred completion: answer now (202), store the work's final response later.

``defer_completion()`` in a covered request's handler returns a token for its attempt. The
handler's response is stored as the interim one (replayed while the work runs); whoever
finishes the work calls ``store.complete_deferred(token, status, headers, body)`` (or
``release_deferred(token)`` when it did not happen), from any process.

A token is ``<key hash>.<owner>.<expires at>``: the stored (hashed) key, the claim's owner
token that fences the finishing write, and the epoch second the key expires (the request's
time plus its TTL), which the final response keeps. It names no client key and no scope
(the key hash is a one-way digest of both), and it is made of letters, digits, ``.`` and
``-`` only, so a Step Functions state can split it with ``States.StringSplit``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

from .attempt_context import current_attempt
from .records import Headers, StoredResponse, is_status, storable_headers

__all__ = [
    "DeferredToken",
    "defer_completion",
    "final_response",
    "new_token",
    "parse_token",
    "prepare_final",
]

_TOKEN = re.compile(r"([0-9a-f]{64})\.([0-9a-f]{1,64}-[0-9a-f]{1,32})\.([0-9]{1,38})")


class DeferredToken(NamedTuple):
    key_hash: str
    owner: str
    expires_at: int


def new_token(key_hash: str, owner: str, expires_at: float) -> str:
    return f"{key_hash}.{owner}.{math.ceil(expires_at)}"


def parse_token(token: object) -> DeferredToken:
    """The parts of a token; ``ValueError`` when it is not one."""
    if not isinstance(token, str):
        raise ValueError(f"a deferred completion token is a str, got {type(token).__name__}")
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise ValueError("malformed deferred completion token")
    key_hash, owner, expires_at = match.groups()
    return DeferredToken(key_hash, owner, int(expires_at))


# The worker may finish the key before the interim response is committed; with writes, that
# commit would then fail and its writes be lost while the final response is replayed.
_DEFERRED_WITH_WRITES = (
    "a deferred request cannot also commit writes with its completion: its worker may "
    "finish the key before they land; make the writes in the worker, or do not defer"
)


def defer_completion() -> str:
    """Hand the current request's work on: its response becomes the interim one (replayed
    while the work runs), and the returned token lets a worker store the final response
    with ``store.complete_deferred`` / ``acomplete_deferred``.

    ``LookupError`` outside a covered request's handler (a request without a key, an
    ``idempotent`` function: a function's result is its final answer).
    """
    attempt = current_attempt("defer_completion()")
    if not attempt.http:
        raise LookupError(
            "defer_completion() is for HTTP handlers; an @idempotent function's result is "
            "its final answer"
        )
    if attempt.has_writes():
        raise ValueError(_DEFERRED_WITH_WRITES)
    attempt.deferred = True
    claim = attempt.claim
    return new_token(claim.key_hash, claim.owner, claim.now + attempt.ttl_seconds)


def final_response(
    status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes
) -> StoredResponse:
    """The work's final response, checked: ``TypeError``/``ValueError`` naming what is wrong."""
    if not is_status(status):
        raise ValueError(f"status must be an HTTP status code (100-599), got {status!r}")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes, got {type(body).__name__}")
    checked: Headers = []
    for pair in headers:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(part, bytes) for part in pair)
        ):
            raise TypeError(f"headers must be (bytes, bytes) pairs as in ASGI, got {pair!r}")
        checked.append((pair[0].lower(), pair[1]))
    return StoredResponse(status, storable_headers(checked), bytes(body))


def prepare_final(
    token: str, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes, now: float
) -> tuple[DeferredToken, StoredResponse] | None:
    """What every store's ``complete_deferred`` checks before writing: the token
    (``ValueError``), the response (``TypeError``/``ValueError``), and the token's expiry
    at ``now`` (``None``: expired, nothing to write)."""
    parsed = parse_token(token)
    response = final_response(status, headers, body)
    if parsed.expires_at <= now:
        return None
    return parsed, response
