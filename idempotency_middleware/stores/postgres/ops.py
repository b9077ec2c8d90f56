"""What ``PostgresStore`` sends and makes of the answers, no I/O: each operation is a flow
(``kit.Flow``) of :class:`Statement` s, each answered with an :class:`Answer` (or its
failure, as ``StoreUnavailable``, thrown in at its ``yield``). The transport runs a whole
flow on one connection, so sync and async share every decision."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Generator, Sequence
from operator import attrgetter
from typing import Any, NamedTuple, TypeVar

from ...clock import Clock
from ..kit import Flow as AnyFlow
from ..kit import PurgeSchedule, kept_blob, purge_all
from ..protocol import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    ClaimResult,
    Completion,
    DeferredToken,
    Held,
)
from ..protocol import StoreUnavailable as StoreUnavailable
from ..records import Record, Status, StoredResponse, record_from_fields

T = TypeVar("T")
logger = logging.getLogger(__name__)

# A plain identifier, optionally schema-qualified; quoted when used.
_TABLE_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,50}")

# bytea values are limited to 1 GB; a larger encoded response is completed as "not stored".
MAX_BYTEA_BYTES = 1_000_000_000

# How many times a claim reruns when each run raced a concurrent write (see ``claim``).
CLAIM_ATTEMPTS = 5

# SQLSTATEs of a CREATE racing another session's (unique_violation on pg_type or pg_class,
# duplicate_table, duplicate_object): the other one created it, so creating again finds it.
CREATE_RACES = frozenset({"23505", "42P07", "42710"})
CREATE_ATTEMPTS = 3

_IN_PROGRESS = Status.IN_PROGRESS.value
_COMPLETED = Status.COMPLETED.value
# One row per key hash; times are epoch seconds of the requests' clock, never the server's.
_TABLE = (
    "key text PRIMARY KEY",  # the key hash the middleware claims
    "status text NOT NULL",  # "in_progress" | "deferred" | "completed"
    "fingerprint text NOT NULL",  # sha256 of the request
    "owner text NOT NULL",  # token of the claim that wrote the row (fencing)
    "lock_expires_at double precision NOT NULL",
    "expires_at double precision NOT NULL",  # indexed, for the purge
    "response bytea",  # records.encode_response, once completed
    "response_size bigint NOT NULL DEFAULT 0",  # body size in bytes
    "too_large boolean NOT NULL DEFAULT false",  # completed, but the body was not kept
    "taken_over boolean NOT NULL DEFAULT false",  # the claim replaced a stale in-progress one
)
_COLUMNS = ", ".join(column.split()[0] for column in _TABLE)
# A record's columns, in the order of records.record_from_fields' arguments.
_RECORD = (
    "status, fingerprint, owner, lock_expires_at, expires_at, response, too_large, response_size"
)


class Statement(NamedTuple):
    """One statement to send, with its parameters."""

    query: str
    params: dict[str, Any] | tuple[Any, ...]


class Answer(NamedTuple):
    """What the server said to a statement: its rows (empty without any) and row count."""

    rows: Sequence[tuple[Any, ...]]
    rowcount: int


StatementFlow = Generator[Statement, Answer, T]


class InTransaction(NamedTuple):
    """``flow`` in one transaction: answered with its result, or its failure (rolled back)."""

    flow: StatementFlow[Any]


class Statements:
    """The SQL for one table; ``ValueError`` unless its name is a plain identifier."""

    def __init__(self, table: str) -> None:
        if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
            raise ValueError(
                f"table must be a plain SQL identifier, optionally schema-qualified, not {table!r}"
            )
        quoted = ".".join(f'"{part}"' for part in table.split("."))
        self.table = table
        bare = table.rsplit(".", 1)[-1]
        schema = f'"{table.split(".")[0]}".' if "." in table else ""
        self.index_name = index = f"{bare}_expires_at"
        self.create_table = f"CREATE TABLE IF NOT EXISTS {quoted} ({', '.join(_TABLE)})"
        self.create_index = f'CREATE INDEX IF NOT EXISTS "{index}" ON {quoted} (expires_at)'
        # Creators of a table queue on an advisory lock: CREATE ... IF NOT EXISTS alone can
        # fail with a unique violation on pg_type when two sessions create it at once.
        self.create_lock = "SELECT pg_advisory_xact_lock(1768189257, hashtext(%s))"
        # Whether both exist already: a role without CREATE on the schema can then still
        # call create_table() (the DDL would be refused before IF NOT EXISTS is looked at).
        self.schema_exists = "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL"
        self.schema_names = (quoted, f'{schema}"{self.index_name}"')
        claimable = (
            f"(r.status <> '{_IN_PROGRESS}' AND r.expires_at <= %(now)s) "
            f"OR (r.status = '{_IN_PROGRESS}' AND r.lock_expires_at <= %(stale)s)"
        )
        # The upsert inserts an absent key or replaces a claimable row (in DO UPDATE, ``r``
        # is the existing row: ``taken_over`` if it was in progress); else the second branch
        # returns the holding row, from the statement's snapshot (see ``claim``).
        self.claim = (
            f"WITH claimed AS (INSERT INTO {quoted} AS r ({_COLUMNS}) "
            f"VALUES (%(key)s, '{_IN_PROGRESS}', %(fingerprint)s, %(owner)s, "
            "%(lock_expires_at)s, %(lock_expires_at)s, NULL, 0, false, false) "
            "ON CONFLICT (key) DO UPDATE SET "
            f"taken_over = (r.status = '{_IN_PROGRESS}'), "
            "status = excluded.status, fingerprint = excluded.fingerprint, "
            "owner = excluded.owner, lock_expires_at = excluded.lock_expires_at, "
            "expires_at = excluded.expires_at, "
            "response = NULL, response_size = 0, too_large = false "
            f"WHERE {claimable} "
            "RETURNING r.taken_over) "
            "SELECT true, taken_over, NULL, NULL, NULL, NULL::float8, NULL::float8, "
            "NULL::bytea, NULL::boolean, NULL::bigint FROM claimed "
            f"UNION ALL SELECT false, false, {_RECORD} FROM {quoted} "
            "WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM claimed)"
        )
        # Completions and releases notify the key on one channel per table, in their own
        # transaction (delivered on commit): a waiter on it is woken (wakeups.py).
        digest = hashlib.sha1(table.encode(), usedforsecurity=False).hexdigest()[:16]
        self.channel = f"idempotency_{digest}"
        notify = f" RETURNING pg_notify('{self.channel}', key)"
        self.select = f"SELECT key, {_RECORD} FROM {quoted} WHERE key = %s"
        store_response = (
            f"UPDATE {quoted} SET status = %(status)s, expires_at = %(expires_at)s, "
            "response = %(response)s, response_size = %(response_size)s, "
            "too_large = %(too_large)s"
        )
        of_owner = " WHERE key = %(key)s AND owner = %(owner)s"
        finish = store_response + of_owner
        self.complete = finish + notify
        # A deferred key's interim response, only over the claim still in progress (never
        # over the work's final response, which may land first), handed to another owner's
        # token (``to``) when the work running is an earlier attempt's; true when it was
        # stored, or when the key is still ours anyway (deferred already, or finished
        # first), or already handed over and no longer in progress.
        interim = f"{store_response}, owner = COALESCE(%(to)s, owner){of_owner}"
        self.complete_interim = (
            f"WITH done AS ({interim} AND status = '{_IN_PROGRESS}' RETURNING 1) "
            "SELECT EXISTS (SELECT 1 FROM done) "
            f"OR EXISTS (SELECT 1 FROM {quoted} WHERE key = %(key)s AND (owner = %(owner)s "
            f"OR (owner = %(to)s AND status <> '{_IN_PROGRESS}')))"
        )
        # A deferral token's final response: fenced by the owner, on a key not completed.
        self.complete_final = f"{finish} AND status <> '{_COMPLETED}'{notify}"
        owned = f"DELETE FROM {quoted} WHERE key = %s AND owner = %s AND status "
        self.release_deferred = f"{owned}<> '{_COMPLETED}'{notify}"
        # Only a claim still in progress: never a final response a deferral's worker stored
        # while the handler was still running.
        self.release = f"{owned}= '{_IN_PROGRESS}'{notify}"
        self.renew = (
            f"UPDATE {quoted} SET lock_expires_at = %(lock_expires_at)s, "
            "expires_at = %(lock_expires_at)s "
            f"WHERE key = %(key)s AND owner = %(owner)s AND status = '{_IN_PROGRESS}'"
        )
        self.delete = f"DELETE FROM {quoted} WHERE key = %s"
        self.check = f"SELECT {_COLUMNS} FROM {quoted} LIMIT 0"
        # A bounded batch: the keys of at most ``limit`` expired rows, skipping rows a claim
        # holds locked (a purge never waits for one), deleted by primary key with the
        # condition checked again on each row's latest version (a key reclaimed meanwhile
        # stays). After a completion, whose time carries no clock-skew margin: finished rows.
        self.purge, self.purge_finished = (
            f"DELETE FROM {quoted} WHERE key = ANY(ARRAY("
            f"SELECT key FROM {quoted} WHERE expires_at <= %(cutoff)s{extra} "
            "LIMIT %(limit)s FOR UPDATE SKIP LOCKED)) "
            f"AND expires_at <= %(cutoff)s{extra}"
            for extra in ("", f" AND status <> '{_IN_PROGRESS}'")
        )


def piggybacked(purge: str, cutoff: float, limit: int) -> StatementFlow[int]:
    """A purge batch riding on a (done) write: its row count, 0 if it failed (left to the next)."""
    try:
        return (yield Statement(purge, {"cutoff": cutoff, "limit": limit})).rowcount
    except StoreUnavailable as error:
        logger.debug("PostgreSQL purge of expired records failed: %s", error.reason)
        return 0


class PostgresOps:
    """The store's flows (``kit.Operations``) on one table; writes purge when ``purges`` says."""

    supports_deferral = True

    def __init__(
        self,
        sql: Statements,
        max_response_bytes: int | None,
        purge_interval: float | None,
        purge_batch: int,
        clock: Clock,
    ) -> None:
        self.sql = sql
        self._max_response_bytes = max_response_bytes
        self._purges = PurgeSchedule(purge_interval, purge_batch, clock)

    def claim(self, request: ClaimRequest) -> StatementFlow[ClaimResult]:
        """Claim in one statement. Under READ COMMITTED its second branch (the holding row) reads
        the statement's snapshot: after a concurrent commit it returns nothing or an older,
        claimable version, and the claim runs again (each rerun needs another such commit)."""
        params = {
            "key": request.key_hash,
            "fingerprint": request.fingerprint,
            "owner": request.owner,
            "lock_expires_at": request.lock_expires_at,
            "now": request.now,
            "stale": request.stale_before,
        }
        for _ in range(CLAIM_ATTEMPTS):
            rows = (yield Statement(self.sql.claim, params)).rows
            if rows:
                claimed, taken_over, *holding = rows[0]
                if claimed:
                    yield from self._purge_due(request.stale_before, self.sql.purge)
                    return TAKEN_OVER if taken_over else CLAIMED
                record = record_from_fields(request.key_hash, *holding)
                if not record.is_claimable(request.now, request.clock_skew_seconds):
                    yield from self._purge_due(request.stale_before, self.sql.purge)
                    return Held(record)
        raise StoreUnavailable(
            f"PostgreSQL claim of {request.key_hash!r} raced a concurrent write "
            f"{CLAIM_ATTEMPTS} times in a row",
            cause="write_conflict",
            reason=f"the row of {request.key_hash!r} changed under each of {CLAIM_ATTEMPTS} claims",
        )

    def complete(self, completion: Completion) -> StatementFlow[bool]:
        """Store the response, fenced by the owner (a deferral's interim one: see SQL)."""
        status = Status.DEFERRED if completion.deferred else Status.COMPLETED
        params = self._finish(completion, completion.response, status)
        params.update(expires_at=completion.expires_at, response_size=completion.body_size)
        if completion.deferred:
            params["to"] = completion.deferred_to
            done = bool((yield Statement(self.sql.complete_interim, params)).rows[0][0])
        else:
            done = (yield Statement(self.sql.complete, params)).rowcount == 1
        yield from self._purge_due(completion.now, self.sql.purge_finished)
        return done

    def complete_final(
        self, token: DeferredToken, response: StoredResponse, now: float
    ) -> StatementFlow[bool]:
        params = self._finish(token, response, Status.COMPLETED)
        params["expires_at"] = float(token.expires_at)
        return (yield Statement(self.sql.complete_final, params)).rowcount == 1

    def _finish(
        self, of: Completion | DeferredToken, response: StoredResponse, status: Status
    ) -> dict[str, Any]:
        """The parameters of a finishing write (the body not kept: ``kit.kept_blob``)."""
        streamed = isinstance(of, Completion) and of.streamed
        blob = kept_blob(response, streamed, self._max_response_bytes, MAX_BYTEA_BYTES)
        return {
            "key": of.key_hash,
            "owner": of.owner,
            "status": status.value,
            "response": blob,
            "response_size": len(response.body),
            "too_large": blob is None,
        }

    def release(self, key_hash: str, owner: str) -> StatementFlow[bool]:
        return (yield Statement(self.sql.release, (key_hash, owner))).rowcount == 1

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> StatementFlow[bool]:
        params = {"key": key_hash, "owner": owner, "lock_expires_at": lock_expires_at}
        return (yield Statement(self.sql.renew, params)).rowcount == 1

    def release_unfinished(self, token: DeferredToken) -> StatementFlow[bool]:
        return (
            yield Statement(self.sql.release_deferred, (token.key_hash, token.owner))
        ).rowcount == 1

    def get(self, key_hash: str) -> StatementFlow[Record | None]:
        rows = (yield Statement(self.sql.select, (key_hash,))).rows
        return record_from_fields(*rows[0]) if rows else None

    def delete(self, key_hash: str) -> StatementFlow[bool]:
        return (yield Statement(self.sql.delete, (key_hash,))).rowcount > 0

    def check(self) -> StatementFlow[None]:
        """The table exists with the store's columns, and the role may read it."""
        try:
            yield Statement(self.sql.check, ())
        except StoreUnavailable as error:
            if error.code != "42703":  # undefined_column: another table under its name
                raise
            reason = f"table {self.sql.table!r} lacks the store's columns ({error.reason})"
            raise StoreUnavailable(
                str(error), code=error.code, cause="bad_schema", reason=reason
            ) from error

    def create_table(self) -> AnyFlow[None]:
        """Create the table and its index unless both exist, in a transaction serialized by
        an advisory lock (the transaction's); in a new one when it raced another session."""
        for attempt in range(CREATE_ATTEMPTS):
            try:
                yield InTransaction(self._create())
                return
            except StoreUnavailable as error:
                if error.code not in CREATE_RACES or attempt == CREATE_ATTEMPTS - 1:
                    raise

    def _create(self) -> StatementFlow[None]:
        sql = self.sql
        if not (yield Statement(sql.schema_exists, sql.schema_names)).rows[0][0]:
            yield Statement(sql.create_lock, (sql.table,))
            yield Statement(sql.create_table, ())
            yield Statement(sql.create_index, ())

    def purge_expired(self, cutoff: float) -> StatementFlow[int]:
        size = self._purges.batch_size
        batch = Statement(self.sql.purge, {"cutoff": cutoff, "limit": size})
        return (yield from purge_all(batch, size, attrgetter("rowcount")))

    def _purge_due(self, cutoff: float, statement: str) -> StatementFlow[None]:
        if self._purges.due():
            deleted = yield from piggybacked(statement, cutoff, self._purges.batch_size)
            self._purges.purged(deleted, logger)
