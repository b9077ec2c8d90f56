"""The attempt a handler runs in, as the handler sees it (``completion_transaction()``,
``defer_completion()``).

The engine's drivers set it around the inner thing's run, in a ``ContextVar``: it follows
the request's context into the handler, into a sync FastAPI route's worker thread (Starlette
copies the context there) and into an ``idempotent`` function, and it is reset when the run
ends, so nothing of a finished attempt stays visible to the thread afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Sized
from contextvars import ContextVar
from typing import Any, Protocol

from ..stores.protocol import ClaimRequest


class Writes(Sized, Protocol):
    """What an attempt needs of its transaction (``transactions.Transaction``, which imports
    this module, not the reverse): its writes in the order added."""

    @property
    def items(self) -> tuple[dict[str, Any], ...]: ...


__all__ = [
    "CURRENT",
    "FINISHED",
    "MADE",
    "Announcement",
    "CurrentAttempt",
    "announce",
    "current_attempt",
    "finish_announced",
    "streams_now",
]


class CurrentAttempt:
    """One claimed attempt while its handler runs: what it asked for beyond a response.

    ``transaction`` holds the writes to commit with the completion (made on first use);
    ``deferred`` is set by ``defer_completion()``, and ``deferred_to`` when the deferral is
    handed to another owner's work still running (``hand_deferral_to()``); ``live`` once the
    response started going to its client as it came (a stream), after which no write may be
    added: the writes must land before the first byte.
    """

    __slots__ = (
        "claim",
        "deferred",
        "deferred_to",
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
        self.deferred_to: str | None = None
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


# What a driver sets while the inner thing runs: the attempt itself, or (the drivers) an
# announcement, ``[run, store, made, finished]``: a list, built in C, where a CurrentAttempt
# would cost a Python ``__init__`` on every request, though few handlers ever ask for it.
# ``run`` is the driver's ``Run`` effect (its ``attempt`` and ``http``); the CurrentAttempt
# is made at the first ask (``made``); ``finished`` once the handler returned
# (``finish_announced``).
Announcement = list[Any]
_RUN, _STORE, MADE, FINISHED = range(4)

CURRENT: ContextVar[CurrentAttempt | Announcement | None] = ContextVar(
    "idempotency_attempt", default=None
)

# Two threads of one handler asking at once make one CurrentAttempt between them.
_MAKING = threading.Lock()


def announce(run: Any, store: Any) -> Announcement:
    """What a driver sets in ``CURRENT`` while ``run`` (its ``Run`` effect) runs."""
    return [run, store, None, False]


def finish_announced(announced: Announcement) -> CurrentAttempt | None:
    """The handler returned: its attempt (if it was made) takes no more writes."""
    announced[FINISHED] = True
    made: CurrentAttempt | None = announced[MADE]
    if made is not None:
        made.finished = True
    return made


def _made(announced: Announcement) -> CurrentAttempt:
    with _MAKING:
        made: CurrentAttempt | None = announced[MADE]
        if made is None:
            run = announced[_RUN]
            attempt = run.attempt
            made = CurrentAttempt(
                attempt.claim, attempt.policy.ttl_seconds, run.http, announced[_STORE]
            )
            announced[MADE] = made
    # (Read after it was stored: a driver finishing meanwhile reads it after setting this.)
    if announced[FINISHED]:
        made.finished = True
    return made


def _current() -> CurrentAttempt | None:
    found = CURRENT.get()
    if found is None or type(found) is CurrentAttempt:
        return found
    assert isinstance(found, list)
    return _made(found)


def current_attempt(caller: str) -> CurrentAttempt:
    """The attempt whose handler is running; ``LookupError`` naming ``caller`` outside one."""
    attempt = _current()
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
    attempt = _current()
    if attempt is None:
        return True
    if attempt.has_writes():
        return False
    attempt.go_live()
    return True
