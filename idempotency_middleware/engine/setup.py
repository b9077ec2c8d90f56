"""What a door builds once to run its attempts, sync or async: the attempt context (events,
replay cache, encryption), the lease renewals and the driver that interprets the flow.

Every door builds it here (the ASGI, WSGI and Django middlewares, ``idempotent`` functions
and consumers), so the three parts are put together one way: the renewals report to the
context's events and read its clock, and the driver renews through them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..events import DoorKind
from ..policy.options import Options
from ..stores.protocol import AsyncStore, SyncStore
from . import flow
from .decisions import Attempt
from .drivers import AsyncDriver, AsyncRun, AsyncWaiter, Suspended, SyncDriver, SyncRun
from .effects import StreamEnd
from .flow import AttemptFlow, Context, Ending
from .renewal import LoopRenewals, ThreadRenewals

if TYPE_CHECKING:
    from typing_extensions import Self

StoreT = TypeVar("StoreT", SyncStore, AsyncStore)

# How a door tells a suspended attempt that its live stream ended: bytes sent, and whether
# it failed midway (or did not send the body its headers declared).
FinishStream = Callable[[int, bool], None]


class LiveStream(Exception):
    """Raised by ``SyncSetup.drive`` when the handler's response goes out live: the door
    sends it as it comes and calls ``finish(size, failed)`` once it ended, which finishes
    the attempt (completes or releases the key)."""

    def __init__(self, finish: FinishStream) -> None:
        super().__init__("the response goes out live; the attempt finishes when it ends")
        self.finish = finish


class _Setup(Generic[StoreT]):
    """What both setups are: a context over a store, built from a door's options."""

    __slots__ = ("context", "new_owner", "now")

    def __init__(self, context: Context, store: StoreT) -> None:
        self.context = context
        # Read once per attempt (its claim's time and owner token): bound here.
        self.now = context.clock.now
        self.new_owner = context.entropy.owner

    @classmethod
    def for_options(
        cls,
        options: Options,
        store: StoreT,
        *,
        http: bool = True,
        sealed_only: bool = False,
        door: DoorKind | None = None,
    ) -> Self:
        """The setup of a door with ``options`` over ``store`` (``Context.for_options``)."""
        context = Context.for_options(options, store, http=http, sealed_only=sealed_only, door=door)
        return cls(context, store)


class SyncSetup(_Setup[SyncStore]):
    """A sync door's attempts (WSGI, Django, plain functions): run on the calling thread,
    their leases renewed by the process's renewer thread."""

    __slots__ = ("driver", "renewals")

    def __init__(self, context: Context, store: SyncStore) -> None:
        super().__init__(context, store)
        self.renewals = ThreadRenewals(store, context.reporter, context.clock)
        self.driver = SyncDriver(store, context.clock, self.renewals)

    def drive(self, attempt: Attempt, run: SyncRun) -> Ending:
        """Run the attempt to its ending, calling ``run`` if it is claimed. ``LiveStream``
        when ``run`` answered a live stream: the attempt waits for its ``finish``."""
        running = flow.attempt(self.context, attempt)
        try:
            return self.driver.drive(running, run)
        except Suspended:
            raise LiveStream(partial(self._finish_stream, running)) from None

    def _finish_stream(self, running: AttemptFlow, size: int, failed: bool) -> None:
        self.driver.resume(running, StreamEnd(size, failed))

    def close(self) -> None:
        """Stop renewing this door's leases (the renewer thread ends if no other door has
        one): for tidy shutdowns and tests."""
        self.renewals.close()


class AsyncSetup(_Setup[AsyncStore]):
    """An async door's attempts (ASGI, coroutine functions): run on the running event loop,
    their leases renewed from a timer on that loop."""

    __slots__ = ("driver", "renewals")

    def __init__(self, context: Context, store: AsyncStore) -> None:
        super().__init__(context, store)
        self.renewals = LoopRenewals(store, context.reporter, context.clock)
        self.driver = AsyncDriver(store, context.clock, self.renewals)

    def drive(
        self, attempt: Attempt, run: AsyncRun, wait: AsyncWaiter | None = None
    ) -> Coroutine[Any, Any, Ending]:
        """Run the attempt to its ending, awaiting ``run`` if it is claimed; ``wait`` pauses
        a waiting duplicate (default: a sleep on the clock). (The driver's coroutine itself,
        not one awaiting it: one frame less on every new key.)"""
        return self.driver.drive(flow.attempt(self.context, attempt), run, wait)


__all__ = ["AsyncSetup", "FinishStream", "LiveStream", "SyncSetup"]
