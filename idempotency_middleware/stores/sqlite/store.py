"""``SQLiteStore``: configuration, over the kit (ops.py, transport.py)."""

from __future__ import annotations

import os
import re
import sqlite3

from ...clock import DEFAULT_CLOCK_SKEW_SECONDS, SYSTEM_CLOCK, Clock
from ...events import OnEvent
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD
from ..kit import KitStore, PurgeSchedule
from .ops import SQLiteOps, Statements
from .transport import Settings, SQLiteTransport

# ON CONFLICT ... DO UPDATE (upsert) arrived in SQLite 3.24, RETURNING in 3.35.
_UPSERT_VERSION = (3, 24, 0)
_RETURNING_VERSION = (3, 35, 0)

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteStore(KitStore):
    """Idempotency store in one SQLite file on a local disk, shared by the worker processes
    of one machine (the SQLite page of the documentation says how it runs, and when inline).

    ``SQLiteStore("/var/lib/myapp/idempotency.sqlite3")`` serves both middlewares; awaited
    calls run on the event loop when they need not wait for a lock, else on
    ``async_threads`` threads (``async_inline=False``: always there), keeping up to
    ``max_idle_connections`` open. A write waiting past ``busy_timeout_seconds`` for
    another process's lock, or an I/O error, raises :class:`StoreUnavailable`. A body over
    ``max_response_bytes`` completes its key without being kept. ``synchronous``:
    ``NORMAL`` survives application crashes, ``FULL`` power loss too (an fsync per write).
    The schema (``table_name``) is made on first use; a bounded purge rides on writes at
    most once per ``purge_interval_seconds`` (``None``: never; :meth:`purge_expired`: now).
    """

    kind = "sqlite"  # in metrics and traces (``idempotency.store``)

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
        on_event: OnEvent = None,
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
        purges = PurgeSchedule(purge_interval_seconds, purge_batch_size, clock)
        busy_ms = round(busy_timeout_seconds * 1000)
        ops = SQLiteOps(Statements(table_name), returning, max_response_bytes, purges, busy_ms)
        # Awaited calls run inline on the loop first (transport.py): not where every commit
        # is an fsync (FULL, EXTRA), nor outside WAL (the transport turns it off then), nor
        # where no connection may be kept for the next call.
        inline = async_inline and synchronous in ("OFF", "NORMAL") and max_idle_connections > 0
        settings = Settings(
            path, busy_timeout_seconds, synchronous, max_idle_connections, async_threads, inline
        )
        breaker = (clock, breaker_threshold, breaker_cooldown_seconds)
        super().__init__(ops, SQLiteTransport(settings, ops.sql.schema), *breaker, on_event)
        self._ops: SQLiteOps = ops
        self._transport: SQLiteTransport

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, table_name={self.table_name!r})"

    def fix_for(self, cause: str) -> str:
        """The kit's advice, naming this store's file and its directory."""
        folder = os.path.dirname(os.path.abspath(self.path))
        if cause == "cannot_open":
            return f"create the directory {folder!r}, or fix the path {self.path!r}"
        if cause == "access_denied":
            return f"make {self.path!r} and its directory {folder!r} writable by this process"
        return super().fix_for(cause)

    def purge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """Delete every record expired at least ``clock_skew_seconds`` before ``now``
        (default: the clock's time), in batches of ``purge_batch_size``; the count. (The
        margin keeps an in-progress claim that a host whose clock is behind still holds, as
        the claims' own margin does.)"""
        cutoff = (self.clock.now() if now is None else now) - clock_skew_seconds
        return self.run_flow("purge", self._ops.purge(cutoff, self.purge_batch_size))
