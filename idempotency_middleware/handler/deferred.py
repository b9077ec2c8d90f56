"""Deferred completion: answer now (202), store the work's final response later.

``defer_completion()`` in a covered request's handler returns a token for its attempt. The
handler's response is stored as the interim one (replayed while the work runs); whoever
finishes the work calls ``store.complete_deferred(token, status, headers, body)`` (or
``release_deferred(token)`` when it did not happen), from any process.

The token's codec, which every store reads, lives with the store protocol
(``stores/protocol.py``); this module is the handler's side.
"""

from __future__ import annotations

from ..stores.protocol import (
    DeferredToken,
    final_response,
    new_token,
    parse_token,
    prepare_final,
)
from .context import current_attempt

__all__ = [
    "DeferredToken",
    "defer_completion",
    "final_response",
    "hand_deferral_to",
    "new_token",
    "parse_token",
    "prepare_final",
]


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


def hand_deferral_to(token: str) -> DeferredToken:
    """Defer the current request (as ``defer_completion()`` does, with its errors) to the
    deferral ``token`` of an earlier attempt on the same key: one whose process died after
    it handed the work on, and whose claim this attempt took over, while that work (a Step
    Functions execution) still runs with ``token``. The handler's response is stored as the
    interim one for ``token``'s owner, so the running work's token finishes the key; a
    token of this attempt's own then no longer applies. The parsed token.

    ``ValueError`` for a malformed token, or one of another key.
    """
    parsed = parse_token(token)
    attempt = current_attempt("hand_deferral_to()")
    if parsed.key_hash != attempt.claim.key_hash:
        raise ValueError("the deferral token belongs to another key than this request's")
    defer_completion()
    attempt.deferred_to = parsed.owner
    return parsed
