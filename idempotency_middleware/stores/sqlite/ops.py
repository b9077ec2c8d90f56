"""SQLiteStore's statements, and its operations as flows of them: every decision, no I/O.

A flow yields statements, receives each one's :class:`Reply` (or its SQLite error, thrown
in), and may ask for :data:`OFF_LOOP` (the rest off the event loop) or :class:`Later`.
One row per key hash: the fields of ``records.Record`` (times in epoch seconds of the
requests' clock), and ``taken_over``, whether the claim replaced a stale in-progress one.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Generator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple, TypeVar

from ...errors import StoreUnavailable
from ..kit import PurgeSchedule, kept_blob, purge_all
from ..protocol import Claimed, ClaimRequest, ClaimResult, Completion, DeferredToken, Held
from ..records import Record, Status, StoredResponse, record_from_fields

T = TypeVar("T")
logger = logging.getLogger(__package__)

# SQLite's default SQLITE_MAX_LENGTH: a larger blob cannot be stored at all.
_MAX_BLOB_BYTES = 1_000_000_000
# A completion with a larger body is written from a worker thread: copying megabytes into
# the page cache is not a thing to do on the loop.
INLINE_MAX_BODY_BYTES = 64 * 1024
# How long a piggybacked purge may wait for another worker's write lock.
_PURGE_BUSY_TIMEOUT_MS = 50
PURGE = "purge of expired idempotency records"

_IN_PROGRESS = Status.IN_PROGRESS.value
_COMPLETED = Status.COMPLETED.value
_COLUMNS = "key, status, fingerprint, owner, lock_expires_at, expires_at, response, "
_COLUMNS += "too_large, response_size"  # (Record's order)
_CLAIM_FIELDS: tuple[str, ...] = ("key_hash", "fingerprint", "owner", "now", "stale_before")
_CLAIM_FIELDS += ("lock_expires_at", "expires_at")  # (ClaimRequest's names)


class Statement(NamedTuple):
    sql: str
    params: Any = ()


class Reply(NamedTuple):
    rows: list[Any]
    changed: int


class Later(NamedTuple):
    """Run a purge batch after the write: at once, or on the store's threads when inline."""

    flow: Steps[None]


Steps = Generator[Statement | Later, Reply, T]  # a flow of this store
OFF_LOOP = Statement("-- the rest off the event loop")


