"""Lease renewal: while a handler runs, its claim is extended every ``renewal_interval``
(``lock_timeout / 3``, conditional on its owner token), so a slow but alive handler is not
taken over.

Renewals follow the lease's own deadline: the first is due one interval after the lease was
*granted* (the ``now`` the claim carried, taken before it was sent), not after the claim
returned, so a slow claim cannot leave its owner running on a lease that is nearly spent.
Times come from the injected clock (epoch seconds).

One scheduler per door renews every running claim, so starting and ending a request costs
a dict insert and pop, not a timer or a thread:

- ``LoopRenewals`` (ASGI) fires on the app's own event loop: a loop that is blocked cannot
  renew, so a stuck owner is taken over after the lock timeout;
- ``ThreadRenewals`` (WSGI) is one daemon thread ticking every half interval: a dead
  process stops renewing with it.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from ..clock import Clock
from ..events import Reporter
from ..stores.protocol import AsyncStore, StoreUnavailable, SyncStore
from .effects import Run


class Leases:
    """Running claims, each with when it is next due (clock seconds). Pure: the schedulers
    below only decide *when* to look; this decides *what* is due."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active: dict[str, tuple[Run, float]] = {}

    def add(self, lease: Run) -> float:
        attempt = lease.attempt
        due = lease.granted_at + attempt.policy.renewal_interval
        self.active[attempt.claim.owner] = (lease, due)
        return due

    def remove(self, owner: str) -> None:
        self.active.pop(owner, None)

    def take_due(self, now: float) -> list[Run]:
        """The leases due at ``now``; each is rescheduled one interval after ``now`` (the
        renewal about to be sent grants a lease from ``now``)."""
        due_now = [lease for lease, due in self.active.values() if due <= now]
        for lease in due_now:
            attempt = lease.attempt
            self.active[attempt.claim.owner] = (lease, now + attempt.policy.renewal_interval)
        return due_now

    def next_due(self) -> float | None:
        return min((due for _, due in self.active.values()), default=None)


def _renewed_deadline(lease: Run, now: float) -> float:
    return now + lease.attempt.claim.lock_timeout_seconds


class _LoopLeases:
    """The running claims of one event loop, and its timer."""

    __slots__ = ("leases", "tasks", "timer", "timer_due")

    def __init__(self) -> None:
        self.leases = Leases()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_due: float | None = None
        self.tasks: set[asyncio.Task[None]] = set()


