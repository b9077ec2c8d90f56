"""``SQLiteStore``: the embedded store for one machine running several worker processes.

Every worker (gunicorn or uvicorn ``--workers N``) opens the same database file. SQLite
serializes writers across processes with file locks; WAL mode lets readers run beside the
one writer, and the busy timeout makes a writer wait for the lock instead of failing.

Table layout (one row per namespaced key)::

    key              TEXT     primary key: the namespaced key the middleware claims
    status           TEXT     "in_progress" | "deferred" | "completed"
    fingerprint      TEXT     sha256 of the request (see fingerprint.py)
    owner            TEXT     random token of the claim that wrote the row (fencing)
    lock_expires_at  REAL     epoch seconds, sub-second precision
    expires_at       REAL     epoch seconds, sub-second precision (checked on every claim)
    response         BLOB     encoded response (records.encode_response), once completed
    response_size    INTEGER  body size in bytes
    too_large        INTEGER  completed, but the response was not kept (too large, streamed)
    taken_over       INTEGER  this claim replaced another owner's stale in-progress claim
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from .. import deferred
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD, BreakerOwner, CircuitBreaker
from ..clock import SYSTEM_CLOCK, Clock
from ..options import DEFAULT_CLOCK_SKEW_SECONDS
from ..records import Record, Status, StoredResponse, decode_response, encode_response
from .base import Claimed, ClaimRequest, ClaimResult, Completion, Held, StoreUnavailable
from .sqlite_connections import (
    CHECKPOINT_EVERY,
    INLINE,
    INLINE_MAX_BODY_BYTES,
    ConnectionPool,
    WouldWait,
    close_quietly,
)
from .threaded import ThreadedStore

T = TypeVar("T")

logger = logging.getLogger(__name__)

# ON CONFLICT ... DO UPDATE (upsert) arrived in SQLite 3.24, RETURNING in 3.35.
_UPSERT_VERSION = (3, 24, 0)
_RETURNING_VERSION = (3, 35, 0)

# SQLite's default SQLITE_MAX_LENGTH: a larger blob cannot be stored at all.
_MAX_BLOB_BYTES = 1_000_000_000

# How long a piggybacked purge may wait for another worker's write lock.
_PURGE_BUSY_TIMEOUT_MS = 50

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

_COLUMNS = (
    "key, status, fingerprint, owner, lock_expires_at, expires_at, "
    "response, response_size, too_large"
)


class _Statements:
    """The SQL for one table name (validated, then quoted)."""

    def __init__(self, table_name: str) -> None:
        table = f'"{table_name}"'
        self.create_table = (
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "key TEXT PRIMARY KEY NOT NULL, "
            "status TEXT NOT NULL, "
            "fingerprint TEXT NOT NULL, "
            "owner TEXT NOT NULL, "
            "lock_expires_at REAL NOT NULL, "
            "expires_at REAL NOT NULL, "
            "response BLOB, "
            "response_size INTEGER NOT NULL DEFAULT 0, "
            "too_large INTEGER NOT NULL DEFAULT 0, "
            "taken_over INTEGER NOT NULL DEFAULT 0)"
        )
        self.create_index = (
            f'CREATE INDEX IF NOT EXISTS "{table_name}_expires_at" ON {table} (expires_at)'
        )
        # The whole claim condition lives in the upsert's WHERE: a row that is absent is
        # inserted; a row that is expired, or an in-progress claim past its lock, is
        # replaced; any other row is left alone and the statement changes nothing.
        # In DO UPDATE, the bare table name refers to the existing row, so ``taken_over``
        # records whether the replaced row was an in-progress (dead owner's) claim.
        self.claim = (
            f"INSERT INTO {table} ({_COLUMNS}, taken_over) "
            "VALUES (:key, :in_progress, :fingerprint, :owner, :lock_expires_at, :expires_at, "
            "NULL, 0, 0, 0) "
            "ON CONFLICT (key) DO UPDATE SET "
            f"taken_over = ({table}.status = :in_progress), "
            "status = excluded.status, "
            "fingerprint = excluded.fingerprint, "
            "owner = excluded.owner, "
            "lock_expires_at = excluded.lock_expires_at, "
            "expires_at = excluded.expires_at, "
            "response = NULL, response_size = 0, too_large = 0 "
            f"WHERE ({table}.status <> :in_progress AND {table}.expires_at <= :now) "
            f"OR ({table}.status = :in_progress AND {table}.lock_expires_at <= :stale)"
        )
        self.claim_returning = self.claim + " RETURNING taken_over"
        self.taken_over = f"SELECT taken_over FROM {table} WHERE key = ?"
        self.select = f"SELECT {_COLUMNS} FROM {table} WHERE key = ?"
        self.complete = (
            f"UPDATE {table} SET status = :completed, expires_at = :expires_at, "
            "response = :response, response_size = :response_size, too_large = :too_large "
            "WHERE key = :key AND owner = :owner"
        )
        # A deferred key's interim response: only over the claim still in progress (never
        # over the work's final response, which may land first).
        self.complete_interim = self.complete + " AND status = :in_progress"
        self.owner = f"SELECT owner FROM {table} WHERE key = ?"
        # The work's final response, or forgetting a deferred key, by a deferral token:
        # fenced by its owner, on a key not completed yet.
        self.complete_final = (
            f"UPDATE {table} SET status = :completed, expires_at = :expires_at, "
            "response = :response, response_size = :response_size, too_large = :too_large "
            "WHERE key = :key AND owner = :owner AND status <> :completed"
        )
        self.release_deferred = f"DELETE FROM {table} WHERE key = ? AND owner = ? AND status <> ?"
        # Only a claim still in progress: never a final response a deferral's worker stored
        # while the handler was still running.
        self.release = f"DELETE FROM {table} WHERE key = ? AND owner = ? AND status = ?"
        self.renew = (
            f"UPDATE {table} SET lock_expires_at = :lock_expires_at, "
            "expires_at = :lock_expires_at "
            "WHERE key = :key AND owner = :owner AND status = :in_progress"
        )
        self.delete = f"DELETE FROM {table} WHERE key = ?"
        # DELETE ... LIMIT needs a compile-time option; a rowid subquery bounds it anywhere.
        self.purge = (
            f"DELETE FROM {table} WHERE rowid IN "
            f"(SELECT rowid FROM {table} WHERE expires_at <= ? LIMIT ?)"
        )
        # After a completion, whose time carries no clock-skew margin: finished rows only.
        self.purge_finished = (
            f"DELETE FROM {table} WHERE rowid IN "
            f"(SELECT rowid FROM {table} WHERE expires_at <= ? "
            f"AND status <> '{Status.IN_PROGRESS.value}' LIMIT ?)"
        )


def _row_to_record(row: tuple[Any, ...]) -> Record:
    key_hash, status, fingerprint, owner, lock_expires_at, expires_at, blob, size, too_large = row
    return Record(
        key_hash=key_hash,
        status=Status(status),
        fingerprint=fingerprint,
        owner=owner,
        lock_expires_at=float(lock_expires_at),
        expires_at=float(expires_at),
        response=decode_response(bytes(blob)) if blob is not None else None,
        response_not_stored=bool(too_large),
        response_size=int(size),
    )


def _is_busy(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return (code & 0xFF) in (_SQLITE_BUSY, _SQLITE_LOCKED)
    message = str(error).lower()
    return "locked" in message or "busy" in message


def _is_unavailable(error: BaseException) -> bool:
    """Errors that mean the database could not answer, as opposed to a bug in our SQL.

    OperationalError covers a lock held past the busy timeout, I/O errors, a full disk, a
    file that cannot be opened; a bare DatabaseError a corrupt file or not a database.
    """
    return isinstance(error, sqlite3.OperationalError) or type(error) is sqlite3.DatabaseError


# SQLite's primary result codes, by the cause they mean (see errors.CAUSES).
_CAUSES_BY_CODE = {
    3: "access_denied",  # SQLITE_PERM
    5: "busy",  # SQLITE_BUSY
    6: "busy",  # SQLITE_LOCKED
    8: "access_denied",  # SQLITE_READONLY
    10: "io_error",  # SQLITE_IOERR
    11: "io_error",  # SQLITE_CORRUPT
    13: "io_error",  # SQLITE_FULL
    14: "cannot_open",  # SQLITE_CANTOPEN
    23: "access_denied",  # SQLITE_AUTH
    26: "io_error",  # SQLITE_NOTADB
}
# Python 3.10's sqlite3 errors carry no code: SQLite's own messages for the same codes.
_CODES_BY_MESSAGE = (
    ("database is locked", 5),
    ("database table is locked", 6),
    ("readonly database", 8),
    ("disk i/o error", 10),
    ("malformed", 11),
    ("database or disk is full", 13),
    ("unable to open", 14),
    ("not a database", 26),
)


def _primary_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return int(code) & 0xFF
    message = str(error).lower()
    return next((number for text, number in _CODES_BY_MESSAGE if text in message), None)


def _unavailable(operation: str, error: sqlite3.Error, path: str) -> StoreUnavailable:
    cause = _CAUSES_BY_CODE.get(_primary_code(error) or 0, "unknown")
    reasons = {
        "busy": f"database {path!r} is locked by another writer (past busy_timeout_seconds)",
        "cannot_open": f"cannot open database file {path!r} ({error})",
        "access_denied": f"database {path!r} is not writable ({error})",
        "io_error": f"database {path!r} cannot be read or written ({error})",
        "unknown": f"database {path!r}: {error}",
    }
    return StoreUnavailable(
        f"SQLite {operation} failed: {error}",
        code=getattr(error, "sqlite_errorname", "") or type(error).__name__,
        cause=cause,
        reason=reasons[cause],
    )


def _rolled_back(connection: sqlite3.Connection) -> bool:
    """Leave no transaction open on ``connection``; whether that worked."""
    try:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
    except sqlite3.Error:
        return False
    return True


class SQLiteStore(ThreadedStore, BreakerOwner):
    """Idempotency store in one SQLite file, shared by the worker processes of one machine.

    ``SQLiteStore("/var/lib/myapp/idempotency.sqlite3")`` serves both middlewares: the sync
    methods (``claim``, ``complete``, ``release``, ``renew``) for WSGI, the async ones
    (``aclaim`` ...) for ASGI, which run the same calls on the event loop when they need not
    wait for another process's lock, else on a small thread pool owned by the store
    (``async_threads`` of them, see :class:`ThreadedStore` and sqlite_connections.py).

    The claim is a single ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` statement: it wins
    when the key is absent, expired, or an in-progress claim past its lock timeout.
    Finishing is fenced by the claim's owner token. Expired rows are claimable at once and
    deleted by a bounded purge that piggybacks on writes at most once per
    ``purge_interval_seconds`` (``None`` disables it; :meth:`purge_expired` runs it now),
    timed by ``clock``.

    A write that waits longer than ``busy_timeout_seconds`` for another process's lock, or
    any I/O error, raises :class:`StoreUnavailable` (the middleware answers 503).
    ``max_response_bytes`` caps the body size kept for replay (``None``: keep every
    response); a larger response still completes its key, which is never run again within
    its TTL. ``synchronous`` is SQLite's durability setting: ``NORMAL`` (the default) keeps
    every commit across application crashes, while a power loss may forget the last ones;
    ``FULL`` also survives power loss at the cost of an fsync per write.
    ``async_inline=False`` keeps every async call on the threads (see sqlite_connections.py
    for what runs inline, and when).

    Schema is created on first use (or by :meth:`create_table`). Use one file per machine
    on a local disk: SQLite's locking does not work over network file systems.
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
        self.path = os.fspath(path)
        if self.path in ("", ":memory:"):
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
        self._busy_timeout_ms = round(busy_timeout_seconds * 1000)
        self.purge_interval_seconds = purge_interval_seconds
        self.max_response_bytes = max_response_bytes
        self.synchronous = synchronous
        self.purge_batch_size = purge_batch_size
        self._sql = _Statements(table_name)
        self._use_returning = sqlite3.sqlite_version_info >= _RETURNING_VERSION
        self._pool = ConnectionPool(self._open, max_idle_connections)
        # Async calls run inline on the loop first (sqlite_connections.py): not where every
        # commit is an fsync (FULL, EXTRA), nor outside WAL (_configure turns it off), nor
        # where no connection may be kept for the next call.
        self._inline = (
            async_inline and synchronous in ("OFF", "NORMAL") and max_idle_connections > 0
        )
        self._inline_pool = ConnectionPool(
            self._open_inline, max_idle_connections, discard=self._close_off_the_loop
        )
        self._inline_calls = 0
        self._wal_restart_due = False
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._clock = clock
        self.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown_seconds, clock)
        self._purge_lock = threading.Lock()
        self._next_purge = 0.0  # the first write of a process purges
        super().__init__(async_threads=async_threads, thread_name_prefix="idempotency-sqlite")

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, table_name={self.table_name!r})"

    # -- connections ------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_seconds,
            isolation_level=None,  # autocommit; transactions are explicit (BEGIN IMMEDIATE)
            check_same_thread=False,  # the pool hands a connection to one thread at a time
        )
        try:
            self._configure(connection)
        except BaseException:
            close_quietly(connection)
            raise
        return connection

    def _configure(self, connection: sqlite3.Connection) -> None:
        # Switching a new file to WAL takes an exclusive lock that the busy handler may not
        # wait for when several workers start at once, so retry within the busy timeout.
        # Real time, not the injected clock: this waits on another process's file lock.
        deadline = time.monotonic() + self.busy_timeout_seconds
        while True:
            try:
                mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as error:
                if not _is_busy(error) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            self._inline = False  # a commit outside WAL writes and syncs a journal
            logger.warning(
                "SQLite database %s is in %s journal mode, not WAL: writers will block readers",
                self.path,
                mode,
            )
        connection.execute(f"PRAGMA synchronous = {self.synchronous}")
        if not self._schema_ready:
            with self._schema_lock:
                if not self._schema_ready:
                    self._create_schema(connection)
                    self._schema_ready = True

    def _open_inline(self) -> sqlite3.Connection:
        """A connection for calls on the event loop: it never waits for a lock (busy
        timeout zero) and never checkpoints (the store does, on its threads)."""
        connection = self._open()
        connection.execute("PRAGMA busy_timeout = 0")
        connection.execute("PRAGMA wal_autocheckpoint = 0")
        return connection

    def _create_schema(self, connection: sqlite3.Connection) -> None:
        connection.execute(self._sql.create_table)
        connection.execute(self._sql.create_index)

    @contextmanager
    def _connection(self, operation: str) -> Iterator[sqlite3.Connection]:
        """A pooled connection (or the inline call's own); SQLite failures become
        ``StoreUnavailable``, and an inline call that met a lock ``WouldWait``."""
        inline = INLINE.get()
        if inline is not None:
            connection, generation = inline, 0
        else:
            try:
                connection, generation = self._pool.acquire()
            except sqlite3.Error as error:
                if _is_unavailable(error):
                    raise self._outage(_unavailable(operation, error, self.path)) from error
                raise
        try:
            yield connection
        except BaseException as error:
            busy = isinstance(error, sqlite3.Error) and _is_busy(error)
            if inline is not None:
                # The inline call's caller keeps or drops its connection; what runs from
                # here on (the breaker's hooks) is not part of it.
                INLINE.set(None)
                if busy and _rolled_back(connection):
                    raise WouldWait(operation) from error
            elif busy and _rolled_back(connection):
                # Only another worker's lock was in the way: the connection is sound.
                self._pool.give_back(connection, generation)
            else:
                # Whatever state it is in (a broken file handle, a half-done transaction),
                # a connection that failed otherwise is not reused.
                close_quietly(connection)
            if isinstance(error, sqlite3.Error) and _is_unavailable(error):
                raise self._outage(_unavailable(operation, error, self.path)) from error
            raise
        if inline is None:
            self._pool.give_back(connection, generation)
        else:
            INLINE.set(None)
        self.breaker.succeeded()

    def _outage(self, error: StoreUnavailable) -> StoreUnavailable:
        """Count ``error`` on the circuit breaker (when it is an outage), and return it."""
        self.breaker.failed(error)
        return error

    # -- the store protocol (sync, for WSGI) ------------------------------------------

    def claim(self, request: ClaimRequest) -> ClaimResult:
        """Claim ``request.key_hash`` in one upsert; ``Held`` with the holding row otherwise."""
        if self.breaker.admit():  # the half-open breaker's probe
            try:
                return self._claim(request)
            finally:
                self.breaker.end_probe()
        return self._claim(request)

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        params = {
            "key": request.key_hash,
            "fingerprint": request.fingerprint,
            "owner": request.owner,
            "lock_expires_at": request.lock_expires_at,
            "expires_at": request.expires_at,
            "now": request.now,
            "stale": request.stale_before,
            "in_progress": Status.IN_PROGRESS.value,
        }
        with self._connection("claim") as connection:
            # IMMEDIATE takes the write lock up front (waiting up to the busy timeout), so
            # the upsert and the read of a holding row see one consistent state.
            connection.execute("BEGIN IMMEDIATE")
            if self._use_returning:
                rows = connection.execute(self._sql.claim_returning, params).fetchall()
                claimed = bool(rows)
                taken_over = claimed and bool(rows[0][0])
            else:
                claimed = connection.execute(self._sql.claim, params).rowcount == 1
                taken_over = claimed and bool(
                    connection.execute(self._sql.taken_over, (request.key_hash,)).fetchone()[0]
                )
            row = (
                None
                if claimed
                else connection.execute(self._sql.select, (request.key_hash,)).fetchone()
            )
            connection.execute("COMMIT")
            # (Not a claim this one may not take over yet: its clock-skew margin.)
            self._maybe_purge(connection, request.stale_before, self._sql.purge)
        if claimed:
            return Claimed(taken_over=taken_over)
        if row is None:  # cannot happen: the upsert conflicted with this very row
            raise StoreUnavailable(f"SQLite claim of {request.key_hash!r} found no holding row")
        return Held(_row_to_record(row))

    def complete(self, completion: Completion) -> bool:
        """Store the response; ``False`` when the claim is no longer ``owner``'s."""
        blob, too_large = self._encoded(completion.response, completion.streamed)
        params = {
            "key": completion.key_hash,
            "owner": completion.owner,
            "completed": (Status.DEFERRED if completion.deferred else Status.COMPLETED).value,
            "expires_at": completion.expires_at,
            "response": blob,
            "response_size": completion.body_size,
            "too_large": int(too_large),
        }
        with self._connection("complete") as connection:
            if not completion.deferred:
                updated = connection.execute(self._sql.complete, params).rowcount == 1
            else:
                params["in_progress"] = Status.IN_PROGRESS.value
                updated = connection.execute(self._sql.complete_interim, params).rowcount == 1
                if not updated:
                    # Deferred already (this completion again) or completed by the work's
                    # final response first: done either way, if the key is still ours.
                    row = connection.execute(self._sql.owner, (completion.key_hash,)).fetchone()
                    updated = row is not None and row[0] == completion.owner
            # (Finished rows only: an in-progress claim past its lock may still be inside
            # another host's clock-skew margin.)
            self._maybe_purge(connection, completion.now, self._sql.purge_finished)
        return updated

    def _encoded(self, response: StoredResponse, streamed: bool) -> tuple[bytes | None, bool]:
        """The response's blob, or ``None`` and too large (streamed, over the limits)."""
        too_large = streamed or (
            self.max_response_bytes is not None and len(response.body) > self.max_response_bytes
        )
        if too_large:
            return None, True
        blob = encode_response(response)
        if len(blob) > _MAX_BLOB_BYTES:
            return None, True
        return blob, False

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        """Store the final response of work deferred with ``defer_completion()``; ``False``
        when the token no longer applies (completed, expired, taken over)."""
        prepared = deferred.prepare_final(token, status, headers, body, self._clock.now())
        if prepared is None:
            return False
        parsed, response = prepared
        blob, too_large = self._encoded(response, False)
        params = {
            "key": parsed.key_hash,
            "owner": parsed.owner,
            "completed": Status.COMPLETED.value,
            "expires_at": float(parsed.expires_at),
            "response": blob,
            "response_size": len(response.body),
            "too_large": int(too_large),
        }
        with self._connection("complete_deferred") as connection:
            return connection.execute(self._sql.complete_final, params).rowcount == 1

    def release_deferred(self, token: str) -> bool:
        """Forget a deferred key whose work did not happen; ``False`` when the token no
        longer applies."""
        parsed = deferred.parse_token(token)
        arguments = (parsed.key_hash, parsed.owner, Status.COMPLETED.value)
        with self._connection("release_deferred") as connection:
            return connection.execute(self._sql.release_deferred, arguments).rowcount == 1

    def release(self, key_hash: str, owner: str) -> bool:
        """Delete the claim; ``False`` when it is no longer ``owner``'s."""
        with self._connection("release") as connection:
            arguments = (key_hash, owner, Status.IN_PROGRESS.value)
            return connection.execute(self._sql.release, arguments).rowcount == 1

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """Extend an in-progress claim; ``False`` when it is no longer ``owner``'s."""
        params = {
            "key": key_hash,
            "owner": owner,
            "lock_expires_at": lock_expires_at,
            "in_progress": Status.IN_PROGRESS.value,
        }
        with self._connection("renew") as connection:
            return connection.execute(self._sql.renew, params).rowcount == 1

    # -- operators --------------------------------------------------------------------

    def get(self, key_hash: str) -> Record | None:
        """The record under ``key_hash`` as stored (expired or not), for operators and tests."""
        with self._connection("get") as connection:
            row = connection.execute(self._sql.select, (key_hash,)).fetchone()
        return _row_to_record(row) if row is not None else None

    def delete(self, key_hash: str) -> bool:
        """Remove a record unconditionally (operators re-driving failed work).

        ``True`` when there was one.
        """
        with self._connection("delete") as connection:
            return connection.execute(self._sql.delete, (key_hash,)).rowcount > 0

    def create_table(self) -> None:
        """Create the table and its expiry index (and switch the file to WAL); safe to repeat.

        Not required: the schema is also created on first use.
        """
        with self._connection("create_table") as connection:
            self._create_schema(connection)

    def purge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """Delete every record expired at least ``clock_skew_seconds`` before ``now``
        (default: the clock's time); the count. (The margin keeps an in-progress claim that
        a host whose clock is behind still holds, as the claims' own margin does.)

        Runs in batches of ``purge_batch_size`` rows, each its own short write
        transaction, so other workers are never locked out for long.
        """
        now = self._clock.now() if now is None else now
        cutoff = now - clock_skew_seconds
        total = 0
        with self._connection("purge") as connection:
            while True:
                deleted = connection.execute(
                    self._sql.purge, (cutoff, self.purge_batch_size)
                ).rowcount
                total += deleted
                if deleted < self.purge_batch_size:
                    return total

    def _maybe_purge(self, connection: sqlite3.Connection, cutoff: float, statement: str) -> None:
        """One bounded purge batch (``statement``: rows expired at ``cutoff``), at most once
        per interval per process, after a write."""
        if self.purge_interval_seconds is None:
            return
        with self._purge_lock:
            tick = self._clock.now()
            if tick < self._next_purge:
                return
            self._next_purge = tick + self.purge_interval_seconds
        if INLINE.get() is not None:
            # Not on the event loop: a batch of deletes that may wait for the lock a little.
            self._in_background(self._purge_batch_on_a_thread, cutoff, statement)
            return
        self._purge_batch(connection, cutoff, statement)

    def _purge_batch_on_a_thread(self, cutoff: float, statement: str) -> None:
        try:
            with self._connection("purge") as connection:
                self._purge_batch(connection, cutoff, statement)
        except StoreUnavailable as error:
            logger.debug("SQLite purge of expired idempotency records skipped: %s", error)

    def _purge_batch(self, connection: sqlite3.Connection, cutoff: float, statement: str) -> None:
        # The write it rides on has committed and its request is waiting: the purge does
        # not queue for another worker's lock, it skips to the next interval instead.
        connection.execute(f"PRAGMA busy_timeout = {_PURGE_BUSY_TIMEOUT_MS}")
        try:
            deleted = connection.execute(statement, (cutoff, self.purge_batch_size)).rowcount
        except sqlite3.Error as error:
            logger.debug("SQLite purge of expired idempotency records skipped: %s", error)
            return
        finally:
            connection.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        if deleted >= self.purge_batch_size:
            with self._purge_lock:
                self._next_purge = 0.0  # more to delete: the next write continues
        if deleted:
            logger.debug("purged %d expired idempotency records", deleted)

    # -- the async methods (ASGI): inline on the loop first ------------------------------

    async def _run_async(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on the event loop's thread when it can run without waiting for
        a lock; else on the store's threads (see sqlite_connections.py)."""
        # (An open or probing breaker: the thread path, where the probe is admitted once.)
        if self._inline and self.breaker.state == "closed":
            if self._wal_restart_due and call != self.get:
                # The first write after a checkpoint restarts the WAL, which syncs its
                # header: not on the loop.
                self._wal_restart_due = False
                return await self._in_thread(call, *args)
            taken = self._inline_pool.take_idle()
            if taken is None:
                # Opening a connection is file I/O: this call runs on a thread, as before,
                # and leaves an inline connection for the next ones.
                return await self._in_thread(self._call_then_open_inline, call, *args)
            connection, generation = taken
            token = INLINE.set(connection)
            try:
                result = call(*args)
            except WouldWait:
                self._inline_pool.give_back(connection, generation)
            except BaseException as error:
                if (
                    isinstance(error, sqlite3.Error)
                    or isinstance(error.__cause__, sqlite3.Error)
                    or not _rolled_back(connection)
                ):
                    self._close_off_the_loop(connection)
                else:  # refused before SQLite was asked (the breaker, a bad argument)
                    self._inline_pool.give_back(connection, generation)
                raise
            else:
                self._inline_pool.give_back(connection, generation)
                self._inline_calls += 1
                if self._inline_calls >= CHECKPOINT_EVERY:
                    self._inline_calls = 0
                    self._in_background(self._checkpoint)
                return result
            finally:
                INLINE.reset(token)
        return await self._in_thread(call, *args)

    def _call_then_open_inline(self, call: Callable[..., T], *args: Any) -> T:
        result = call(*args)
        with suppress(sqlite3.Error):  # else the next call tries again
            self._inline_pool.give_back(*self._inline_pool.acquire())
        return result

    def _in_background(self, call: Callable[..., object], *args: Any) -> bool:
        """Run ``call(*args)`` on the store's threads, not waiting for it; whether it was
        handed over. What the call rides on has happened already: a store closing meanwhile
        must not fail it."""
        try:
            self._thread_pool().submit(call, *args)
        except RuntimeError as error:  # the pool shut down (close(), interpreter exit)
            logger.debug("SQLite store: background %s not run: %s", call.__name__, error)
            return False
        return True

    def _close_off_the_loop(self, connection: sqlite3.Connection) -> None:
        # Closing the last connection to a file checkpoints it, with fsyncs.
        if not self._in_background(close_quietly, connection):
            close_quietly(connection)

    def _checkpoint(self) -> None:
        """Move the WAL's pages into the database without waiting for anyone (what SQLite's
        auto-checkpoint does, which inline connections leave to this)."""
        try:
            with self._connection("checkpoint") as connection:
                _, frames, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except StoreUnavailable as error:
            logger.debug("SQLite checkpoint skipped: %s", error)
            return
        if frames > 0 and copied == frames:
            self._wal_restart_due = True

    # The other async methods are ThreadedStore's, through _run_async above.

    async def acomplete(self, completion: Completion) -> bool:
        """:meth:`complete`, inline unless the body is large or the lock is held."""
        if len(completion.response.body) > INLINE_MAX_BODY_BYTES:
            return await self._in_thread(self.complete, completion)
        return await self._run_async(self.complete, completion)

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        if len(body) > INLINE_MAX_BODY_BYTES:
            return await self._in_thread(self.complete_deferred, token, status, headers, body)
        return await self._run_async(self.complete_deferred, token, status, headers, body)

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections and stop the async worker threads (after their current
        call). Using the store again reopens them."""
        super().close()
        self._pool.close()
        self._inline_pool.close()
