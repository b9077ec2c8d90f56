"""SQLiteStore's transport: a flow runs on one pooled connection, sync, or awaited.

An awaited flow first runs *inline*, on the loop's thread, on a connection whose busy
timeout is zero (with WAL and ``synchronous=NORMAL`` a write is a few page-cache writes, no
fsync: cheaper than a hand-off to a thread, which cost half a new key). From a statement
that would wait for a lock (``SQLITE_BUSY`` at once), or ``OFF_LOOP``, it goes on on the
store's threads. Inline connections are never opened on the loop, nor checkpoint there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast
from urllib.parse import quote

from ..kit import Flow
from ..protocol import StoreUnavailable
from ..threaded import WorkerThreads
from .errors import is_busy, is_unavailable, refused, unavailable
from .ops import OFF_LOOP, PURGE, Later, Reply, Statement, Steps

T = TypeVar("T")
logger = logging.getLogger(__package__)

# Inline flows between two checkpoints (SQLite's own auto-checkpoint: about 1000 pages,
# several hundred small writes).
CHECKPOINT_EVERY = 256
CHECK = "check"
_NOT_WAL = "SQLite database %s is in %s journal mode, not WAL: writers will block readers"


@dataclass(frozen=True)
class Settings:
    path: str
    busy_timeout_seconds: float
    synchronous: str
    max_idle_connections: int
    async_threads: int
    inline: bool  # awaited flows run on the loop first


def close_quietly(connection: sqlite3.Connection) -> None:
    with suppress(sqlite3.Error):
        connection.close()


def rolled_back(connection: sqlite3.Connection) -> bool:
    """Leave no transaction open on ``connection``; whether that worked."""
    try:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
    except sqlite3.Error:
        return False
    return True


def _wal_checkpoint() -> Steps[tuple[int, int, int]]:
    busy, frames, copied = (yield Statement("PRAGMA wal_checkpoint(PASSIVE)")).rows[0]
    return busy, frames, copied


Opener = Callable[[], sqlite3.Connection]
Closer = Callable[[sqlite3.Connection], None]


class ConnectionPool:
    """Idle connections, each lent to one thread at a time (sqlite3's rule), so that a WSGI
    server's thread per request and the store's threads reuse them instead of reconnecting."""

    def __init__(self, connect: Opener, max_idle: int, discard: Closer = close_quietly) -> None:
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
        self._after_fork()
        with self._lock:
            if self._idle:
                return self._idle.pop(), self._generation
        return None

    def take(self) -> tuple[sqlite3.Connection, int]:
        generation = self._generation  # (closed meanwhile: discarded when given back)
        return self.take_idle() or (self._connect(), generation)

    def give_back(
        self, connection: sqlite3.Connection, generation: int, error: BaseException | None = None
    ) -> None:
        """Keep ``connection``; after ``error`` only when that was another worker's lock (or
        no SQLite error) and it rolled back, not whatever else failed (a broken file handle)."""
        if error is not None and not (
            (is_busy(error) or not isinstance(error, sqlite3.Error)) and rolled_back(connection)
        ):
            self._discard(connection)
            return
        with self._lock:
            kept = generation == self._generation and self._pid == os.getpid()
            if kept and len(self._idle) < self._max_idle:
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


class SQLiteTransport:
    """Flows on pooled connections or inline; SQLite's outages become StoreUnavailable."""

    def __init__(self, settings: Settings, schema: tuple[str, ...]) -> None:
        self._settings = settings
        self._schema = schema  # made on the process's first connection
        self._inline = settings.inline
        self._pool = ConnectionPool(self._open, settings.max_idle_connections)
        self._inline_pool = ConnectionPool(
            self._open_inline, settings.max_idle_connections, discard=self._close_off_the_loop
        )
        self._threads = WorkerThreads(settings.async_threads, "idempotency-sqlite")
        self._inline_flows = 0
        self._wal_restart_due = False
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    def _open(self) -> sqlite3.Connection:
        path, busy_timeout = self._settings.path, self._settings.busy_timeout_seconds
        connection = sqlite3.connect(
            path,
            timeout=busy_timeout,
            isolation_level=None,  # autocommit; transactions are explicit (BEGIN IMMEDIATE)
            check_same_thread=False,  # the pool hands a connection to one thread at a time
        )
        try:
            # Switching a new file to WAL takes an exclusive lock that the busy handler may
            # not wait for when several workers start at once: retry within the busy timeout
            # (in real time, not the store's clock: this waits on another process's lock).
            deadline = time.monotonic() + busy_timeout
            while True:
                try:
                    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    break
                except sqlite3.OperationalError as error:
                    if not is_busy(error) or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.01)
            if str(mode).lower() != "wal":
                self._inline = False  # a commit outside WAL writes and syncs a journal
                logger.warning(_NOT_WAL, path, mode)
            connection.execute(f"PRAGMA synchronous = {self._settings.synchronous}")
            with self._schema_lock:
                if not self._schema_ready:
                    for statement in self._schema:
                        connection.execute(statement)
                    self._schema_ready = True
        except BaseException:
            close_quietly(connection)
            raise
        return connection

    def _open_inline(self) -> sqlite3.Connection:
        connection = self._open()
        connection.execute("PRAGMA busy_timeout = 0")
        connection.execute("PRAGMA wal_autocheckpoint = 0")
        return connection

    def _raise(self, operation: str, error: sqlite3.Error) -> NoReturn:
        if is_unavailable(error):
            raise unavailable(operation, error, self._settings.path) from error
        raise error  # no outage (a foreign table under the store's name, say): as it is

    def run(self, operation: str, flow: Flow[T], request: Any = None) -> T:
        """Run ``flow`` on a pooled connection (from ``request``: where an inline run stopped)."""
        if operation == CHECK:
            return self._check(flow)
        try:
            connection, generation = self._pool.take()
            try:
                result: T = self._steps(connection, flow, request, inline=False)[1]
            except BaseException as error:
                self._pool.give_back(connection, generation, error)
                raise
        except sqlite3.Error as error:
            self._raise(operation, error)
        self._pool.give_back(connection, generation)
        return result

    def _steps(
        self, connection: sqlite3.Connection, flow: Flow[Any], request: Any, inline: bool
    ) -> tuple[bool, Any]:
        """``(True, result)``; inline, ``(False, request)``: the rest, from it, is for a thread."""
        try:
            if request is None:  # (not asked for yet)
                request = next(flow)
            while True:
                in_transaction = connection.in_transaction
                try:
                    reply: Reply | None = None
                    if request is OFF_LOOP:
                        if inline:
                            return False, request
                    elif isinstance(request, Later):
                        if inline:  # not on the loop: the batch may wait for a lock a little
                            self._in_background(self._quietly, PURGE, request.flow)
                        else:
                            self._steps(connection, request.flow, None, inline=False)
                    else:
                        cursor = connection.execute(request.sql, request.params)
                        reply = Reply(cursor.fetchall(), cursor.rowcount)
                except Exception as error:
                    # Inline, another worker's lock met before this flow wrote anything:
                    # nothing to undo, and a thread waits for it.
                    if inline and is_busy(error) and not in_transaction and rolled_back(connection):
                        return False, request
                    request = flow.throw(error)
                else:
                    request = flow.send(reply)
        except StopIteration as done:
            return True, done.value

    def _check(self, flow: Flow[T]) -> T:
        """Check the file as it is, never creating it: its directory exists, it (or, before
        the first use makes it, its directory) is writable, and it opens as a database."""
        path = self._settings.path
        folder = os.path.dirname(os.path.abspath(path))
        exists = os.path.exists(path)
        if not os.path.isdir(folder):
            raise refused("cannot_open", f"directory {folder!r} (of {path!r}) does not exist")
        # (The directory too: SQLite writes its WAL and shared-memory files beside the file.)
        for target in (path, folder) if exists else (folder,):
            if not os.access(target, os.W_OK):
                raise refused("access_denied", f"{target!r} is not writable by this process")
        if not exists:
            flow.close()
            return None  # type: ignore[return-value]  # (check flows return None)
        try:
            connection = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=0)
            try:
                result: T = self._steps(connection, flow, None, inline=False)[1]
            finally:
                close_quietly(connection)
        except sqlite3.Error as error:
            self._raise(CHECK, error)
        return result

    async def arun(self, operation: str, flow: Flow[T]) -> T:
        """Run ``flow`` inline as long as it need not wait for a lock; the rest on a thread."""
        if operation == CHECK:
            return await self._threads.run(self._check, flow)
        if not self._inline or (self._wal_restart_due and operation != "get"):
            # (The first write after a checkpoint restarts the WAL, syncing its header.)
            self._wal_restart_due = False
            return await self._threads.run(self.run, operation, flow)
        taken = self._inline_pool.take_idle()
        if taken is None:
            # Opening a connection is file I/O: this flow runs on a thread, and leaves an
            # inline connection for the next ones.
            return await self._threads.run(self._run_then_open_inline, operation, flow)
        connection, generation = taken
        try:
            done, outcome = self._steps(connection, flow, None, inline=True)
        except BaseException as error:
            self._inline_pool.give_back(connection, generation, error)
            if isinstance(error, sqlite3.Error):
                self._raise(operation, error)
            raise
        self._inline_pool.give_back(connection, generation)
        if not done:
            return await self._threads.run(self.run, operation, flow, outcome)
        self._inline_flows += 1
        if self._inline_flows >= CHECKPOINT_EVERY:
            self._inline_flows = 0
            self._in_background(self._checkpoint)
        return cast(T, outcome)

    def _run_then_open_inline(self, operation: str, flow: Flow[T]) -> T:
        result = self.run(operation, flow)
        with suppress(sqlite3.Error):  # else the next flow tries again
            self._inline_pool.give_back(*self._inline_pool.take())
        return result

    def _in_background(self, call: Callable[..., object], *args: Any) -> bool:
        """Whether ``call(*args)`` was handed to the store's threads (not waited for: what it
        rides on has happened, a store closing meanwhile must not fail it)."""
        try:
            self._threads.pool().submit(call, *args)
        except RuntimeError as error:  # the pool shut down (close(), interpreter exit)
            logger.debug("SQLite store: background %s not run: %s", call.__name__, error)
            return False
        return True

    def _quietly(self, operation: str, flow: Flow[T]) -> T | None:
        try:
            return self.run(operation, flow)
        except StoreUnavailable as error:
            logger.debug("SQLite %s skipped: %s", operation, error)
            return None

    def _close_off_the_loop(self, connection: sqlite3.Connection) -> None:
        # Closing the last connection to a file checkpoints it, with fsyncs.
        if not self._in_background(close_quietly, connection):
            close_quietly(connection)

    def _checkpoint(self) -> None:
        """SQLite's auto-checkpoint, which inline connections leave to this: waiting for no one."""
        done = self._quietly("checkpoint", _wal_checkpoint())
        if done is not None and 0 < done[1] == done[2]:  # copied whole
            self._wal_restart_due = True

    def close(self) -> None:
        self._threads.close()
        self._pool.close()
        self._inline_pool.close()

    async def aclose(self) -> None:
        # Not on the store's own threads: close() waits for them to stop.
        await asyncio.to_thread(self.close)
