"""Why an attempt does not run, and the one table that words it for every door.

The engine decides (``core.answer_held``, ``engine.flow``); a door only words the decision:
an HTTP door answers ``problem_for(refusal)``, the function door raises
``error_for(refusal, name)``. Both wordings live here, side by side, so a new reason is
added in one place.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from ..errors import (
    KeyInProgressError,
    KeyReusedError,
    ResultNotStoredError,
    StoredResultUnreadableError,
    StoreUnavailableError,
)
from ..events import EventKind
from . import problems
from .problems import Problem

# A handler holding a key usually finishes within a second; a dead owner's claim is taken
# over at its lock timeout whatever a client waits, so a short hint serves both cases.
IN_PROGRESS_RETRY_AFTER = 1
STORE_UNAVAILABLE_RETRY_AFTER = 1

RefusalReason = Literal[
    "in_progress",
    "reused",
    "not_stored",
    "unreadable",
    "unavailable",
    "commit_unavailable",
    "transaction_conflict",
    "transaction_rejected",
]

# The HTTP status each refusal is answered with, and the event it is reported as.
_REFUSAL_STATUS: dict[str, int] = {
    "in_progress": 409,
    "reused": 422,
    "not_stored": 410,
    "unreadable": 500,
    "unavailable": 503,
    "commit_unavailable": 503,
    "transaction_conflict": 409,
    "transaction_rejected": 500,
}
_REFUSAL_EVENT: dict[str, EventKind] = {
    "in_progress": "conflict",
    "reused": "mismatch",
    "not_stored": "not_stored",
    "unreadable": "unreadable",
    "transaction_conflict": "transaction_conflict",
    "transaction_rejected": "transaction_rejected",
}


class Refusal(NamedTuple):
    """Why an attempt does not run; each door words it (a problem response, an exception).

    ``in_progress``: another attempt holds the key; ``reused``: the key was used with other
    input; ``not_stored``: completed, but its response (``size`` bytes) was not kept;
    ``unreadable``: completed, but its stored response cannot be read back (``error``
    says why);
    ``unavailable``: the store failed on the claim (an outage, or a misconfiguration:
    ``error.misconfigured``, answered as not retryable); ``commit_unavailable``: it failed on a
    transaction's commit, which then landed whole or not at all;
    ``transaction_conflict``: a condition of the handler's transaction failed, nothing was
    written; ``transaction_rejected``: DynamoDB cannot commit it as written (too large).
    """

    reason: RefusalReason
    retry_after: int | None = None
    size: int = 0
    # The error behind it: the store's (unavailable), the transaction's (transaction_*).
    error: BaseException | None = None
    # in_progress: when the holder's lock expires (epoch seconds), where the store told it.
    # HTTP keeps its short hint; a consumer, whose every redelivery counts against the
    # broker's receive limit, waits this out instead.
    held_until: float | None = None

    @property
    def status(self) -> int:
        return _REFUSAL_STATUS[self.reason]

    @property
    def event_kind(self) -> EventKind:
        """The event it is reported as (an outage is reported as the store's error)."""
        return _REFUSAL_EVENT[self.reason]


KEY_IN_PROGRESS = Refusal("in_progress", IN_PROGRESS_RETRY_AFTER)
KEY_REUSED = Refusal("reused")
STORE_UNAVAILABLE = Refusal("unavailable", STORE_UNAVAILABLE_RETRY_AFTER)
COMMIT_UNAVAILABLE = Refusal("commit_unavailable", STORE_UNAVAILABLE_RETRY_AFTER)


def problem_for(refusal: Refusal) -> Problem:
    """The HTTP answer to an attempt the engine refused to run."""
    reason = refusal.reason
    if reason == "in_progress":
        return problems.key_in_progress(refusal.retry_after or 1)
    if reason == "reused":
        return problems.fingerprint_mismatch()
    if reason == "not_stored":
        return problems.response_not_stored(refusal.size)
    if reason == "unreadable":
        return problems.stored_response_unreadable()
    if reason == "transaction_conflict":
        error = refusal.error
        return problems.transaction_conflict(
            getattr(error, "position", 0), getattr(error, "reason", "")
        )
    if reason == "transaction_rejected":
        return problems.transaction_rejected(getattr(refusal.error, "reason", ""))
    if reason == "commit_unavailable":
        return problems.commit_unavailable(refusal.retry_after or 1)
    if isinstance(refusal.error, StoreUnavailableError) and refusal.error.misconfigured:
        return problems.store_misconfigured()
    return problems.store_unavailable(refusal.retry_after or 1)


def error_for(refusal: Refusal, name: str) -> Exception:
    """What ``idempotent`` function ``name`` raises instead of returning, refused."""
    if refusal.reason in ("transaction_conflict", "transaction_rejected"):
        assert isinstance(refusal.error, Exception), refusal
        return refusal.error  # the transaction's own error, as the function's caller knows it
    if refusal.reason == "commit_unavailable":
        return StoreUnavailableError(
            f"idempotent function {name}: it ran, but the idempotency store could not "
            "confirm the commit of its result and writes, which landed whole or not at "
            "all; retry with the same key (it returns the result, or runs again if "
            "nothing landed)",
            cause="unknown",
        )
    if refusal.reason == "in_progress":
        return KeyInProgressError(
            f"idempotent function {name}: a call with this key is still running",
            retry_after=refusal.retry_after or IN_PROGRESS_RETRY_AFTER,
        )
    if refusal.reason == "reused":
        return KeyReusedError(
            f"idempotent function {name}: this key was already used with another "
            "payload; use a new key for new work"
        )
    if refusal.reason == "not_stored":
        return ResultNotStoredError(
            f"idempotent function {name}: the call with this key completed, but its "
            f"result ({refusal.size} bytes) was too large to keep; it will not run again "
            "under this key",
            size=refusal.size,
        )
    if refusal.reason == "unreadable":
        unreadable = StoredResultUnreadableError(
            f"idempotent function {name}: the call with this key completed, but its stored "
            f"result cannot be read ({refusal.error}); it will not run again under this key: "
            "restore the encryption key it was stored under, or forget the key to run it again"
        )
        unreadable.__cause__ = refusal.error
        return unreadable
    error = refusal.error
    reason = getattr(error, "reason", "") or "the store failed"
    fix = getattr(error, "fix", "") if getattr(error, "misconfigured", False) else ""
    unavailable = StoreUnavailableError(
        f"idempotent function {name}: the idempotency store is misconfigured ({reason}), so "
        f"the function did not run; not retryable: it fails the same way until fixed; fix: {fix}"
        if fix
        else f"idempotent function {name}: the idempotency store failed ({reason}), so the "
        "function did not run; retry with the same key",
        code=getattr(error, "code", ""),
        cause=getattr(error, "cause", "unknown"),
        reason=getattr(error, "reason", ""),
        retry_after=getattr(error, "retry_after", None),
        fix=fix,
    )
    unavailable.__cause__ = error
    return unavailable
