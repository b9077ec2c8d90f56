"""The two interpreters of an attempt: one sync (WSGI, sync functions), one async (ASGI,
coroutine functions). They are the only code that calls a store, sleeps, runs the inner
app, feeds the event hook or touches the replay cache; the sequence itself is
``flow.attempt``, written once. While the inner thing runs, the driver shows it its attempt
(``attempt_context.CURRENT``) and hands what it asked for back to the flow in ``Ran``.

A store's ``StoreUnavailable`` (and any other exception, a cancellation included) is thrown
into the flow at the effect that raised it, so the flow handles failures where they happen.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from ..clock import Clock, SystemClock
from ..handler.context import (
    CURRENT,
    FINISHED,
    MADE,
    Announcement,
    CurrentAttempt,
    announce,
    finish_announced,
)
from ..stores.protocol import (
    AsyncStore,
    ClaimRequest,
    Completion,
    PushedChanges,
    SyncStore,
    pushed_changes,
    sync_twin,
)
from ..stores.records import Record
from .effects import (
    AwaitStreamEnd,
    Effect,
    Emit,
    EndLease,
    Ran,
    Recall,
    Release,
    Remember,
    Renew,
    Run,
    Sleep,
    Spawn,
    Wait,
    emit,
)
from .renewal import LoopRenewals, ThreadRenewals

T = TypeVar("T")
SyncRun = Callable[[], "Ran | None"]
AsyncRun = Callable[[], Awaitable["Ran | None"]]
# How a door's waiter pauses between polls: ``False`` when its caller went away.
AsyncWaiter = Callable[[float], Awaitable[bool]]

# Which method of a driver performs each of the rarer effects (``_release`` ...): one table
# for both drivers. The three of every call (claim, run, complete) are dispatched inline.
_PERFORM = {
    Recall: "_recall",
    Remember: "_remember",
    Release: "_release",
    Renew: "_renew",
    Sleep: "_sleep",
    Wait: "_wait",
    EndLease: "_end_lease",
    AwaitStreamEnd: "_await_stream_end",
    Spawn: "_spawn",
}


def _wakeups(store: object, clock: Clock) -> PushedChanges | None:
    """The store's pushed changes, when waiting on real time (a test's fake clock crosses
    its waits without sleeping: a push could not end them any sooner)."""
    return pushed_changes(store) if isinstance(clock, SystemClock) else None


def _lease_ends_with_run(ran: Ran | None) -> bool:
    """A live stream still going out keeps its lease until the flow yields ``EndLease``."""
    return ran is None or ran.ended


def _with_requests(ran: Ran | None, current: CurrentAttempt | None) -> Ran | None:
    """``ran`` with what its handler asked for beyond its answer: a transaction's writes, a
    deferral (``current``: the attempt as the handler saw it, if it asked for it). Returned
    as a value, so nothing the flow handed the driver comes back changed."""
    if ran is None or current is None or (current.transaction is None and not current.deferred):
        return ran
    return ran._replace(
        writes=current.writes(), deferred=current.deferred, deferred_to=current.deferred_to
    )


class Suspended(Exception):
    """Raised by ``SyncDriver.drive`` when the flow waits for a live stream to end; resume
    it with ``SyncDriver.resume(flow, StreamEnd(...))`` once the stream is over."""


class SyncDriver:
    """Interprets flows with blocking calls on the calling thread."""

    __slots__ = ("clock", "renewals", "store", "wakeups")

    def __init__(self, store: SyncStore, clock: Clock, renewals: ThreadRenewals) -> None:
        self.store = store
        self.clock = clock
        self.renewals = renewals
        self.wakeups = _wakeups(store, clock)

    def drive(self, flow: Generator[Effect, Any, T], run: SyncRun | None = None) -> T:
        """Run ``flow`` to its end and return its outcome (or raise what it raised)."""
        return self._loop(flow, run, None)

    def resume(self, flow: Generator[Effect, Any, T], value: object) -> T:
        """Continue a flow that was suspended at ``AwaitStreamEnd``."""
        return self._loop(flow, None, value)

    def _loop(self, flow: Generator[Effect, Any, T], run: SyncRun | None, value: object) -> T:
        store, wakeups = self.store, self.wakeups
        mark = 0  # the store's news mark before the last claim (PushedChanges)
        error: BaseException | None = None
        while True:
            try:
                effect = flow.send(value) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            value = error = None
            try:
                if type(effect) is ClaimRequest:
                    if wakeups is not None:
                        mark = wakeups.mark()
                    value = store.claim(effect)
                elif type(effect) is Run:
                    value = self._run(effect, run)
                elif type(effect) is Completion:
                    value = store.complete(effect)
                elif type(effect) is Emit:  # (only when someone listens: Reporter.wants)
                    emit(effect)
                elif type(effect) is Wait and wakeups is not None and effect.key_hash:
                    wakeups.wait(effect.key_hash, mark, effect.seconds)
                    value = True
                else:
                    value = getattr(self, _PERFORM[type(effect)])(effect)
            except Suspended:
                raise
            except GeneratorExit:
                flow.close()  # this driver is being closed: the flow may not go on
                raise
            except BaseException as raised:
                error = raised

    def _run(self, effect: Run, run: SyncRun | None) -> Ran | None:
        assert run is not None, "a flow yielded Run with nothing to run"
        # The handler's attempt (attempt_context), made only if it asks for it.
        announced = announce(effect, self.store)
        entered = CURRENT.set(announced)
        try:
            self.renewals.start(effect)
            ran = run()
        except BaseException:
            self.renewals.stop(effect.attempt.claim.owner)
            raise
        finally:
            current = finish_announced(announced)
            CURRENT.reset(entered)
        if _lease_ends_with_run(ran):
            self.renewals.stop(effect.attempt.claim.owner)
        return _with_requests(ran, current)

    def _recall(self, effect: Recall) -> Record | None:
        return effect.cache.get(effect.key_hash, effect.now)

    def _remember(self, effect: Remember) -> None:
        effect.cache.put(effect.record, effect.now)

    def _release(self, effect: Release) -> bool:
        return self.store.release(effect.key_hash, effect.owner)

    def _renew(self, effect: Renew) -> bool:
        return self.store.renew(effect.key_hash, effect.owner, effect.lock_expires_at)

    def _sleep(self, effect: Sleep) -> None:
        self.clock.sleep(effect.seconds)

    def _wait(self, effect: Wait) -> bool:
        # A WSGI server does not tell its app that a client left; a function has no client.
        self.clock.sleep(effect.seconds)
        return True

    def _end_lease(self, effect: EndLease) -> None:
        self.renewals.stop(effect.owner)

    def _await_stream_end(self, effect: AwaitStreamEnd) -> None:
        raise Suspended

    def _spawn(self, effect: Spawn) -> None:
        threading.Thread(
            target=self.drive, args=(effect.flow,), name="idempotency-background", daemon=True
        ).start()


class AsyncDriver:
    """Interprets flows on the running event loop."""

    __slots__ = (
        "_background",
        "_claim_now",
        "_complete_now",
        "clock",
        "renewals",
        "store",
        "wakeups",
    )

    def __init__(self, store: AsyncStore, clock: Clock, renewals: LoopRenewals) -> None:
        self.store = store
        self.clock = clock
        self.renewals = renewals
        self._background: set[asyncio.Task[Any]] = set()
        # A store doing no I/O (MemoryStore) is called through its sync methods: its async
        # ones would only wrap them in a coroutine that never suspends.
        self._claim_now = sync_twin(store, "aclaim")
        self._complete_now = sync_twin(store, "acomplete")
        self.wakeups = _wakeups(store, clock)

    async def drive(
        self,
        flow: Generator[Effect, Any, T],
        run: AsyncRun | None = None,
        wait: AsyncWaiter | None = None,
    ) -> T:
        """Run ``flow`` to its end and return its outcome (or raise what it raised).
        ``wait`` pauses a waiting duplicate (default: a sleep on the clock)."""
        store, renewals = self.store, self.renewals
        claim_now, complete_now = self._claim_now, self._complete_now
        wakeups, mark = self.wakeups, 0  # (mark: the store's news before the last claim)
        value: object = None
        error: BaseException | None = None
        while True:
            try:
                effect = flow.send(value) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            value = error = None
            try:
                if type(effect) is ClaimRequest:
                    if wakeups is not None:
                        mark = wakeups.mark()
                    if claim_now is not None:
                        value = claim_now(effect)
                    else:
                        value = await store.aclaim(effect)
                elif type(effect) is Run:
                    assert run is not None, "a flow yielded Run with nothing to run"
                    # The handler's attempt (attempt_context), made only if it asks for it.
                    # (announce, inlined: one call less per request.)
                    announced: Announcement = [effect, store, None, False]
                    entered = CURRENT.set(announced)
                    try:
                        renewals.start(effect)
                        value = await run()
                        if announced[MADE] is not None:
                            value = _with_requests(value, announced[MADE])
                    finally:
                        # An ASGI response, live or not, has been sent when the app returns.
                        renewals.stop(effect.attempt.claim.owner)
                        # (finish_announced, inlined for the usual handler, which never
                        # asked: finished first, then whether it was made, as there.)
                        announced[FINISHED] = True
                        if announced[MADE] is not None:
                            finish_announced(announced)
                        CURRENT.reset(entered)
                elif type(effect) is Completion:
                    if complete_now is not None:
                        value = complete_now(effect)
                    else:
                        value = await store.acomplete(effect)
                elif type(effect) is Emit:  # (only when someone listens: Reporter.wants)
                    emit(effect)
                elif type(effect) is Wait and wakeups is not None and effect.key_hash:
                    value = await _pushed_wait(wakeups, mark, effect, wait or self.clock.asleep)
                elif type(effect) is Wait and wait is not None:
                    value = await wait(effect.seconds)
                else:
                    value = await getattr(self, _PERFORM[type(effect)])(effect)
            except GeneratorExit:
                # This coroutine is being closed (its loop is gone): the flow may not go on,
                # so no effect (a background release) is attempted without a loop.
                flow.close()
                raise
            except BaseException as raised:
                error = raised

    async def _recall(self, effect: Recall) -> Record | None:
        return effect.cache.get(effect.key_hash, effect.now)

    async def _remember(self, effect: Remember) -> None:
        effect.cache.put(effect.record, effect.now)

    async def _release(self, effect: Release) -> bool:
        return await self.store.arelease(effect.key_hash, effect.owner)

    async def _renew(self, effect: Renew) -> bool:
        return await self.store.arenew(effect.key_hash, effect.owner, effect.lock_expires_at)

    async def _sleep(self, effect: Sleep) -> None:
        await self.clock.asleep(effect.seconds)

    async def _wait(self, effect: Wait) -> bool:
        await self.clock.asleep(effect.seconds)
        return True

    async def _end_lease(self, effect: EndLease) -> None:
        self.renewals.stop(effect.owner)

    async def _await_stream_end(self, effect: AwaitStreamEnd) -> None:
        raise TypeError(f"the async driver cannot interpret {effect!r}")

    async def _spawn(self, effect: Spawn) -> None:
        task = asyncio.get_running_loop().create_task(self.drive(effect.flow))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _pushed_wait(
    wakeups: PushedChanges,
    mark: int,
    effect: Wait,
    wait: Callable[[float], Awaitable[bool | None]],
) -> bool:
    """``wait`` (the door's pause, or a sleep), ended early by the store's news of the key."""
    changed = wakeups.watch(effect.key_hash, mark)
    if changed.done():
        return True
    pausing = asyncio.ensure_future(wait(effect.seconds))
    try:
        await asyncio.wait((changed, pausing), return_when=asyncio.FIRST_COMPLETED)
        return pausing.result() is not False if pausing.done() else True
    finally:
        pausing.cancel()
        wakeups.unwatch(effect.key_hash, changed)
