"""A clock shared across processes: the real time plus an offset kept in a file.

A server started as a subprocess takes ``FileClock(path)`` as its middleware's ``clock=``;
the test that started it moves that server's time forward with ``FileClock(path).advance(s)``
(past a dead owner's lock, say) without sleeping. Sleeps are real: only ``now`` moves.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path


class FileClock:
    """``now()`` is ``time.time()`` plus the offset (seconds) written in ``path``; a missing
    or empty file means no offset. Read on every call, so every process sharing the file sees
    an ``advance`` at its next ``now``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def offset(self) -> float:
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0.0
        return float(text) if text else 0.0

    def now(self) -> float:
        return time.time() + self.offset()

    def advance(self, seconds: float) -> float:
        """Move every sharing process's time forward; the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        # Written beside and renamed over the file: a reader never sees a half-written number.
        staging = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        staging.write_text(repr(self.offset() + seconds), encoding="ascii")
        os.replace(staging, self.path)
        return self.now()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
