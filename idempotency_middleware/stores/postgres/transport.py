"""Runs ``PostgresStore``'s flows, each on one pooled autocommit connection, every statement
under a deadline. Sync: a ``psycopg_pool.ConnectionPool`` (a new one in a forked child);
async: a :class:`LoopPool` per event loop, since connections belong to the loop they were
made on. Imported only once psycopg is (``PostgresStore`` checks for it first)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout

from ..kit import Flow, LoopLocal, adrive, drive
from ..protocol import StoreUnavailable
from ..wakeups import Listen
from .errors import unavailable
from .ops import Answer, InTransaction, Statement

T = TypeVar("T")
Request = Statement | InTransaction

# A connection idle longer than this is closed rather than reused: firewalls and servers
# (idle_session_timeout) drop idle connections silently.
MAX_IDLE_SECONDS = 300.0


class LoopPool:
    """At most ``max_size`` connections to ``dsn``, made on demand, reused while idle.

    Not psycopg_pool's ``AsyncConnectionPool``: a worker task of it that ``asyncio.run()``
    cancels mid-attempt schedules another, so ``asyncio.run()`` never returns. Here nothing
    runs on the loop between calls, and a loop's connections close without it. Same
    interface as ``AsyncConnectionPool``, so a pool the user gives is driven the same way.
    """

    def __init__(self, dsn: str, kwargs: dict[str, Any], max_size: int) -> None:
        self._connect = partial(psycopg.AsyncConnection.connect, dsn, **kwargs)
        self._slots = asyncio.Semaphore(max_size)
        # Idle connections, each with the monotonic time it was given back.
        self._idle: deque[tuple[psycopg.AsyncConnection[Any], float]] = deque()
        self._drained_at = 0.0
        self._made_at: dict[int, float] = {}
        self.closed = False

    async def getconn(self, timeout: float) -> psycopg.AsyncConnection[Any]:
        """An idle connection, else a new one; ``PoolTimeout`` when none is free in time."""
        if self.closed:
            raise PoolClosed("the store's connection pool of this event loop is closed")
        if self._slots.locked():  # (else acquiring takes no wait: no timer, no task)
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout)
            # asyncio's own: before Python 3.11 not the builtin TimeoutError, which would let
            # a full pool's wait escape as an unclassified error (a 500, not a 503).
            except asyncio.TimeoutError:
                raise PoolTimeout(f"no free connection within {timeout:.2f} s") from None
        else:
            await self._slots.acquire()
        try:
            stale_before = time.monotonic() - MAX_IDLE_SECONDS
            while self._idle:
                connection, since = self._idle.pop()  # the most recently used one
                if since > stale_before:
                    return connection
                self._discard(connection)
            connection = await self._connect()
            self._made_at[id(connection)] = time.monotonic()
            return connection
        except BaseException:
            self._slots.release()
            raise

    async def putconn(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Take a connection back: kept when sound and idle, closed otherwise."""
        drained = self._made_at.get(id(connection), 0.0) <= self._drained_at
        if (
            self.closed
            or connection.broken
            or connection.closed
            or drained
            # (a call cancelled mid-statement leaves its connection busy: not reusable)
            or connection.info.transaction_status != TransactionStatus.IDLE
        ):
            self._discard(connection)
        else:
            self._idle.append((connection, time.monotonic()))
        self._slots.release()

    async def drain(self) -> None:
        """Close every idle connection, and those in use when they come back."""
        self._drained_at = time.monotonic()
        self.abandon(closed=self.closed)

    async def close(self) -> None:
        self.abandon()

    def abandon(self, closed: bool = True) -> None:
        """Close the idle connections (those in use when they come back), no I/O on the loop."""
        self.closed = closed
        while self._idle:
            self._discard(self._idle.pop()[0])

    def _discard(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._made_at.pop(id(connection), None)
        # libpq's own close: sends a Terminate on the socket and closes it, no loop needed.
        connection.pgconn.finish()


@dataclass(frozen=True)
class PostgresConfig:
    """Where the server is and how long to wait for it; the user's pools, never closed."""

    dsn: str
    where: str  # for messages: host:port/dbname, never the password
    table: str
    connect_kwargs: dict[str, Any]
    min_size: int
    max_size: int
    pool_timeout_seconds: float
    connect_timeout: float
    answer_within: float  # seconds: past them, a statement's connection is broken off
    pool: ConnectionPool[Any] | None = None
    async_pool: AsyncConnectionPool[Any] | None = None


def listener(config: PostgresConfig, channel: str) -> Listen:
    """The ``Listen`` of ``PostgresStore.wakeups``: ``LISTEN`` on a connection of its own
    (outside the pools: it is held for as long as the store is waited on)."""

    def listen(
        ready: Callable[[], None], changed: Callable[[str], None], stopping: threading.Event
    ) -> None:
        with psycopg.Connection.connect(config.dsn, **config.connect_kwargs) as connection:
            connection.execute(f'LISTEN "{channel}"')
            ready()
            # libpq's own reading, as psycopg's notifies() does, without its generator
            # (whose timeouts left some notifications to the waiters' polls).
            pgconn = connection.pgconn
            while not stopping.is_set():
                if select.select((pgconn.socket,), (), (), 0.5)[0]:
                    pgconn.consume_input()  # (raises when the connection is lost)
                    while (notification := pgconn.notifies()) is not None:
                        changed(notification.extra.decode())

    return listen


def _close_dropped(pool: ConnectionPool[Any]) -> None:
    """Close the sync pool of a store dropped without ``close()``, from a thread of its own.

    Left to the garbage collector, psycopg_pool's own ``__del__`` joins the pool's worker
    threads, from whichever thread dropped the last reference: when that is one of those
    workers (a store dropped while a worker was still adding a connection, holding the pool
    until it returned), "cannot join current thread". Closing it here first, holding it
    until closed, leaves that ``__del__`` nothing to do; from a thread of its own, since
    this finalizer may itself run on any thread, a worker's included.
    """
    with contextlib.suppress(RuntimeError):  # (no new thread at interpreter shutdown)
        threading.Thread(target=pool.close, name="idempotency-postgres-close").start()


class PostgresTransport:
    """Runs flows (``kit.Transport``). ``reachable``: whether the last call reached the server;
    until one does, a call waits no longer than a connection attempt, so an outage answers fast."""

    def __init__(self, config: PostgresConfig) -> None:
        self.config = config
        self.reachable = False
        self._pool = config.pool
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()
        # Closes the pool made here if the store is dropped unclosed (see _close_dropped).
        self._pool_finalizer: weakref.finalize[Any, Any] | None = None
        self.loop_pools: LoopLocal[LoopPool] = LoopLocal(
            self._new_loop_pool, LoopPool.close, LoopPool.abandon
        )

    def wait_seconds(self) -> float:
        timeout = self.config.pool_timeout_seconds
        return timeout if self.reachable else min(timeout, self.config.connect_timeout)

    @contextlib.contextmanager
    def _answering(self, operation: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as error:
            raise unavailable(operation, error, self.config.where, self.config.table) from error

    def pool(self) -> ConnectionPool[Any]:
        if self._pid != os.getpid():
            # Forked after the pool was made: its worker threads did not come along and its
            # connections are the parent's, so the child makes its own.
            self._pid = os.getpid()
            self._pool = self.config.pool
            self._pool_lock = threading.Lock()
            self._forget_pool()  # (the parent's, whose threads are not here to stop)
        pool = self._pool
        return pool if pool is not None else self._new_pool(None)

    def _new_pool(self, stuck: ConnectionPool[Any] | None) -> ConnectionPool[Any]:
        config = self.config
        with self._pool_lock:
            if self._pool is None or self._pool is stuck:
                self._pool = ConnectionPool(
                    config.dsn,
                    kwargs=config.connect_kwargs,
                    min_size=config.min_size,
                    max_size=config.max_size,
                    timeout=config.pool_timeout_seconds,
                    name=f"idempotency-{config.table}",
                    open=False,
                )
                self._pool.open(wait=False)
                self._forget_pool()
                self._pool_finalizer = weakref.finalize(self, _close_dropped, self._pool)
                self._pool_finalizer.atexit = False  # (at exit its daemon threads just stop)
            pool = self._pool
        if stuck is not None:
            threading.Thread(target=stuck.close, name="idempotency-postgres-close").start()
        return pool

    def _acquire(self, operation: str) -> tuple[ConnectionPool[Any], psycopg.Connection[Any]]:
        """A pool and one of its connections, or ``StoreUnavailable`` saying why none."""
        pool = self.pool()
        given = pool is self.config.pool
        if not self.reachable and not given:
            # Not known to answer (new store, or an outage): a connection attempt of our own
            # says at once why not; the pool's workers retry with backoff, taking the wait.
            failure = self._probe(operation)
            if failure is not None:
                raise failure
        with self._answering(operation):
            try:
                try:
                    return pool, pool.getconn(timeout=self.wait_seconds())
                except PoolClosed:
                    # close() ran meanwhile: the store reopens on use, as after any close().
                    pool = self.pool()
                    return pool, pool.getconn(timeout=self.wait_seconds())
            except PoolTimeout as error:
                if self.reachable or given:
                    raise  # every connection is busy
                failure = self._probe(operation)
                if failure is not None:  # (it went away since the first attempt)
                    raise failure from error
            # The server answers, but the pool is still waiting out its reconnection backoff
            # after an outage (up to minutes): a new pool serves at once.
            pool = self._new_pool(pool)
            return pool, pool.getconn(timeout=self.config.pool_timeout_seconds)

    def _probe(self, operation: str) -> StoreUnavailable | None:
        try:
            psycopg.connect(self.config.dsn, **self.config.connect_kwargs).close()
        except psycopg.Error as failure:
            return unavailable(operation, failure, self.config.where, self.config.table)
        return None

    def run(self, operation: str, flow: Flow[T]) -> T:
        pool, connection = self._acquire(operation)
        autocommit = connection.autocommit
        try:
            if not autocommit:  # a connection of a pool the user gave
                connection.autocommit = True
            result = drive(flow, partial(self._send, operation, connection))
        except StoreUnavailable:
            if connection.broken:
                # A failover broke them all: the idle ones are closed now, those in use
                # when they come back (this one), and new ones are made.
                self.reachable = False
                pool.drain()
            raise
        finally:
            # A broken connection is discarded by the pool (and replaced).
            if not autocommit and not connection.broken and not connection.closed:
                connection.autocommit = False
            pool.putconn(connection)
        self.reachable = True
        return result

    def _send(self, operation: str, connection: psycopg.Connection[Any], request: Request) -> Any:
        if isinstance(request, InTransaction):
            with self._answering(operation), connection.transaction():
                return drive(request.flow, partial(self._send, operation, connection))
        with self._answering(operation), WATCHDOG.watching(connection, self.config.answer_within):
            cursor = connection.execute(request.query, request.params, binary=True)
            rows = cursor.fetchall() if cursor.description is not None else []
        return Answer(rows, cursor.rowcount)

    def close(self) -> None:
        """Close the sync pool (reopened on use; the user's stays open) and closed loops'."""
        with self._pool_lock:
            pool, self._pool = self._pool, self.config.pool
            self._forget_pool()
        if pool is not None and pool is not self.config.pool:
            pool.close()
        self.loop_pools.release_closed_loops()

    def _forget_pool(self) -> None:
        """The pool is closed (or no longer ours) some other way: no finalizer for it."""
        if self._pool_finalizer is not None:
            self._pool_finalizer.detach()
            self._pool_finalizer = None

    async def _new_loop_pool(self) -> LoopPool:
        return LoopPool(self.config.dsn, self.config.connect_kwargs, self.config.max_size)

    async def arun(self, operation: str, flow: Flow[T]) -> T:
        given = self.config.async_pool
        pool = given if given is not None else await self.loop_pools.get()
        with self._answering(operation):
            # (A connection attempt's own error says why: refused, bad password ...)
            try:
                connection = await pool.getconn(timeout=self.wait_seconds())
            except PoolClosed:
                # aclose() ran meanwhile: the store reopens on use, as after any aclose().
                pool = given if given is not None else await self.loop_pools.get()
                connection = await pool.getconn(timeout=self.wait_seconds())
        autocommit = connection.autocommit
        try:
            if not autocommit:
                await connection.set_autocommit(True)
            result = await adrive(flow, partial(self._asend, operation, connection))
        except StoreUnavailable:
            if connection.broken:
                self.reachable = False
                await pool.drain()
            raise
        finally:
            if not autocommit and not connection.broken and not connection.closed:
                await connection.set_autocommit(False)
            await pool.putconn(connection)
        self.reachable = True
        return result

    async def _asend(
        self, operation: str, connection: psycopg.AsyncConnection[Any], request: Request
    ) -> Any:
        if isinstance(request, InTransaction):
            with self._answering(operation):
                async with connection.transaction():
                    return await adrive(request.flow, partial(self._asend, operation, connection))
        with self._answering(operation), WATCHDOG.watching(connection, self.config.answer_within):
            cursor = await connection.execute(request.query, request.params, binary=True)
            rows = await cursor.fetchall() if cursor.description is not None else []
        return Answer(rows, cursor.rowcount)

    async def aclose(self) -> None:
        await self.loop_pools.aclose()  # (the running loop's; one the user gave stays open)


# A hung server or a network dropping packets never answers (``statement_timeout`` is the
# server's): a watchdog thread shuts a statement's socket down past its deadline, the read
# fails at once (sync or asyncio), the pool drops the broken connection: ``timed_out``.

# How often the watchdog looks: a statement may outlive its deadline by this much.
CHECK_INTERVAL_SECONDS = 0.25


class Watchdog:
    """Shuts down the sockets of statements past their deadlines (arming: a dict insert)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, int]] = {}  # token: (deadline, socket fd)
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._last_token = -1  # the last statement's: none since the last look, no thread
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, connection: Any, seconds: float) -> Iterator[None]:
        """Run the block with ``connection``'s socket shut down after ``seconds``; the error
        the shutdown caused comes out as psycopg's ``ConnectionTimeout`` (``timed_out``)."""
        token = next(self._tokens)
        with self._lock:
            self._armed[token] = (time.monotonic() + seconds, connection.pgconn.socket)
            self._last_token = token
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-postgres-deadlines", daemon=True
                )
                self._thread.start()
        try:
            yield
        except Exception as error:
            if token in self._fired:  # (membership: atomic, no lock needed)
                raise psycopg.errors.ConnectionTimeout(
                    f"no answer within {seconds:.1f} s: the connection was broken off"
                ) from error
            raise
        finally:
            with self._lock:
                self._armed.pop(token, None)
                self._fired.discard(token)

    def _run(self) -> None:
        seen = -1
        while True:
            time.sleep(CHECK_INTERVAL_SECONDS)
            now = time.monotonic()
            with self._lock:
                if not self._armed and self._last_token == seen:
                    # No statement for a whole interval: end (the next one starts another),
                    # so a process whose stores are idle or closed keeps no thread for them.
                    self._thread = None
                    return
                seen = self._last_token
                late = [token for token, (deadline, _) in self._armed.items() if deadline <= now]
                # Shut down under the lock: the watched block cannot leave (its finally takes
                # the lock) and hand its connection back to be closed meanwhile. Outside it,
                # the descriptor could be closed and its number reused by a new connection,
                # which would then be the one shut down ("server closed the connection").
                for token in late:
                    fd = self._armed.pop(token)[1]
                    self._fired.add(token)
                    # shutdown() acts on the socket itself, so a duplicate of its descriptor
                    # reaches it without closing the descriptor psycopg still owns.
                    with contextlib.suppress(OSError), socket.socket(fileno=socket.dup(fd)) as dup:
                        dup.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()
