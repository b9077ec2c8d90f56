"""A small asyncio connection pool with no background tasks, one per event loop.

Not psycopg_pool's ``AsyncConnectionPool``: it connects in worker tasks, and a worker that
``asyncio.run()`` cancels mid-attempt takes it for a failed attempt and schedules another,
so ``asyncio.run()`` never returns. Here the call that needs a connection makes it, nothing
runs on the loop between calls, and a loop's connections close without it (no I/O). It offers
what the store uses of ``AsyncConnectionPool``, so a pool the user gives is driven the same.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

# A connection idle longer than this is closed rather than reused: firewalls and servers
# (idle_session_timeout) drop idle connections silently.
MAX_IDLE_SECONDS = 300.0


class LoopPool:
    """At most ``max_size`` connections to ``dsn``, made on demand, reused while idle."""

    def __init__(self, dsn: str, kwargs: dict[str, Any], max_size: int) -> None:
        self._dsn = dsn
        self._kwargs = kwargs
        self._slots = asyncio.Semaphore(max_size)
        # Idle connections, each with the monotonic time it was given back.
        self._idle: deque[tuple[psycopg.AsyncConnection[Any], float]] = deque()
        self._drained_at = 0.0
        self._made_at: dict[int, float] = {}
        self.closed = False

    async def getconn(self, timeout: float) -> psycopg.AsyncConnection[Any]:
        """A connection (idle, else new); ``PoolTimeout`` when none is free in ``timeout``
        seconds; a connection attempt's error as it is."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        if self.closed:
            raise PoolClosed("the store's connection pool of this event loop is closed")
        if self._slots.locked():  # (else acquiring takes no wait: no timer, no task)
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout)
            except TimeoutError:
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
            connection = await psycopg.AsyncConnection.connect(self._dsn, **self._kwargs)
            self._made_at[id(connection)] = time.monotonic()
            return connection
        except BaseException:
            self._slots.release()
            raise

    async def putconn(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Take a connection back: kept when sound and idle, closed otherwise."""
        from psycopg.pq import TransactionStatus

        made_at = self._made_at.get(id(connection), 0.0)
        if (
            self.closed
            or connection.broken
            or connection.closed
            or made_at <= self._drained_at
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
        """Close the idle connections; those in use are closed when they come back."""
        self.abandon()

    def abandon(self, closed: bool = True) -> None:
        """:meth:`close`, without I/O on the loop (it may be closed)."""
        self.closed = closed
        while self._idle:
            self._discard(self._idle.pop()[0])

    def _discard(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._made_at.pop(id(connection), None)
        # libpq's own close: sends a Terminate on the socket and closes it, no loop needed.
        connection.pgconn.finish()
