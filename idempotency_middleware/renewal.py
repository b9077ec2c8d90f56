"""Lease renewal: while a handler runs, its claim is extended every ``lock_timeout / 3``
(conditional on its owner token), so a slow but alive handler is not taken over.

One scheduler per middleware renews every running claim, so starting and ending a request
costs a dict insert and pop, not a timer or a thread:

- ``LoopRenewals`` (ASGI) fires on the app's own event loop: a loop that is blocked cannot
  renew, so a stuck owner is taken over after the lock timeout;
- ``ThreadRenewals`` (WSGI) is one daemon thread ticking every half interval: a dead
  process stops renewing with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from . import core
from .events import Reporter
from .stores.base import AsyncStore, StoreUnavailable, SyncStore


class _Leases:
    """Running claims, each with when it is next due (monotonic seconds)."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active: dict[str, tuple[core.Attempt, float]] = {}

    def add(self, attempt: core.Attempt, now: float) -> float:
        due = now + attempt.policy.renewal_interval
        self.active[attempt.claim.owner] = (attempt, due)
        return due

    def remove(self, attempt: core.Attempt) -> None:
        self.active.pop(attempt.claim.owner, None)

    def take_due(self, now: float) -> list[core.Attempt]:
        """The claims due now; each is rescheduled one interval on."""
        due_now = [attempt for attempt, due in self.active.values() if due <= now]
        for attempt in due_now:
            self.add(attempt, now)
        return due_now

    def next_due(self) -> float | None:
        return min((due for _, due in self.active.values()), default=None)


def _new_deadline(attempt: core.Attempt) -> float:
    return time.time() + attempt.claim.lock_timeout_seconds


class LoopRenewals:
    """Renews the claims of one ASGI middleware from a timer on the app's event loop."""

    def __init__(self, store: AsyncStore, reporter: Reporter) -> None:
        self._store = store
        self._reporter = reporter
        self._leases = _Leases()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, attempt: core.Attempt) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A middleware served from a new loop (tests, app reloads): start afresh there.
            self._loop, self._timer = loop, None
            self._leases = _Leases()
        due = self._leases.add(attempt, loop.time())
        if self._timer is None:
            self._timer = loop.call_at(due, self._tick)

    def stop(self, attempt: core.Attempt) -> None:
        # The timer stays: it finds nothing due and stops rescheduling once idle. A renewal
        # already in flight is harmless: renew is conditional on an in-progress claim.
        self._leases.remove(attempt)

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        for attempt in self._leases.take_due(loop.time()):
            task = loop.create_task(self._renew(attempt))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        next_due = self._leases.next_due()
        if next_due is not None:
            self._timer = loop.call_at(next_due, self._tick)

    async def _renew(self, attempt: core.Attempt) -> None:
        claim = attempt.claim
        try:
            if not await self._store.arenew(claim.key_hash, claim.owner, _new_deadline(attempt)):
                self._leases.remove(attempt)  # taken over or finished: nothing to renew
        except StoreUnavailable as error:
            # Keep trying at the next interval: the lock may hold until then.
            self._reporter.report(attempt, "store_error", operation="renew", error=repr(error))


class ThreadRenewals:
    """Renews the claims of one WSGI middleware from one daemon thread, started lazily.

    The thread ticks every half renewal interval and renews what is due, so registering a
    claim never wakes it (a wake-up per request would cost a thread switch): a claim is
    renewed at most half an interval late, still well inside its lock. A handler thread
    that hangs forever keeps its claim renewed; give such handlers their own timeouts.
    """

    def __init__(
        self, store: SyncStore, reporter: Reporter, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._reporter = reporter
        self._clock = clock
        self._leases = _Leases()
        # Requests take the plain lock (a C-level context manager); the condition shares it
        # and is only waited on by the renewal thread.
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._tick: float | None = None
        self._closed = False

    def start(self, attempt: core.Attempt) -> None:
        tick = attempt.policy.renewal_interval / 2
        with self._lock:
            self._leases.add(attempt, self._clock())
            if self._tick is None or tick < self._tick:
                self._tick = tick  # the first claim, or a shorter lock: tick faster
                self._condition.notify()
            if self._thread is None or self._closed:
                self._closed = False
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-lease-renewer", daemon=True
                )
                self._thread.start()

    def stop(self, attempt: core.Attempt) -> None:
        with self._lock:
            self._leases.remove(attempt)

    def close(self) -> None:
        """Stop the thread; claims still running are no longer renewed."""
        with self._condition:
            self._closed = True
            self._leases = _Leases()
            self._condition.notify()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait(self._tick)
                if self._closed:
                    return
                due_now = self._leases.take_due(self._clock())
            for attempt in due_now:
                self._renew(attempt)

    def _renew(self, attempt: core.Attempt) -> None:
        claim = attempt.claim
        try:
            if not self._store.renew(claim.key_hash, claim.owner, _new_deadline(attempt)):
                self.stop(attempt)
        except StoreUnavailable as error:
            self._reporter.report(attempt, "store_error", operation="renew", error=repr(error))
