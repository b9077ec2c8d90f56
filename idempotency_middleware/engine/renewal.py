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
  renew, so a stuck owner is taken over after the lock timeout. It keeps no loop alive: a
  loop that ended (one ``asyncio.run`` per call) is collected with its state;
- ``ThreadRenewals`` (WSGI, sync functions) share one daemon thread per process, ticking
  every half interval while some claim runs and ending when none does (a dead process
  stops renewing with it).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable

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


def _no_loop() -> None:
    return None


class _LoopLeases:
    """The running claims of one event loop, and its timer.

    Held as the value of a weak dictionary keyed by the loop, it must not reach the loop:
    the timer (whose handle holds the loop) is held weakly, the loop's own scheduled
    handles hold it while it is pending, and a closed loop drops them.
    """

    __slots__ = ("leases", "tasks", "timer", "timer_due")

    def __init__(self) -> None:
        self.leases = Leases()
        self.timer: weakref.ref[asyncio.TimerHandle] | None = None
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
        # The last loop seen (weakly: a finished loop is not kept), read and replaced as one
        # tuple (atomic): the usual single loop costs no dictionary lookup.
        self._current: tuple[Callable[[], asyncio.AbstractEventLoop | None], _LoopLeases] = (
            _no_loop,
            _LoopLeases(),
        )

    def _leases_of(self, loop: asyncio.AbstractEventLoop) -> _LoopLeases:
        current_loop, state = self._current
        if current_loop() is loop:
            return state
        with self._lock:
            found = self._loops.get(loop)
            if found is None:
                found = self._loops[loop] = _LoopLeases()
        self._current = (weakref.ref(loop), found)
        return found

    def start(self, lease: Run) -> None:
        loop = asyncio.get_running_loop()
        current_loop, state = self._current
        if current_loop() is not loop:
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
        timer = state.timer() if state.timer is not None else None
        if timer is not None:
            timer.cancel()
        state.timer_due = due
        handle = loop.call_later(max(due - self._clock.now(), 0.0), self._tick, loop, state)
        state.timer = weakref.ref(handle)

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


class _Renewer:
    """The process's one lease-renewer thread, shared by every ``ThreadRenewals``.

    It runs only while some door has a lease: it ticks every half renewal interval (the
    shortest among the doors it serves), renews what is due, and ends at the first tick that
    finds no lease left (the next lease starts it again). A door's ``close()`` drops its
    leases, and ends the thread at once when no other door has any.
    """

    def __init__(self) -> None:
        # Requests take the plain lock (a C-level context manager); the condition shares it
        # and is only waited on by the renewal thread.
        self.lock = threading.Lock()
        self.condition = threading.Condition(self.lock)
        self.doors: set[ThreadRenewals] = set()  # the doors with leases: held only then
        self.tick: float | None = None
        self.thread: threading.Thread | None = None

    def start_thread(self) -> None:
        """Start the thread (called holding ``lock``, when none runs)."""
        self.thread = threading.Thread(
            target=self._run, name="idempotency-lease-renewer", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self.condition:
                # (Not ours any more: closed, or idle and replaced by a newer thread.)
                if self.thread is not me:
                    return
                if self.doors:
                    self.condition.wait(self.tick)
                if self.thread is not me:
                    return
                due = self._take_due()
                if not self.doors:
                    # Nothing left to renew: end, deciding under the lock, so a lease
                    # started from now on finds no thread and starts another.
                    self.thread = self.tick = None
            for door, leases, now in due:
                door.renew_due(leases, now)

    def _take_due(self) -> list[tuple[ThreadRenewals, list[Run], float]]:
        """Each door's due leases, at its own clock's time; doors left idle are dropped."""
        due: list[tuple[ThreadRenewals, list[Run], float]] = []
        for door in list(self.doors):
            now = door._clock.now()
            leases = door._leases.take_due(now)
            if leases:
                due.append((door, leases, now))
            if not door._leases.active:
                self.doors.discard(door)
        self.tick = min((door._tick for door in self.doors if door._tick), default=None)
        return due


_RENEWER = _Renewer()


def _renewer_after_fork() -> None:
    # The parent's thread did not come along: the child renews its own leases afresh, and
    # not the parent's claims its doors held at the fork (the parent renews those, or, dead,
    # lets them lapse to be taken over).
    global _RENEWER
    for door in _RENEWER.doors:
        door._leases = Leases()
    _RENEWER = _Renewer()


os.register_at_fork(after_in_child=_renewer_after_fork)


class ThreadRenewals:
    """Renews the claims of one sync door (WSGI, Django, sync ``idempotent`` functions).

    The renewing is done by one thread per process (``_Renewer``), running only while some
    door has a claim to renew: a process with many decorated functions has one renewer, not
    one per function, and none once nothing runs. It ticks every half renewal interval and
    renews what is due, so registering a claim never wakes it (a wake-up per request would
    cost a thread switch): a claim is renewed at most half an interval late, still well
    inside its lock. A handler thread that hangs forever keeps its claim renewed; give such
    handlers their own timeouts.
    """

    def __init__(self, store: SyncStore, reporter: Reporter, clock: Clock) -> None:
        self._store = store
        self._reporter = reporter
        self._clock = clock
        self._leases = Leases()
        self._tick: float | None = None

    def start(self, lease: Run) -> None:
        tick = lease.attempt.policy.renewal_interval / 2
        renewer = _RENEWER
        with renewer.lock:
            self._leases.add(lease)
            renewer.doors.add(self)
            if self._tick is None or tick < self._tick:
                self._tick = tick  # the first claim, or a shorter lock
            if renewer.tick is None or tick < renewer.tick:
                renewer.tick = tick  # tick faster from now on
                renewer.condition.notify()
            if renewer.thread is None:
                renewer.start_thread()

    def stop(self, owner: str) -> None:
        with _RENEWER.lock:
            self._leases.remove(owner)

    def close(self) -> None:
        """Stop renewing this door's claims (those still running are no longer renewed);
        the renewer thread ends now if no other door has a claim."""
        renewer = _RENEWER
        with renewer.condition:
            self._leases = Leases()
            renewer.doors.discard(self)
            if renewer.doors:
                return
            thread, renewer.thread, renewer.tick = renewer.thread, None, None
            renewer.condition.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

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
