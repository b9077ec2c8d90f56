"""Time as an input: the engine, the lease renewers and the stores read ``now`` from one
clock object, so tests cross lock and TTL deadlines by moving a fake clock instead of
sleeping. (Renewals are due by this clock; the ASGI renewer's timer that looks for due
leases runs on the event loop's own time, so a test drives ``renewal.Leases`` directly.)

Times are epoch seconds (floats with sub-second precision): they are written to the store
and compared there by other processes, so they must be wall-clock time, not monotonic.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

# How far apart two hosts' clocks may be: a stale in-progress claim is taken over only once
# its lock expired at least this long ago by the claimer's clock.
DEFAULT_CLOCK_SKEW_SECONDS = 1.0


@runtime_checkable
class Clock(Protocol):
    """Where the engine and the stores get the time, and how they wait."""

    def now(self) -> float:
        """Epoch seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds``."""
        ...


class SystemClock:
    """The real time: ``time.time`` and real sleeps."""

    __slots__ = ()

    # The builtin itself, not a method wrapping it: read on every request, so no Python frame.
    now = staticmethod(time.time)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