class LoopRenewals:
    """Renews the claims of one async door from a timer on each event loop it runs on.

    An ASGI app runs on one loop; an ``idempotent`` coroutine function may be called from
    several (threads each with their own loop, one ``asyncio.run`` per call): each loop
    renews its own claims, so one loop never drops or touches another's.
    """

    def __init__(self, store: AsyncStore, reporter: Reporter, clock: Clock) -> None:
        self._store = store
        self._reporter = reporter
        self._clock = clock
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopLeases] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # for _loops, shared by the threads of several loops
        # The last loop seen, read and replaced as one tuple (atomic): the usual single loop
        # costs no dictionary lookup.
        self._current: tuple[asyncio.AbstractEventLoop | None, _LoopLeases] = (None, _LoopLeases())

    def _leases_of(self, loop: asyncio.AbstractEventLoop) -> _LoopLeases:
        current_loop, state = self._current
        if current_loop is loop:
            return state
        with self._lock:
            found = self._loops.get(loop)
            if found is None:
                found = self._loops[loop] = _LoopLeases()
        self._current = (loop, found)
        return found

    def start(self, lease: Run) -> None:
        loop = asyncio.get_running_loop()
        current_loop, state = self._current
        if current_loop is not loop:
            state = self._leases_of(loop)
        # Leases.add, inlined: started on every request, so one call less.
        attempt = lease.attempt
        due = lease.granted_at + attempt.policy.renewal_interval
        state.leases.active[attempt.claim.owner] = (lease, due)
        timer_due = state.timer_due
        if timer_due is None or due < timer_due:
            self._schedule(loop, state, due)

    def stop(self, owner: str) -> None:
        # Called on the loop that started the lease. The timer stays: it finds nothing due
        # and stops rescheduling once idle. A renewal already in flight is harmless: renew
        # is conditional on an in-progress claim.
        # Owner tokens are unique, so a lease found among the last-seen loop's is this
        # one: the usual single loop ends a lease without looking its loop up again.
        if self._current[1].leases.active.pop(owner, None) is None:
            self._leases_of(asyncio.get_running_loop()).leases.remove(owner)

    def _schedule(self, loop: asyncio.AbstractEventLoop, state: _LoopLeases, due: float) -> None:
        if state.timer is not None:
            state.timer.cancel()
        state.timer_due = due
        state.timer = loop.call_later(max(due - self._clock.now(), 0.0), self._tick, loop, state)

    def _tick(self, loop: asyncio.AbstractEventLoop, state: _LoopLeases) -> None:
        state.timer = state.timer_due = None
        now = self._clock.now()
        for lease in state.leases.take_due(now):
            task = loop.create_task(self._renew(state, lease, now))
            state.tasks.add(task)
            task.add_done_callback(state.tasks.discard)
        next_due = state.leases.next_due()
        if next_due is not None:
            self._schedule(loop, state, next_due)

    async def _renew(self, state: _LoopLeases, lease: Run, now: float) -> None:
        try:
            claim = lease.attempt.claim
            renewed = await self._store.arenew(
                claim.key_hash, claim.owner, _renewed_deadline(lease, now)
            )
        except StoreUnavailable as error:
            # Keep trying at the next interval: the lock may hold until then.
            self._reporter.report(lease.attempt, "store_error", operation="renew", failure=error)
            return
        if not renewed:
            # Taken over or finished: nothing to renew.
            state.leases.remove(lease.attempt.claim.owner)


class ThreadRenewals:
    """Renews the claims of one WSGI door from one daemon thread, started lazily.

    The thread ticks every half renewal interval and renews what is due, so registering a
    claim never wakes it (a wake-up per request would cost a thread switch): a claim is
    renewed at most half an interval late, still well inside its lock. A handler thread
    that hangs forever keeps its claim renewed; give such handlers their own timeouts.
    """

    def __init__(self, store: SyncStore, reporter: Reporter, clock: Clock) -> None:
        self._store = store
        self._reporter = reporter
        self._clock = clock
        self._leases = Leases()
        # Requests take the plain lock (a C-level context manager); the condition shares it
        # and is only waited on by the renewal thread.
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._tick: float | None = None
        self._closed = False

    def start(self, lease: Run) -> None:
        tick = lease.attempt.policy.renewal_interval / 2
        with self._lock:
            self._leases.add(lease)
            if self._tick is None or tick < self._tick:
                self._tick = tick  # the first claim, or a shorter lock: tick faster
                self._condition.notify()
            if self._thread is None or self._closed:
                self._closed = False
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-lease-renewer", daemon=True
                )
                self._thread.start()

    def stop(self, owner: str) -> None:
        with self._lock:
            self._leases.remove(owner)

    def close(self) -> None:
        """Stop the thread; claims still running are no longer renewed."""
        with self._condition:
            self._closed = True
            self._leases = Leases()
            self._condition.notify()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._condition:
                if not self._closed:  # (a close() before the first wait must not be missed)
                    self._condition.wait(self._tick)
                if self._closed:
                    return
                now = self._clock.now()
                due_now = self._leases.take_due(now)
            self.renew_due(due_now, now)

    def renew_due(self, leases: list[Run], now: float) -> None:
        for lease in leases:
            try:
                claim = lease.attempt.claim
                if not self._store.renew(
                    claim.key_hash, claim.owner, _renewed_deadline(lease, now)
                ):
                    self.stop(claim.owner)
            except StoreUnavailable as error:
                self._reporter.report(
                    lease.attempt, "store_error", operation="renew", failure=error
                )
