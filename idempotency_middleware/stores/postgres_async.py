"""The asyncio transport of ``PostgresStore``: one connection pool per event loop.

Connections belong to the loop they were made on, so a store used from several loops (two
servers on their own threads, a test's fresh loop, an ``asyncio.run(store.acreate_table())``
before the server starts) has one pool per loop (``postgres_loop_pool.LoopPool``), made on
first use there. A loop's pool is closed by ``aclose()`` on it, when ``asyncio.run`` (or any
runner calling ``loop.shutdown_asyncgens()``) ends the loop, or, for a loop closed without
either, when the store next meets a new loop: closing needs no loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from .postgres_deadline import WATCHDOG
from .postgres_loop_pool import LoopPool
from .postgres_sql import Answer, Flow

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from .postgres import PostgresStore

Pool: TypeAlias = "LoopPool | AsyncConnectionPool[Any]"

T = TypeVar("T")

logger = logging.getLogger(__name__)


class _LoopPool:
    """The pool of one event loop, and the watcher that closes it when the loop ends."""

    __slots__ = ("dropped", "loop", "pool", "watcher")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, pool: Pool) -> None:
        self.loop = loop
        self.pool = pool
        self.dropped = False  # closed, or given up with its loop
        self.watcher: AsyncGenerator[None, None] | None = None


class AsyncPools:
    """The async pools of one store, and the async transport that runs flows on them."""

    def __init__(self, store: PostgresStore, given: AsyncConnectionPool[Any] | None) -> None:
        self._store = store
        # A pool the user gave is used as it is (on its own loop), never closed here.
        self._given = _LoopPool(None, given) if given is not None else None
        self._loops: dict[asyncio.AbstractEventLoop, _LoopPool] = {}
        self._lock = threading.Lock()  # the loops may run on several threads
        # The last loop's pool: the usual single loop costs one comparison per call.
        self._current: _LoopPool | None = None

    async def _pool(self) -> _LoopPool:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        current = self._current
        if current is not None and current.loop is loop:
            return current
        with self._lock:
            entry = self._loops.get(loop)
            if entry is None:
                store = self._store
                pool = LoopPool(store.dsn, store.connect_kwargs, store.max_size)
                entry = self._loops[loop] = _LoopPool(loop, pool)
            self._current = entry
        self.release_closed_loops()
        if entry.watcher is None:
            watcher = self._until_loop_ends(entry)
            entry.watcher = watcher
            await watcher.__anext__()  # runs to its yield at once
        return entry

    async def _until_loop_ends(self, entry: _LoopPool) -> AsyncGenerator[None, None]:
        # An async generator left suspended for the loop's lifetime: the loop closes it
        # before it closes (shutdown_asyncgens), the last moment the pool can be closed on
        # it. asyncio has no other hook for a loop's end.
        try:
            yield
        finally:
            if not entry.dropped:
                entry.dropped = True
                self._forget(entry)
                await entry.pool.close()

    def _forget(self, entry: _LoopPool) -> None:
        with self._lock:
            if entry.loop is not None and self._loops.get(entry.loop) is entry:
                del self._loops[entry.loop]
            if self._current is entry:
                self._current = None

    def release_closed_loops(self) -> None:
        """Let go of the pools of loops closed without closing them: nothing can run on
        those loops any more, but their connections can still be closed without I/O."""
        with self._lock:
            ended = [(loop, entry) for loop, entry in self._loops.items() if loop.is_closed()]
            for loop, _ in ended:
                del self._loops[loop]
        for _, entry in ended:
            entry.dropped = True
            if isinstance(entry.pool, LoopPool):
                entry.pool.closed = True
                entry.pool.close_idle()
            if entry.watcher is not None:
                _finish_without_loop(entry.watcher)

    async def close_current(self) -> None:
        """Close the running loop's pool (and release those of loops already closed)."""
        with self._lock:
            entry = self._loops.get(asyncio.get_running_loop())
        self.release_closed_loops()
        if entry is None or entry.dropped:
            return
        entry.dropped = True
        self._forget(entry)
        try:
            await entry.pool.close()
        finally:
            if entry.watcher is not None:
                await entry.watcher.aclose()  # ends at once: its pool is closed

    async def run(
        self, operation: str, flow: Flow[T], purge: Flow[int] | None = None, begin: bool = False
    ) -> T:
        """Run ``flow`` on a connection of the running loop's pool (in a transaction when
        ``begin``), then the piggybacked ``purge``; failures become ``StoreUnavailable``."""
        import psycopg

        store = self._store
        entry = await self._pool()
        pool, connection = await self._acquire(entry, operation)
        autocommit = connection.autocommit
        try:
            if not autocommit:  # a connection of a pool the user gave
                await connection.set_autocommit(True)
            if begin:
                async with connection.transaction():
                    result = await drive_async(connection, flow, store.answer_within)
            else:
                result = await drive_async(connection, flow, store.answer_within)
            if purge is not None:
                await self._piggyback(connection, purge)
        except psycopg.Error as error:
            broken = connection.broken
            await _give_back(pool, connection, autocommit)
            if broken:
                store.reachable = False
                await self._drain(pool)
            raise store.outage(operation, error) from error
        except BaseException:
            await _give_back(pool, connection, autocommit)
            raise
        await _give_back(pool, connection, autocommit)
        store.succeeded()
        return result

    async def _piggyback(self, connection: psycopg.AsyncConnection[Any], purge: Flow[int]) -> None:
        import psycopg

        try:
            self._store.purged(await drive_async(connection, purge, self._store.answer_within))
        except psycopg.Error as error:
            logger.debug("PostgreSQL purge of expired idempotency records failed: %s", error)

    async def _acquire(
        self, entry: _LoopPool, operation: str
    ) -> tuple[Pool, psycopg.AsyncConnection[Any]]:
        """A pool and one of its connections, or ``StoreUnavailable`` saying why none."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout, TooManyRequests

        store = self._store
        pool = entry.pool
        try:
            try:
                return pool, await pool.getconn(timeout=store.wait_seconds())
            except PoolClosed:
                # aclose() ran meanwhile: the store reopens on use, as after any aclose().
                pool = (await self._pool()).pool
                return pool, await pool.getconn(timeout=store.wait_seconds())
        except (PoolTimeout, TooManyRequests, PoolClosed, psycopg.Error) as error:
            # (A connection attempt's own error says why: refused, bad password ...)
            raise store.outage(operation, error) from error

    @staticmethod
    async def _drain(pool: Pool) -> None:
        """See ``PostgresStore._drain``."""
        drain = getattr(pool, "drain", None)
        if drain is not None:
            await drain()
        else:  # pragma: no cover (psycopg_pool < 3.3)
            await pool.check()  # type: ignore[union-attr]


async def _give_back(pool: Pool, connection: Any, autocommit: bool) -> None:
    # A broken connection is discarded by the pool (and replaced).
    if not autocommit and not connection.broken and not connection.closed:
        await connection.set_autocommit(False)
    await pool.putconn(connection)


async def drive_async(
    connection: psycopg.AsyncConnection[Any], flow: Flow[T], answer_within: float
) -> T:
    """Run ``flow``'s statements on ``connection``, each answered within
    ``answer_within`` seconds or its connection broken (``ConnectionTimeout``); its result."""
    try:
        statement = next(flow)
        while True:
            with WATCHDOG.watching(connection, answer_within):
                cursor = await connection.execute(statement.query, statement.params, binary=True)
                rows = await cursor.fetchall() if cursor.description is not None else []
            statement = flow.send(Answer(rows, cursor.rowcount))
    except StopIteration as stop:
        result: T = stop.value
        return result


def _finish_without_loop(watcher: AsyncGenerator[None, None]) -> None:
    """Close a suspended watcher whose loop is closed: its ``finally`` has nothing left to
    await (its pool is marked dropped), so stepping the closing coroutine ends it."""
    closing = watcher.aclose()
    try:
        closing.send(None)
    except StopIteration:
        return
    except Exception as error:
        logger.debug("closing the pool watcher of a closed event loop failed: %r", error)
    closing.close()
