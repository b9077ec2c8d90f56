"""``SQLiteStore``: configuration, over the kit (ops.py, transport.py)."""

from __future__ import annotations

import os
import re
import sqlite3

from ...breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD
from ...clock import DEFAULT_CLOCK_SKEW_SECONDS, SYSTEM_CLOCK, Clock
from ..kit import KitStore
from .ops import SQLiteOps, Statements
from .transport import Settings, SQLiteTransport

# ON CONFLICT ... DO UPDATE (upsert) arrived in SQLite 3.24, RETURNING in 3.35.
_UPSERT_VERSION = (3, 24, 0)
_RETURNING_VERSION = (3, 35, 0)

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteStore(KitStore):
    """Idempotency store in one SQLite file, shared by the worker processes of one machine
    (gunicorn or uvicorn ``--workers N``): SQLite serializes writers across processes with
    file locks, WAL lets readers run beside the one writer, and the busy timeout makes a
    writer wait for the lock instead of failing.

    ``SQLiteStore("/var/lib/myapp/idempotency.sqlite3")`` serves both middlewares: the sync
    methods for WSGI, the async ones for ASGI, which run on the event loop when they need
    not wait for another process's lock, else on ``async_threads`` threads owned by the store
    (``async_inline=False``: always there; see transport.py for what runs inline, and when).

    The claim is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` statement: it wins when
    the key is absent, expired, or an in-progress claim past its lock timeout. Finishing is
    fenced by the claim's owner token. Expired rows are claimable at once and deleted by a
    bounded purge riding on writes at most once per ``purge_interval_seconds`` (``None``
    disables it; :meth:`purge_expired` runs it now), timed by ``clock``.

    A write that waits longer than ``busy_timeout_seconds`` for another process's lock, or
    any I/O error, raises :class:`StoreUnavailable` (the middleware answers 503).
    ``max_response_bytes`` caps the body size kept for replay (``None``: keep every
    response); a larger response still completes its key, never run again within its TTL.
    ``synchronous``: ``NORMAL`` (the default) keeps every commit across application crashes,
    while a power loss may forget the last ones; ``FULL`` also survives power loss, at the
    cost of an fsync per write. The schema is made on first use (or by :meth:`create_table`).
    Use one file per machine on a local disk: SQLite's locking fails on network file systems.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_seconds: float = 5.0,
        purge_interval_seconds: float | None = 60.0,
        max_response_bytes: int | None = None,
        table_name: str = "idempotency_records",
        synchronous: str = "NORMAL",
        purge_batch_size: int = 1000,
        max_idle_connections: int = 16,
        async_threads: int = 4,
        async_inline: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
    ) -> None:
        if sqlite3.sqlite_version_info < _UPSERT_VERSION:
            raise RuntimeError(
                f"SQLiteStore needs SQLite 3.24 or newer (upsert); this Python links "
                f"SQLite {sqlite3.sqlite_version}"
            )
        self.path = path = os.fspath(path)
        if path in ("", ":memory:"):
            raise ValueError(
                "SQLiteStore needs a file path shared by the worker processes; "
                "use MemoryStore for an in-process store"
            )
        if not _TABLE_NAME.fullmatch(table_name):
            raise ValueError(f"table_name must be a plain SQL identifier, not {table_name!r}")
        synchronous = synchronous.upper()
        if synchronous not in _SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(_SYNCHRONOUS_MODES)}")
        if busy_timeout_seconds < 0:
            raise ValueError("busy_timeout_seconds must not be negative")
        if purge_batch_size < 1 or async_threads < 1 or max_idle_connections < 0:
            raise ValueError(
                "purge_batch_size and async_threads must be positive, "
                "max_idle_connections not negative"
            )
        self.table_name = table_name
        self.busy_timeout_seconds = busy_timeout_seconds
        self.purge_interval_seconds = purge_interval_seconds
        self.max_response_bytes = max_response_bytes
        self.synchronous = synchronous
        self.purge_batch_size = purge_batch_size
        returning = sqlite3.sqlite_version_info >= _RETURNING_VERSION
        purging = (purge_interval_seconds, purge_batch_size, round(busy_timeout_seconds * 1000))
        ops = SQLiteOps(Statements(table_name), returning, max_response_bytes, *purging, clock)
        # Awaited calls run inline on the loop first (transport.py): not where every commit
        # is an fsync (FULL, EXTRA), nor outside WAL (the transport turns it off then), nor
        # where no connection may be kept for the next call.
        inline = async_inline and synchronous in ("OFF", "NORMAL") and max_idle_connections > 0
        settings = Settings(
            path, busy_timeout_seconds, synchronous, max_idle_connections, async_threads, inline
        )
        breaker = (clock, breaker_threshold, breaker_cooldown_seconds)
        super().__init__(ops, SQLiteTransport(settings, ops.sql.schema), *breaker)
        self._ops: SQLiteOps = ops
        self._transport: SQLiteTransport

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, table_name={self.table_name!r})"

    def purge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """Delete every record expired at least ``clock_skew_seconds`` before ``now``
        (default: the clock's time), in batches of ``purge_batch_size``; the count. (The
        margin keeps an in-progress claim that a host whose clock is behind still holds, as
        the claims' own margin does.)"""
        cutoff = (self._clock.now() if now is None else now) - clock_skew_seconds
        return self._run("purge", self._ops.purge(cutoff, self.purge_batch_size))
