"""The effects an attempt yields, and what its drivers answer.

An attempt (``flow.attempt``) never does I/O: it yields one of these and receives the
result (or has the store's exception thrown into it). The sync and the async driver
(``drivers.py``) are the only places that touch a store, a clock's sleep, the inner app,
the ``on_event`` hook (``Emit``) or the replay cache (``Recall``, ``Remember``).

Effects are immutable values: nothing the flow hands a driver comes back changed; what
the driver learns comes back as the effect's result.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple

from ..events import EventKind, Reporter
from ..stores.protocol import ClaimRequest, Completion
from ..stores.records import Record
from .cache import ReplayCache
from .decisions import Attempt

# A ``ClaimRequest`` is itself the claim effect: ``store.claim(request)`` -> ``Claimed | Held``;
# a ``Completion`` the completion effect: ``store.complete(completion)`` -> ``bool``
# (``False``: fenced out). Yielding them as they are saves building a wrapper per request.


class Release(NamedTuple):
    """``store.release(key_hash, owner)`` -> ``bool`` (``False``: fenced out)."""

    key_hash: str
    owner: str


class Renew(NamedTuple):
    """``store.renew(key_hash, owner, lock_expires_at)`` -> ``bool``."""

    key_hash: str
    owner: str
    lock_expires_at: float


class Sleep(NamedTuple):
    """Wait on the driver's clock -> ``None``."""

    seconds: float


class Wait(NamedTuple):
    """A duplicate waiting for the first attempt: pause before polling again -> ``bool``
    (``False``: stop waiting, the caller went away). Unlike ``Sleep``, a door may cut it
    short (the ASGI door ends it when its client disconnects), and so may the store's news
    of ``key_hash`` (a store that pushes its completions: see ``PushedChanges``)."""

    seconds: float
    key_hash: str = ""


class Run(NamedTuple):
    """Run the door's inner thing (app, function) under a lease -> ``Ran | None`` (``None``:
    it answered nothing). The driver renews the claim while it runs, counting from
    ``granted_at`` (the time the lease's deadline counts from), and stops renewing when it
    returns or raises, except for a live stream that has not ended (``EndLease`` ends that
    one). Its exceptions are thrown into the attempt. While it runs, the driver shows the
    handler its attempt (``attempt_context.CURRENT``; ``http`` False for a function call)
    and returns what the handler asked for beyond its answer (``Ran.writes``,
    ``Ran.deferred``)."""

    attempt: Attempt
    granted_at: float
    http: bool = True


class EndLease(NamedTuple):
    """Stop renewing the claim -> ``None``."""

    owner: str


class AwaitStreamEnd(NamedTuple):
    """Wait until a live response has been sent to its end -> ``StreamEnd``. The sync
    driver suspends the attempt here (a WSGI stream ends after the call returned)."""


AWAIT_STREAM_END = AwaitStreamEnd()


class Emit(NamedTuple):
    """Report an event of ``attempt`` to ``reporter`` (the log and the ``on_event`` hook)
    -> ``None``. The fields are ``events.Reporter.report``'s."""

    reporter: Reporter
    attempt: Attempt
    kind: EventKind
    status: int | None = None
    store_latency_ms: float | None = None
    operation: str | None = None
    error: str | None = None
    failure: BaseException | None = None
    note: str | None = None
    waited_seconds: float | None = None


def emit(effect: Emit) -> None:
    """Perform an ``Emit``: what both drivers (and a hand-stepping test) do with one."""
    reporter, attempt, kind, status, latency, operation, error, failure, note, waited = effect
    reporter.report_fields(attempt, kind, status, latency, operation, error, failure, note, waited)


class Recall(NamedTuple):
    """``cache.get(key_hash, now)`` -> ``Record | None``: a completed record kept in the
    door's replay cache (yielded only by a door that has one)."""

    cache: ReplayCache
    key_hash: str
    now: float


class Remember(NamedTuple):
    """``cache.put(record, now)`` -> ``None``: keep a held record, read from the store at
    ``now``, for replays (when completed)."""

    cache: ReplayCache
    record: Record
    now: float


class Spawn(NamedTuple):
    """Run another flow in the background (a task, or a daemon thread) -> ``None``."""

    flow: Generator[Effect, Any, Any]


Effect = (
    ClaimRequest
    | Completion
    | Release
    | Renew
    | Sleep
    | Wait
    | Run
    | Emit
    | Recall
    | Remember
    | EndLease
    | AwaitStreamEnd
    | Spawn
)


class Ran(NamedTuple):
    """What the inner thing answered, as the attempt needs it to decide what to keep.

    ``live`` when the response went (or goes) to its client as it came; ``ended`` when such
    a stream is already over (ASGI sends it within the app call), with ``size`` bytes.
    ``writes`` (the handler's transaction), ``deferred`` (``defer_completion()``) and
    ``deferred_to`` (the deferral handed to another owner's running work) are added by the
    driver: what the handler asked to be kept with its answer.
    """

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    live: bool = False
    ended: bool = True
    size: int = 0
    writes: tuple[dict[str, Any], ...] = ()
    deferred: bool = False
    deferred_to: str | None = None


class StreamEnd(NamedTuple):
    """How a live stream ended: bytes sent, and whether the app failed midway."""

    size: int
    failed: bool
