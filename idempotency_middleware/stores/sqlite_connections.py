"""SQLiteStore's connections: a pool of them, and running a call on the event loop itself.

An async call on SQLiteStore first runs *inline*, on the event loop's thread, on a
connection whose busy timeout is zero: with WAL and ``synchronous=NORMAL`` a claim or a
completion is a few page-cache writes and no fsync, cheaper than the hand-off to a worker
thread and back (which cost about half of a new key). When the call would have to wait
(another worker holds the write lock: ``SQLITE_BUSY`` at once, the call changed nothing),
it runs again on the store's thread pool, which waits up to the busy timeout without
holding up the loop. What an inline connection never does on the loop: open itself (its
thread does), or checkpoint the WAL (``wal_autocheckpoint = 0``; the store checkpoints
on its threads every ``CHECKPOINT_EVERY`` inline calls).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import suppress
from contextvars import ContextVar

# The inline connection of the call running on this event loop (None: not inline).
INLINE: ContextVar[sqlite3.Connection | None] = ContextVar("sqlite_inline", default=None)

# Inline calls between two checkpoints (SQLite's own auto-checkpoint: about 1000 pages,
# several hundred small writes).
CHECKPOINT_EVERY = 256

# A completion with a larger body is written from a worker thread: copying megabytes into
# the page cache is not a thing to do on the loop.
INLINE_MAX_BODY_BYTES = 64 * 1024


class WouldWait(Exception):
    """An inline call met another worker's lock: it changed nothing; run it on a thread."""


def close_quietly(connection: sqlite3.Connection) -> None:
    with suppress(sqlite3.Error):
        connection.close()


class ConnectionPool:
    """A lock-protected stack of idle connections, each used by one thread at a time.

    sqlite3 connections must not be used by two threads at once; handing them out one
    thread at a time (``check_same_thread=False``) lets a WSGI server that starts a thread
    per request, and the async methods' worker threads, reuse them instead of reconnecting.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        max_idle: int,
        discard: Callable[[sqlite3.Connection], None] = close_quietly,
    ) -> None:
        self._connect = connect
        self._discard = discard  # closes a connection given back that is not kept
        self._max_idle = max_idle
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._generation = 0
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        # A connection must never cross fork() (SQLite's own rule): the child drops the
        # parent's connections without closing them, which could disturb the parent's locks.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            _leaked_across_fork.extend(self._idle)
            self._idle = []
            self._generation += 1

    def take_idle(self) -> tuple[sqlite3.Connection, int] | None:
        """An idle connection, never a new one (opening one is file I/O)."""
        self._after_fork()
        with self._lock:
            if self._idle:
                return self._idle.pop(), self._generation
        return None

    def acquire(self) -> tuple[sqlite3.Connection, int]:
        self._after_fork()
        with self._lock:
            generation = self._generation
            if self._idle:
                return self._idle.pop(), generation
        return self._connect(), generation

    def give_back(self, connection: sqlite3.Connection, generation: int) -> None:
        with self._lock:
            if (
                generation == self._generation
                and self._pid == os.getpid()
                and len(self._idle) < self._max_idle
            ):
                self._idle.append(connection)
                return
        self._discard(connection)

    def close(self) -> None:
        """Close the idle connections; those in use are closed when they come back."""
        self._after_fork()
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for connection in idle:
            close_quietly(connection)


# Kept referenced so the garbage collector never closes them in a forked child.
_leaked_across_fork: list[sqlite3.Connection] = []
