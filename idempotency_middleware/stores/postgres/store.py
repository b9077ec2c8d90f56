"""``PostgresStore``: the store for services that run on PostgreSQL already. The SQL and
its decisions are in ``ops.py``, the pools in ``transport.py``; the rest is ``KitStore``'s."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from ...clock import DEFAULT_CLOCK_SKEW_SECONDS, SYSTEM_CLOCK, Clock
from ...events import OnEvent
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD
from ..kit import KitStore, require_modules
from ..wakeups import Wakeups
from .ops import PostgresOps, Statements

# What ``synchronous_commit=`` takes: the settings that wait for a standby (PostgreSQL's
# "local" and "off" do not, and would lose claims in a failover).
SYNCHRONOUS_COMMITS = ("on", "remote_write", "remote_apply")

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from .transport import PostgresTransport


class PostgresStore(KitStore):
    """Idempotency store in one PostgreSQL table, shared by every host of a service (the
    PostgreSQL page of the documentation has every option, the layout and PgBouncer notes).

    ``PostgresStore("postgresql://app@db/app")`` serves both middlewares and ``idempotent``:
    a claim is one statement, finishing and renewing are fenced by the owner token, and
    times are the requests', never the server's. ``min_size``/``max_size`` size the pools,
    ``pool_timeout_seconds`` bounds the wait for a connection (``connect_timeout`` until the
    server is known reachable), ``statement_timeout_seconds`` each statement; your own
    ``pool=``/``async_pool=`` are used as they are and never closed. A purge of
    ``purge_batch_size`` rows rides on a write at most once per ``purge_interval_seconds``.

    ``synchronous_commit`` (``"on"``, ``"remote_write"``, ``"remote_apply"``; ``None``: the
    server's setting) is the store's connections' own, so claims and completions commit
    only once a synchronous standby (the server's ``synchronous_standby_names``) has them:
    a failover to it cannot lose them. A multi-host ``dsn``
    (``postgresql://app@db1,db2/app?target_session_attrs=read-write``) reconnects to
    whichever host is the primary after a failover.
    """

    kind = "postgresql"  # in metrics and traces (``idempotency.store``)

    _ops: PostgresOps
    _transport: PostgresTransport

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
        on_event: OnEvent = None,
        synchronous_commit: str | None = None,
    ) -> None:
        require_modules(type(self).__name__, ("psycopg", "psycopg_pool"), "postgres")
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        from .transport import PostgresConfig, PostgresTransport, listener

        if dsn is None:
            given = pool if pool is not None else async_pool
            if given is None or not isinstance(given.conninfo, str):
                raise ValueError("PostgresStore needs a dsn, or a pool to take it from")
            dsn = given.conninfo
        if not 1 <= min_size <= max_size or purge_batch_size < 1:
            raise ValueError("need 1 <= min_size <= max_size and a positive purge_batch_size")
        if pool_timeout_seconds <= 0 or connect_timeout <= 0:
            raise ValueError("pool_timeout_seconds and connect_timeout must be positive")
        if synchronous_commit is not None and synchronous_commit not in SYNCHRONOUS_COMMITS:
            raise ValueError(
                f"synchronous_commit must be one of {', '.join(SYNCHRONOUS_COMMITS)} (or None "
                f"for the server's setting), got {synchronous_commit!r}"
            )
        self.synchronous_commit = synchronous_commit
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
        # The DSN an operator's command may name: the password left to PGPASSWORD or ~/.pgpass.
        self._shown_dsn = make_conninfo(
            "", **{name: value for name, value in parts.items() if name != "password"}
        )
        self._database, self._user = parts.get("dbname"), parts.get("user")
        sql = Statements(table)  # (checks the name)
        self.table, self.min_size, self.max_size = table, min_size, max_size
        self.pool_timeout_seconds, self.connect_timeout = pool_timeout_seconds, connect_timeout
        self.statement_timeout_seconds = statement_timeout_seconds
        self.purge_interval_seconds = purge_interval_seconds
        self.purge_batch_size, self.max_response_bytes = purge_batch_size, max_response_bytes
        self.connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": prepare_threshold,
            "connect_timeout": max(1, round(connect_timeout)),
        }
        # Startup options, not a SET after connecting: no extra round trip per connection,
        # and a connection is ready as soon as it is made.
        options = str(parts.get("options") or "")
        if statement_timeout_seconds is not None:
            milliseconds = max(1, round(statement_timeout_seconds * 1000))
            options += f" -c statement_timeout={milliseconds}"
        if synchronous_commit is not None:
            options += f" -c synchronous_commit={synchronous_commit}"
        if options.strip():
            self.connect_kwargs["options"] = options.strip()
        # How long a statement's answer may take before its connection is broken off: the
        # server's own statement timeout (30 s where none is set) and a connection's time.
        statement = 30.0 if statement_timeout_seconds is None else statement_timeout_seconds
        self.answer_within = statement + max(1.0, connect_timeout)
        limits = (min_size, max_size, pool_timeout_seconds, connect_timeout, self.answer_within)
        pools = (pool, async_pool)
        config = PostgresConfig(dsn, self.where, table, self.connect_kwargs, *limits, *pools)
        ops = PostgresOps(sql, max_response_bytes, purge_interval_seconds, purge_batch_size, clock)
        breaker = (clock, breaker_threshold, breaker_cooldown_seconds)
        super().__init__(ops, PostgresTransport(config), *breaker, on_event)
        self.wakeups = Wakeups(listener(config, sql.channel), sql.channel, repr(self))

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r}, table={self.table!r})"

    def fix_for(self, cause: str) -> str:
        """The kit's advice, naming this store's table, database and server."""
        if cause == "no_table":
            return f"create it: store.create_table(), or `{self.create_table_command()}`"
        if cause == "bad_schema":
            return (
                f"point the store at a table made by its create_table(), or recreate it: drop "
                f"table {self.table!r}, then run `{self.create_table_command()}`"
            )
        if cause == "cannot_open":  # (no such database)
            return (
                f"create the database {self._database or self._user or ''!r} on {self.where}, "
                "or fix the DSN's dbname"
            )
        if cause == "bad_credentials":
            return "check the DSN's user and password (or PGPASSWORD, ~/.pgpass)"
        if cause == "access_denied":
            return (
                f"grant the DSN's user {self._user or ''!r} access to table {self.table!r} "
                f"(or a pg_hba.conf entry on {self.where})"
            )
        return super().fix_for(cause)

    def create_table_command(self) -> str:
        """The ``idempotency-middleware create-table`` command line that creates this
        store's table on its server (the DSN without its password)."""
        command = ["idempotency-middleware", "create-table", "--postgres", self._shown_dsn]
        return shlex.join([*command, "--table", self.table])

    def purge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """Delete every record expired at least ``clock_skew_seconds`` before ``now`` (default:
        the clock's), in short statements of ``purge_batch_size`` rows; the count."""
        cutoff = (self.clock.now() if now is None else now) - clock_skew_seconds
        return self.run_flow("purge", self._ops.purge_expired(cutoff))

    async def apurge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """:meth:`purge_expired`, awaited."""
        cutoff = (self.clock.now() if now is None else now) - clock_skew_seconds
        return await self.arun_flow("purge", self._ops.purge_expired(cutoff))