class Statements:
    """The SQL for one table name (validated, then quoted)."""

    def __init__(self, table_name: str) -> None:
        table = f'"{table_name}"'
        self.schema = (
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "key TEXT PRIMARY KEY NOT NULL, status TEXT NOT NULL, fingerprint TEXT NOT NULL, "
            "owner TEXT NOT NULL, lock_expires_at REAL NOT NULL, expires_at REAL NOT NULL, "
            "response BLOB, response_size INTEGER NOT NULL DEFAULT 0, "
            "too_large INTEGER NOT NULL DEFAULT 0, taken_over INTEGER NOT NULL DEFAULT 0)",
            f'CREATE INDEX IF NOT EXISTS "{table_name}_expires_at" ON {table} (expires_at)',
        )
        # The whole claim condition lives in the upsert's WHERE: a row that is absent is
        # inserted; a row that is expired, or an in-progress claim past its lock, is
        # replaced; any other row is left alone and the statement changes nothing.
        # In DO UPDATE, the bare table name refers to the existing row, so ``taken_over``
        # records whether the replaced row was an in-progress (dead owner's) claim.
        self.claim = (
            f"INSERT INTO {table} ({_COLUMNS}, taken_over) VALUES (:key_hash, '{_IN_PROGRESS}', "
            ":fingerprint, :owner, :lock_expires_at, :expires_at, NULL, 0, 0, 0) "
            f"ON CONFLICT (key) DO UPDATE SET taken_over = ({table}.status = '{_IN_PROGRESS}'), "
            "status = excluded.status, fingerprint = excluded.fingerprint, "
            "owner = excluded.owner, lock_expires_at = excluded.lock_expires_at, "
            "expires_at = excluded.expires_at, response = NULL, response_size = 0, too_large = 0 "
            f"WHERE ({table}.status <> '{_IN_PROGRESS}' AND {table}.expires_at <= :now) "
            f"OR ({table}.status = '{_IN_PROGRESS}' AND {table}.lock_expires_at <= :stale_before)"
        )
        self.claim_returning = self.claim + " RETURNING taken_over"
        by_key = f"FROM {table} WHERE key = ?"
        self.taken_over = f"SELECT taken_over {by_key}"
        self.select = f"SELECT {_COLUMNS} {by_key}"
        self.complete = (
            f"UPDATE {table} SET status = :status, expires_at = :expires_at, "
            "response = :response, response_size = :response_size, too_large = :too_large "
            "WHERE key = :key AND owner = :owner"
        )
        # A deferred key's interim response: only over the claim still in progress (never
        # over the work's final response, which may land first); handed to another owner's
        # token (``:to``) when the work running is an earlier attempt's.
        self.complete_interim = (
            f"UPDATE {table} SET status = :status, expires_at = :expires_at, "
            "response = :response, response_size = :response_size, too_large = :too_large, "
            "owner = COALESCE(:to, owner) "
            f"WHERE key = :key AND owner = :owner AND status = '{_IN_PROGRESS}'"
        )
        self.owner = f"SELECT owner, status {by_key}"
        # The work's final response, or forgetting a deferred key, by a deferral token:
        # fenced by its owner, on a key not completed yet.
        self.complete_final = self.complete + f" AND status <> '{_COMPLETED}'"
        self.release_deferred = f"DELETE {by_key} AND owner = ? AND status <> '{_COMPLETED}'"
        # Only a claim still in progress: never a final response a deferral's worker stored
        # while the handler was still running.
        self.release = f"DELETE {by_key} AND owner = ? AND status = '{_IN_PROGRESS}'"
        self.renew = (
            f"UPDATE {table} SET lock_expires_at = :lock_expires_at, expires_at = :lock_expires_at "
            f"WHERE key = :key AND owner = :owner AND status = '{_IN_PROGRESS}'"
        )
        self.delete = f"DELETE {by_key}"
        # DELETE ... LIMIT needs a compile-time option; a rowid subquery bounds it anywhere.
        expired = (
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE expires_at <= ?"
        )
        self.purge = expired + " LIMIT ?)"
        # After a completion, whose time carries no clock-skew margin: finished rows only.
        self.purge_finished = expired + f" AND status <> '{_IN_PROGRESS}' LIMIT ?)"


