"""The sync transport of ``PostgresStore``: a ``psycopg_pool.ConnectionPool``, opened on
first use (again in a forked child), and the driver that runs a flow's statements on it."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from .postgres_deadline import WATCHDOG
from .postgres_sql import Answer, Flow

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

    from .postgres import PostgresStore

T = TypeVar("T")

logger = logging.getLogger(__name__)


class SyncPools:
    """The store's sync pool (its own, or one the user gave)."""

    def __init__(self, store: PostgresStore, given: ConnectionPool[Any] | None) -> None:
        self._store = store
        self._given_pool = given
        self._pool: ConnectionPool[Any] | None = given
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()

    def pool(self) -> ConnectionPool[Any]:
        if self._pid != os.getpid():
            # Forked after the pool was made: its worker threads did not come along and its
            # connections are the parent's, so the child makes its own.
            self._pid = os.getpid()
            self._pool = self._given_pool
            self._pool_lock = threading.Lock()
        pool = self._pool
        if pool is not None:
            return pool
        return self._new_pool(None)

    def _new_pool(self, stuck: ConnectionPool[Any] | None) -> ConnectionPool[Any]:
        """Open the sync pool, or replace ``stuck`` (closed in the background)."""
        from psycopg_pool import ConnectionPool

        with self._pool_lock:
            if self._pool is None or self._pool is stuck:
                new: ConnectionPool[Any] = ConnectionPool(
                    self._store.dsn,
                    kwargs=self._store.connect_kwargs,
                    min_size=self._store.min_size,
                    max_size=self._store.max_size,
                    timeout=self._store.pool_timeout_seconds,
                    name=f"idempotency-{self._store.table}",
                    open=False,
                )
                new.open(wait=False)
                self._pool = new
            pool = self._pool
        if stuck is not None:
            threading.Thread(target=stuck.close, name="idempotency-postgres-close").start()
        return pool

    def _acquire(self, operation: str) -> tuple[ConnectionPool[Any], psycopg.Connection[Any]]:
        """A pool and one of its connections, or ``StoreUnavailable`` saying why none."""
        from psycopg_pool import PoolClosed, PoolTimeout, TooManyRequests

        pool = self.pool()
        if not self._store.reachable and pool is not self._given_pool:
            # The server is not known to answer (a new store, or after an outage): a
            # connection attempt of our own says at once why not, where waiting for the
            # pool's workers would take the whole wait (they retry with backoff).
            failure = self._probe()
            if failure is not None:
                raise self._store.outage(operation, failure)
        try:
            try:
                return pool, pool.getconn(timeout=self._store.wait_seconds())
            except PoolClosed:
                # close() ran meanwhile: the store reopens on use, as after any close().
                pool = self.pool()
                return pool, pool.getconn(timeout=self._store.wait_seconds())
        except (TooManyRequests, PoolClosed) as error:
            raise self._store.outage(operation, error) from error
        except PoolTimeout as error:
            if self._store.reachable or pool is self._given_pool:
                raise self._store.outage(operation, error) from error  # every connection is busy
            failure = self._probe()
            if failure is not None:  # (it went away since the first attempt)
                raise self._store.outage(operation, failure) from error
        # The server answers, but the pool is still waiting out its reconnection backoff
        # after an outage (up to minutes): a new pool serves at once.
        pool = self._new_pool(pool)
        try:
            return pool, pool.getconn(timeout=self._store.pool_timeout_seconds)
        except (PoolTimeout, TooManyRequests) as error:
            raise self._store.outage(operation, error) from error

    @contextmanager
    def _connection(self, operation: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection; failures become ``StoreUnavailable``."""
        import psycopg

        pool, connection = self._acquire(operation)
        autocommit = connection.autocommit
        try:
            if not autocommit:  # a connection of a pool the user gave
                connection.autocommit = True
            yield connection
        except psycopg.Error as error:
            broken = connection.broken
            self._give_back(pool, connection, autocommit)
            if broken:
                self._store.reachable = False
                self._drain(pool)
            raise self._store.outage(operation, error) from error
        except BaseException:
            self._give_back(pool, connection, autocommit)
            raise
        self._give_back(pool, connection, autocommit)
        self._store.succeeded()

    @staticmethod
    def _give_back(pool: ConnectionPool[Any], connection: Any, autocommit: bool) -> None:
        # A broken connection is discarded by the pool (and replaced).
        if not autocommit and not connection.broken and not connection.closed:
            connection.autocommit = False
        pool.putconn(connection)

    def _probe(self) -> BaseException | None:
        """Why the pool gave no connection while the server was not known reachable: the
        error of a connection attempt of its own, or ``None`` when that one succeeds."""
        import psycopg

        try:
            psycopg.connect(self._store.dsn, **self._store.connect_kwargs).close()
        except psycopg.Error as failure:
            return failure
        return None

    @staticmethod
    def _drain(pool: ConnectionPool[Any]) -> None:
        """After a broken connection, drop every connection of the pool (a failover broke
        them all): the idle ones are closed now, without I/O, those in use when they come
        back, and new ones are made. Older pools (no ``drain``) test their idle ones."""
        drain = getattr(pool, "drain", None)
        if drain is not None:
            drain()
        else:  # pragma: no cover (psycopg_pool < 3.3)
            pool.check()

    def run(
        self, operation: str, flow: Flow[T], purge: Flow[int] | None = None, begin: bool = False
    ) -> T:
        """Run ``flow`` on a pooled connection (in a transaction when ``begin``), then the
        piggybacked ``purge``; failures become ``StoreUnavailable``."""
        with self._connection(operation) as connection:
            if begin:
                with connection.transaction():
                    result = drive(connection, flow, self._store.answer_within)
            else:
                result = drive(connection, flow, self._store.answer_within)
            if purge is not None:
                self._piggyback(connection, purge)
            return result

    def _piggyback(self, connection: psycopg.Connection[Any], purge: Flow[int]) -> None:
        import psycopg

        try:
            self._store.purged(drive(connection, purge, self._store.answer_within))
        except psycopg.Error as error:
            # The write it rides on is done; a failed purge only waits for the next one.
            logger.debug("PostgreSQL purge of expired idempotency records failed: %s", error)

    def close(self) -> None:
        """Close the store's own pool (one the user gave stays open); reopened on use."""
        with self._pool_lock:
            pool, self._pool = self._pool, self._given_pool
        if pool is not None and pool is not self._given_pool:
            pool.close()


def drive(connection: psycopg.Connection[Any], flow: Flow[T], answer_within: float) -> T:
    """Run ``flow``'s statements on ``connection``, each answered within
    ``answer_within`` seconds or its connection broken (``ConnectionTimeout``); its result."""
    try:
        statement = next(flow)
        while True:
            with WATCHDOG.watching(connection, answer_within):
                cursor = connection.execute(statement.query, statement.params, binary=True)
                rows = cursor.fetchall() if cursor.description is not None else []
            statement = flow.send(Answer(rows, cursor.rowcount))
    except StopIteration as stop:
        result: T = stop.value
        return result
