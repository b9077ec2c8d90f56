"""``PostgresStore``: the store for services that run on PostgreSQL already.

psycopg 3: a ``psycopg_pool.ConnectionPool`` for the sync methods (WSGI, ``idempotent`` on
plain functions, ``postgres_sync.py``) and a small asyncio pool per event loop for the async
ones (ASGI, ``postgres_async.py``, ``postgres_aio.py``), each opened on first use. Every
operation is one statement on an autocommit connection (one round trip); the SQL and the
decisions live in ``postgres_sql.py``, shared by both paths.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from .. import deferred
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD, BreakerOwner, CircuitBreaker
from ..clock import SYSTEM_CLOCK, Clock
from ..options import DEFAULT_CLOCK_SKEW_SECONDS
from ..records import Record
from . import postgres_sql as flows
from .base import ClaimRequest, ClaimResult, Completion, StoreUnavailable
from .closing import ClosingStore
from .kit import require_modules
from .postgres_aio import CREATE_RACES, AsyncMethods
from .postgres_async import AsyncPools
from .postgres_sql import Flow, Statements
from .postgres_sync import SyncPools

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

T = TypeVar("T")
Self = TypeVar("Self", bound="PostgresStore")

logger = logging.getLogger(__name__)


class PostgresStore(AsyncMethods, BreakerOwner, ClosingStore):
    """Idempotency store in one PostgreSQL table, shared by every host of a service.

    ``PostgresStore("postgresql://app@db/app")`` serves both middlewares and ``idempotent``.
    The claim is one ``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE ... RETURNING``
    statement that reports a takeover, or the holding row in the same round trip; finishing
    and renewing are fenced by the claim's owner token. Times are the requests' own (double
    precision epoch seconds), never the server's clock.

    Connections: ``min_size``/``max_size`` size the sync pool (the async pool of each event
    loop connects on demand, up to ``max_size``); a call waits at most
    ``pool_timeout_seconds`` for a free connection (``connect_timeout`` while the server is
    not known to be reachable, so an outage answers fast), ``statement_timeout_seconds``
    bounds each statement on the server (``None``: the server's setting; it is sent as a
    startup option, which PgBouncer refuses unless ``ignore_startup_parameters`` lists
    ``options``: behind it, pass ``None`` and set it on the role). Pass ``pool=``
    (a ``psycopg_pool.ConnectionPool``) and/or ``async_pool=`` (an ``AsyncConnectionPool``,
    used on its own event loop only) to bring your own: the store uses them as they are
    (it switches a connection to autocommit while it holds it; the timeouts above are then
    yours to set) and never closes them.
    ``prepare_threshold`` is psycopg's (statements are prepared on a connection after that
    many uses); behind PgBouncer in transaction mode older than 1.21, pass ``None``.

    Expired rows stay claimable at once; a bounded purge (``purge_batch_size`` rows) rides
    on a write at most once per ``purge_interval_seconds`` per process (``None`` disables
    it), and :meth:`purge_expired` runs it now. A failure becomes ``StoreUnavailable`` with
    its cause (a claim answers 503); a broken connection drains the pool (its connections are
    replaced), and the store works again once the server is back.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        table: str = "idempotency",
        pool: ConnectionPool[Any] | None = None,
        async_pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        pool_timeout_seconds: float = 5.0,
        connect_timeout: float = 5.0,
        statement_timeout_seconds: float | None = 5.0,
        prepare_threshold: int | None = 5,
        purge_interval_seconds: float | None = 60.0,
        purge_batch_size: int = 1000,
        max_response_bytes: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
    ) -> None:
        require_modules(type(self).__name__, ("psycopg", "psycopg_pool"), "postgres")
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        if dsn is None:
            given = pool if pool is not None else async_pool
            if given is None or not isinstance(given.conninfo, str):
                raise ValueError("PostgresStore needs a dsn, or a pool to take it from")
            dsn = given.conninfo
        if not 1 <= min_size <= max_size or purge_batch_size < 1:
            raise ValueError("need 1 <= min_size <= max_size and a positive purge_batch_size")
        if pool_timeout_seconds <= 0 or connect_timeout <= 0:
            raise ValueError("pool_timeout_seconds and connect_timeout must be positive")
        self.dsn = dsn
        try:
            parts = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as error:
            raise ValueError(
                f"not a PostgreSQL connection string ({error}): expected "
                "postgresql://user@host:5432/dbname or 'host=... dbname=...'"
            ) from None
        port = str(parts.get("port") or "5432")
        if not all(part.isdigit() for part in port.split(",")):
            raise ValueError(f"the PostgreSQL port must be a number, not {port!r}")
        # For messages: where the server is, never the password.
        self.where = (
            f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}"
            f"/{parts.get('dbname') or parts.get('user') or ''}"
        )
        self.table = table
        self._sql = Statements(table)
        self.min_size, self.max_size = min_size, max_size
        self.pool_timeout_seconds = pool_timeout_seconds
        self.connect_timeout = connect_timeout
        self.statement_timeout_seconds = statement_timeout_seconds
        self.purge_interval_seconds = purge_interval_seconds
        self.purge_batch_size = purge_batch_size
        self.max_response_bytes = max_response_bytes
        self.connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": prepare_threshold,
            "connect_timeout": max(1, round(connect_timeout)),
        }
        if statement_timeout_seconds is not None:
            # A startup option, not a SET after connecting: no extra round trip per
            # connection, and a connection is ready as soon as it is made.
            milliseconds = max(1, round(statement_timeout_seconds * 1000))
            options = f"{parts.get('options') or ''} -c statement_timeout={milliseconds}"
            self.connect_kwargs["options"] = options.strip()
        self._clock = clock
        self.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown_seconds, clock)
        self._sync = SyncPools(self, pool)
        # Whether the last call reached the server: until one does, a call waits for a
        # connection no longer than a connection attempt may take.
        self.reachable = False
        self._purge_lock = threading.Lock()
        self._next_purge = 0.0  # the first write of a process purges
        self._async = AsyncPools(self, async_pool)

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r}, table={self.table!r})"

    # -- shared by both transports --------------------------------------------------------

    @property
    def answer_within(self) -> float:
        """How long a statement's answer may take before its connection is broken off: the
        server's own statement timeout (30 s where none is set) and a connection's time."""
        statement = self.statement_timeout_seconds
        return (30.0 if statement is None else statement) + max(1.0, self.connect_timeout)

    def wait_seconds(self) -> float:
        """How long a call waits for a pooled connection."""
        if self.reachable:
            return self.pool_timeout_seconds
        return min(self.pool_timeout_seconds, self.connect_timeout)

    def outage(self, operation: str, error: BaseException) -> StoreUnavailable:
        """``error`` as ``StoreUnavailable``, counted by the breaker."""
        from .postgres_errors import unavailable

        failure = unavailable(operation, error, self.where, self.table)
        self.breaker.failed(failure)
        return failure

    def succeeded(self) -> None:
        self.reachable = True
        self.breaker.succeeded()

    def purge_due(self, cutoff: float, finished_only: bool) -> Flow[int] | None:
        """The piggybacked purge batch when one is due (at most once per interval)."""
        if self.purge_interval_seconds is None:
            return None
        with self._purge_lock:
            tick = self._clock.now()
            if tick < self._next_purge:
                return None
            self._next_purge = tick + self.purge_interval_seconds
        statement = self._sql.purge_finished if finished_only else self._sql.purge
        return flows.purge(statement, cutoff, self.purge_batch_size, 1)

    def purged(self, deleted: int) -> None:
        if deleted >= self.purge_batch_size:
            with self._purge_lock:
                self._next_purge = 0.0  # more to delete: the next write continues
        if deleted:
            logger.debug("purged %d expired idempotency records", deleted)

    # -- the store protocol (sync) ------------------------------------------------------

    def claim(self, request: ClaimRequest) -> ClaimResult:
        """Claim ``request.key_hash`` in one statement; ``Held`` with the holding row."""
        purge = self.purge_due(request.stale_before, False)
        if self.breaker.admit():  # the half-open breaker's probe
            try:
                return self._sync.run("claim", flows.claim(self._sql, request), purge)
            finally:
                self.breaker.end_probe()
        return self._sync.run("claim", flows.claim(self._sql, request), purge)

    def complete(self, completion: Completion) -> bool:
        """Store the response; ``False`` when the claim is no longer ``owner``'s."""
        flow = flows.complete(self._sql, completion, self.max_response_bytes)
        return self._sync.run("complete", flow, self.purge_due(completion.now, True))

    def release(self, key_hash: str, owner: str) -> bool:
        """Delete the claim; ``False`` when it is no longer ``owner``'s."""
        return self._sync.run("release", flows.one(self._sql.release, (key_hash, owner))) == 1

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """Extend an in-progress claim; ``False`` when it is no longer ``owner``'s."""
        params = {"key": key_hash, "owner": owner, "lock_expires_at": lock_expires_at}
        return self._sync.run("renew", flows.one(self._sql.renew, params)) == 1

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        """Store the final response of work deferred with ``defer_completion()``; ``False``
        when the token no longer applies (completed, expired, taken over)."""
        flow = self._final_flow(token, status, headers, body)
        return False if flow is None else self._sync.run("complete_deferred", flow)

    def _final_flow(
        self, token: str, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes
    ) -> Flow[bool] | None:
        prepared = deferred.prepare_final(token, status, headers, body, self._clock.now())
        if prepared is None:
            return None
        parsed, response = prepared
        return flows.complete_final(
            self._sql,
            parsed.key_hash,
            parsed.owner,
            float(parsed.expires_at),
            response,
            self.max_response_bytes,
        )

    def release_deferred(self, token: str) -> bool:
        """Forget a deferred key whose work did not happen; ``False`` when the token no
        longer applies."""
        parsed = deferred.parse_token(token)
        flow = flows.one(self._sql.release_deferred, (parsed.key_hash, parsed.owner))
        return self._sync.run("release_deferred", flow) == 1

    # -- operators (sync) ---------------------------------------------------------------

    def get(self, key_hash: str) -> Record | None:
        """The record under ``key_hash`` as stored (expired or not)."""
        return self._sync.run("get", flows.get(self._sql, key_hash))

    def delete(self, key_hash: str) -> bool:
        """Remove a record whoever owns it; ``True`` when there was one."""
        return self._sync.run("delete", flows.one(self._sql.delete, (key_hash,))) > 0

    def create_table(self) -> None:
        """Create the table and its ``expires_at`` index; safe to call again, and from
        several processes at once."""
        for attempt in range(3):
            try:
                self._sync.run("create_table", flows.create_table(self._sql), None, True)
                return
            except StoreUnavailable as error:
                if error.code not in CREATE_RACES or attempt == 2:
                    raise

    def purge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """Delete every record expired at least ``clock_skew_seconds`` before ``now``
        (default: the clock's time), in batches of ``purge_batch_size`` rows (each its own
        short statement); the count."""
        cutoff = (self._clock.now() if now is None else now) - clock_skew_seconds
        flow = flows.purge(self._sql.purge, cutoff, self.purge_batch_size, None)
        return self._sync.run("purge", flow)

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the sync pool (one passed in is left open) and forget the pools of event
        loops already closed. Using the store again opens new pools."""
        self._sync.close()
        self._async.release_closed_loops()

    async def aclose(self) -> None:
        """Close the running loop's pool (one passed in is left open)."""
        await self._async.close_current()


__all__ = ["PostgresStore"]
