"""Test helpers for code that uses idempotency_middleware: a clock that tests move by hand.

``FakeClock`` goes into every ``clock=`` option (middlewares, stores, ``idempotent``), so a
test crosses a lock timeout or a TTL with ``clock.advance(61)`` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading


class FakeClock:
    """A clock that only moves when told to; its sleeps advance it at once.

    Safe to share across threads. ``asleep`` yields to the event loop once, so other tasks
    run as they would during a real sleep.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self.slept: list[float] = []  # every sleep asked for, in order

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward; the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._now += seconds
            return self._now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(max(seconds, 0.0))

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)
