"""The attempt a handler runs in, as the handler sees it (``completion_transaction()``,
``defer_completion()``).

The engine's drivers set it around the inner thing's run, in a ``ContextVar``: it follows
the request's context into the handler, into a sync FastAPI route's worker thread (Starlette
copies the context there) and into an ``idempotent`` function, and it is reset when the run
ends, so nothing of a finished attempt stays visible to the thread afterwards.
"""

from __future__ import annotations

from collections.abc import Sized
from contextvars import ContextVar
from typing import Any, Protocol

from .stores.protocol import ClaimRequest


class Writes(Sized, Protocol):
    """What an attempt needs of its transaction (``transactions.Transaction``, which imports
    this module, not the reverse): its writes in the order added."""

    @property
    def items(self) -> tuple[dict[str, Any], ...]: ...


__all__ = ["CURRENT", "CurrentAttempt", "current_attempt", "streams_now"]


class CurrentAttempt:
    """One claimed attempt while its handler runs: what it asked for beyond a response.

    ``transaction`` holds the writes to commit with the completion (made on first use);
    ``deferred`` is set by ``defer_completion()``; ``live`` once the response started going
    to its client as it came (a stream), after which no write may be added: the writes must
    land before the first byte.
    """

    __slots__ = (
        "claim",
        "deferred",
        "finished",
        "http",
        "live",
        "store",
        "transaction",
        "ttl_seconds",
    )

    def __init__(
        self, claim: ClaimRequest, ttl_seconds: float, http: bool, store: Any = None
    ) -> None:
        self.claim = claim
        self.ttl_seconds = ttl_seconds
        self.http = http
        self.store: Any = store  # the store of the driver that runs the attempt
        self.transaction: Writes | None = None
        self.deferred = False
        self.live = False
        self.finished = False  # the handler returned: its transaction takes no more writes

    def writes(self) -> tuple[dict[str, Any], ...]:
        """The transaction's writes in the order added (none without a transaction)."""
        transaction = self.transaction
        return () if transaction is None else transaction.items

    def has_writes(self) -> bool:
        return self.transaction is not None and len(self.transaction) > 0

    def go_live(self) -> None:
        """The response starts streaming to its client: no write may be added from now."""
        self.live = True


CURRENT: ContextVar[CurrentAttempt | None] = ContextVar("idempotency_attempt", default=None)


def current_attempt(caller: str) -> CurrentAttempt:
    """The attempt whose handler is running; ``LookupError`` naming ``caller`` outside one."""
    attempt = CURRENT.get()
    if attempt is None:
        raise LookupError(
            f"{caller} is only available while an idempotent attempt runs: in a handler "
            "behind IdempotencyMiddleware or IdempotencyWSGIMiddleware serving a request that "
            "carries an Idempotency-Key, or in an @idempotent function"
        )
    return attempt


def streams_now() -> bool:
    """Called by a door when a response of a streaming media type starts: whether it may
    go to its client live. Not when the attempt's transaction holds writes (they must land
    before its first byte, so it is held, and stored, like any other response); otherwise
    it goes live and the transaction takes no more writes."""
    attempt = CURRENT.get()
    if attempt is None:
        return True
    if attempt.has_writes():
        return False
    attempt.go_live()
    return True
