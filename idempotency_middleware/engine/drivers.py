"""The two interpreters of an attempt: one sync (WSGI, sync functions), one async (ASGI,
coroutine functions). They are the only code that calls a store, sleeps, or runs the inner
app; the sequence itself is ``flow.attempt``, written once.

A store's ``StoreUnavailable`` (and any other exception, a cancellation included) is thrown
into the flow at the effect that raised it, so the flow handles failures where they happen.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from ..clock import Clock
from ..renewal import LoopRenewals, ThreadRenewals
from ..stores.base import AsyncStore, SyncStore
from .effects import (
    AwaitStreamEnd,
    Claim,
    Complete,
    Effect,
    EndLease,
    Ran,
    Release,
    Renew,
    Run,
    Sleep,
    Spawn,
    StartLease,
)

T = TypeVar("T")
SyncRun = Callable[[], "Ran | None"]
AsyncRun = Callable[[], Awaitable["Ran | None"]]


class Suspended(Exception):
    """Raised by ``SyncDriver.drive`` when the flow waits for a live stream to end; resume
    it with ``SyncDriver.resume(flow, StreamEnd(...))`` once the stream is over."""


class SyncDriver:
    """Interprets flows with blocking calls on the calling thread."""

    __slots__ = ("clock", "renewals", "store")

    def __init__(self, store: SyncStore, clock: Clock, renewals: ThreadRenewals) -> None:
        self.store = store
        self.clock = clock
        self.renewals = renewals

    def drive(self, flow: Generator[Effect, Any, T], run: SyncRun | None = None) -> T:
        """Run ``flow`` to its end and return its outcome (or raise what it raised)."""
        return self._loop(flow, run, None)

    def resume(self, flow: Generator[Effect, Any, T], value: object) -> T:
        """Continue a flow that was suspended at ``AwaitStreamEnd``."""
        return self._loop(flow, None, value)

    def _loop(self, flow: Generator[Effect, Any, T], run: SyncRun | None, value: object) -> T:
        store = self.store
        error: BaseException | None = None
        while True:
            try:
                effect = flow.send(value) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            error = value = None
            try:
                if type(effect) is Claim:
                    value = store.claim(effect.request)
                elif type(effect) is Complete:
                    value = store.complete(effect.completion)
                elif type(effect) is Release:
                    value = store.release(effect.key_hash, effect.owner)
                elif type(effect) is Run:
                    assert run is not None, "a flow yielded Run with nothing to run"
                    value = run()
                elif type(effect) is StartLease:
                    self.renewals.start(effect)
                elif type(effect) is EndLease:
                    self.renewals.stop(effect.owner)
                elif type(effect) is Renew:
                    value = store.renew(effect.key_hash, effect.owner, effect.lock_expires_at)
                elif type(effect) is Sleep:
                    self.clock.sleep(effect.seconds)
                elif type(effect) is Spawn:
                    threading.Thread(
                        target=self.drive,
                        args=(effect.flow,),
                        name="idempotency-background",
                        daemon=True,
                    ).start()
                elif type(effect) is AwaitStreamEnd:
                    raise Suspended
                else:  # pragma: no cover - the Effect union is closed
                    raise TypeError(f"unknown effect {effect!r}")
            except Suspended:
                raise
            except BaseException as raised:
                error = raised


class AsyncDriver:
    """Interprets flows on the running event loop."""

    __slots__ = ("_background", "clock", "renewals", "store")

    def __init__(self, store: AsyncStore, clock: Clock, renewals: LoopRenewals) -> None:
        self.store = store
        self.clock = clock
        self.renewals = renewals
        self._background: set[asyncio.Task[Any]] = set()

    async def drive(self, flow: Generator[Effect, Any, T], run: AsyncRun | None = None) -> T:
        """Run ``flow`` to its end and return its outcome (or raise what it raised)."""
        store = self.store
        value: object = None
        error: BaseException | None = None
        while True:
            try:
                effect = flow.send(value) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            error = value = None
            try:
                if type(effect) is Claim:
                    value = await store.aclaim(effect.request)
                elif type(effect) is Complete:
                    value = await store.acomplete(effect.completion)
                elif type(effect) is Release:
                    value = await store.arelease(effect.key_hash, effect.owner)
                elif type(effect) is Run:
                    assert run is not None, "a flow yielded Run with nothing to run"
                    value = await run()
                elif type(effect) is StartLease:
                    self.renewals.start(effect)
                elif type(effect) is EndLease:
                    self.renewals.stop(effect.owner)
                elif type(effect) is Renew:
                    value = await store.arenew(
                        effect.key_hash, effect.owner, effect.lock_expires_at
                    )
                elif type(effect) is Sleep:
                    await self.clock.asleep(effect.seconds)
                elif type(effect) is Spawn:
                    task = asyncio.get_running_loop().create_task(self.drive(effect.flow))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                else:  # AwaitStreamEnd: an ASGI stream has ended when the app returns
                    raise TypeError(f"the async driver cannot interpret {effect!r}")
            except BaseException as raised:
                error = raised