@dataclass(eq=False)
class SQLiteOps:
    """The flows of one table; writes purge a batch when ``purges`` says."""

    sql: Statements
    use_returning: bool  # RETURNING (SQLite 3.35), else changes()
    max_response_bytes: int | None
    purges: PurgeSchedule
    busy_timeout_ms: int  # the connections' own, which a purge batch lowers for a while
    supports_deferral = True

    def claim(self, request: ClaimRequest) -> Steps[ClaimResult]:
        key = request.key_hash
        params = {name: getattr(request, name) for name in _CLAIM_FIELDS}
        # IMMEDIATE takes the write lock up front (waiting up to the busy timeout), so the
        # upsert and the read of a holding row see one consistent state.
        yield Statement("BEGIN IMMEDIATE")
        if self.use_returning:
            rows = (yield Statement(self.sql.claim_returning, params)).rows
            claimed = bool(rows)
            taken_over = claimed and bool(rows[0][0])
        else:
            claimed = (yield Statement(self.sql.claim, params)).changed == 1
            taken_over = claimed and bool((yield Statement(self.sql.taken_over, (key,))).rows[0][0])
        rows = [] if claimed else (yield Statement(self.sql.select, (key,))).rows
        yield Statement("COMMIT")
        if self.purges.due():  # (not a claim this one may not take over yet: its skew margin)
            yield Later(self.purge_batch(request.stale_before, self.sql.purge))
        if claimed:
            return Claimed(taken_over=taken_over)
        if not rows:  # cannot happen: the upsert conflicted with this very row
            raise StoreUnavailable(f"SQLite claim of {key!r} found no holding row")
        return Held(record_from_fields(*rows[0]))

    def _columns(self, response: StoredResponse, too_large: bool, size: int) -> Steps[Any]:
        """The response's columns (no blob when too large: streamed, over the limits)."""
        if len(response.body) > INLINE_MAX_BODY_BYTES:
            yield OFF_LOOP
        blob = kept_blob(response, too_large, self.max_response_bytes, _MAX_BLOB_BYTES)
        return {"response": blob, "response_size": size, "too_large": blob is None}

    def complete(self, completion: Completion) -> Steps[bool]:
        key, owner, response = completion.key_hash, completion.owner, completion.response
        params = yield from self._columns(response, completion.streamed, completion.body_size)
        status = Status.DEFERRED if completion.deferred else Status.COMPLETED
        params.update(key=key, owner=owner, status=status.value, expires_at=completion.expires_at)
        if not completion.deferred:
            updated = (yield Statement(self.sql.complete, params)).changed == 1
        else:
            to = completion.deferred_to
            params["to"] = to
            updated = (yield Statement(self.sql.complete_interim, params)).changed == 1
            if not updated:
                # Deferred already (this completion again) or completed by the work's final
                # response first: done either way, if the key is still ours (or, handed
                # over, the owner's it was handed to).
                rows = (yield Statement(self.sql.owner, (key,))).rows
                updated = bool(rows) and (
                    rows[0][0] == owner
                    or (to is not None and rows[0][0] == to and rows[0][1] != _IN_PROGRESS)
                )
        if self.purges.due():
            # (Finished rows only: an in-progress claim past its lock may still be inside
            # another host's clock-skew margin.)
            yield Later(self.purge_batch(completion.now, self.sql.purge_finished))
        return updated

    def complete_final(
        self, token: DeferredToken, response: StoredResponse, now: float
    ) -> Steps[bool]:
        params = yield from self._columns(response, False, len(response.body))
        params.update(key=token.key_hash, owner=token.owner, status=_COMPLETED)
        params["expires_at"] = float(token.expires_at)
        return (yield Statement(self.sql.complete_final, params)).changed == 1

    def release_unfinished(self, token: DeferredToken) -> Steps[bool]:
        statement = Statement(self.sql.release_deferred, (token.key_hash, token.owner))
        return (yield statement).changed == 1

    def release(self, key_hash: str, owner: str) -> Steps[bool]:
        return (yield Statement(self.sql.release, (key_hash, owner))).changed == 1

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> Steps[bool]:
        params = {"key": key_hash, "owner": owner, "lock_expires_at": lock_expires_at}
        return (yield Statement(self.sql.renew, params)).changed == 1

    def get(self, key_hash: str) -> Steps[Record | None]:
        rows = (yield Statement(self.sql.select, (key_hash,))).rows
        return record_from_fields(*rows[0]) if rows else None

    def delete(self, key_hash: str) -> Steps[bool]:
        return (yield Statement(self.sql.delete, (key_hash,))).changed > 0

    def check(self) -> Steps[None]:
        """The file is a database (the transport opens it as it is, never creating it)."""
        yield Statement("SELECT count(*) FROM sqlite_master")

    def create_table(self) -> Steps[None]:
        yield OFF_LOOP
        for statement in self.sql.schema:
            yield Statement(statement)

    def purge(self, cutoff: float, batch_size: int) -> Steps[int]:
        """Every row expired at ``cutoff``, in batches of ``batch_size``; the count."""
        batch = Statement(self.sql.purge, (cutoff, batch_size))
        return (yield from purge_all(batch, batch_size, attrgetter("changed")))

    def purge_batch(self, cutoff: float, statement: str) -> Steps[None]:
        """One bounded batch of ``statement`` (rows expired at ``cutoff``), after a write."""
        # The write it rides on has committed and its request is waiting: the purge does
        # not queue for another worker's lock, it skips to the next interval instead.
        yield Statement(f"PRAGMA busy_timeout = {_PURGE_BUSY_TIMEOUT_MS}")
        try:
            deleted = (yield Statement(statement, (cutoff, self.purges.batch_size))).changed
        except sqlite3.Error as error:
            logger.debug("SQLite %s skipped: %s", PURGE, error)
            deleted = 0
        yield Statement(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        self.purges.purged(deleted, logger)
