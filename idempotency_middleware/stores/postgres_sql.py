"""What ``PostgresStore`` sends, and what it makes of the answers: no I/O here.

Each store operation is a *flow*: a generator that yields the statements to run, one at a
time, receives each one's :class:`Answer`, and returns the operation's result. The sync and
the async transports of ``postgres.py`` only send (the flow idea of httpx's auth), so the
decisions are written once. Almost every flow is a single statement; the claim adds a
second one only in the rare race described in :func:`claim`.

Table layout (one row per key hash)::

    key              text              primary key: the key hash the middleware claims
    status           text              "in_progress" | "deferred" | "completed"
    fingerprint      text              sha256 of the request
    owner            text              token of the claim that wrote the row (fencing)
    lock_expires_at  double precision  epoch seconds (the requests' clock, never the server's)
    expires_at       double precision  epoch seconds; indexed, for the purge
    response         bytea             records.encode_response, once completed
    response_size    bigint            body size in bytes
    too_large        boolean           completed, but the body was not kept
    taken_over       boolean           this claim replaced a stale in-progress claim
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple, TypeVar

from ..records import Record, Status, StoredResponse, decode_response, encode_response
from .base import CLAIMED, TAKEN_OVER, ClaimRequest, ClaimResult, Completion, Held
from .base import StoreUnavailable as StoreUnavailable

T = TypeVar("T")

# A plain identifier, optionally schema-qualified; quoted when used.
_TABLE_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,50}")

# bytea values are limited to 1 GB; a larger encoded response is completed as "not stored".
MAX_BYTEA_BYTES = 1_000_000_000

# How many times a claim reruns when each run raced a concurrent write (see ``claim``).
CLAIM_ATTEMPTS = 5

_IN_PROGRESS = Status.IN_PROGRESS.value
_COMPLETED = Status.COMPLETED.value
_COLUMNS = (
    "key, status, fingerprint, owner, lock_expires_at, expires_at, "
    "response, response_size, too_large, taken_over"
)


class Statement(NamedTuple):
    """One statement to send, with its parameters."""

    query: str
    params: dict[str, Any] | tuple[Any, ...]


class Answer(NamedTuple):
    """What the server said to a statement: its rows (empty without any) and row count."""

    rows: Sequence[tuple[Any, ...]]
    rowcount: int


Flow = Generator[Statement, Answer, T]


def check_table_name(table: str) -> str:
    """``table`` quoted for SQL (``"name"`` or ``"schema"."name"``); ``ValueError`` unless
    it is a plain identifier."""
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise ValueError(
            f"table must be a plain SQL identifier, optionally schema-qualified, not {table!r}"
        )
    return ".".join(f'"{part}"' for part in table.split("."))


class Statements:
    """The SQL for one table."""

    def __init__(self, table: str) -> None:
        quoted = check_table_name(table)
        self.table = table
        bare = table.rsplit(".", 1)[-1]
        schema = f'"{table.split(".")[0]}".' if "." in table else ""
        self.index_name = f"{bare}_expires_at"
        self.create_table = (
            f"CREATE TABLE IF NOT EXISTS {quoted} ("
            "key text PRIMARY KEY, "
            "status text NOT NULL, "
            "fingerprint text NOT NULL, "
            "owner text NOT NULL, "
            "lock_expires_at double precision NOT NULL, "
            "expires_at double precision NOT NULL, "
            "response bytea, "
            "response_size bigint NOT NULL DEFAULT 0, "
            "too_large boolean NOT NULL DEFAULT false, "
            "taken_over boolean NOT NULL DEFAULT false)"
        )
        self.create_index = (
            f'CREATE INDEX IF NOT EXISTS "{self.index_name}" ON {quoted} (expires_at)'
        )
        # Creators of the same table queue on one advisory lock, so two of them never race
        # on the catalogs (CREATE ... IF NOT EXISTS alone can fail with a unique violation
        # on pg_type when two sessions create the same table at once).
        self.create_lock = "SELECT pg_advisory_xact_lock(1768189257, hashtext(%s))"
        # Whether both exist already: a role without CREATE on the schema can then still
        # call create_table() (the DDL would be refused before IF NOT EXISTS is looked at).
        self.schema_exists = "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL"
        self.schema_names = (quoted, f'{schema}"{self.index_name}"')
        claimable = (
            f"(r.status <> '{_IN_PROGRESS}' AND r.expires_at <= %(now)s) "
            f"OR (r.status = '{_IN_PROGRESS}' AND r.lock_expires_at <= %(stale)s)"
        )
        # The claim, one statement. The upsert inserts an absent key or replaces a
        # claimable row (``taken_over`` says whether the replaced row was an in-progress
        # claim: in DO UPDATE, ``r`` is the existing row); RETURNING reports it. When the
        # upsert does not apply, the second branch returns the holding row in the same
        # round trip. It reads the statement's snapshot, which may predate the row (see
        # ``claim``).
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
            "NULL::bytea, NULL::bigint, NULL::boolean FROM claimed "
            "UNION ALL "
            "SELECT false, false, status, fingerprint, owner, lock_expires_at, expires_at, "
            f"response, response_size, too_large FROM {quoted} "
            "WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM claimed)"
        )
        self.select = (
            "SELECT key, status, fingerprint, owner, lock_expires_at, expires_at, "
            f"response, response_size, too_large FROM {quoted} WHERE key = %s"
        )
        finish = (
            f"UPDATE {quoted} SET status = %(status)s, expires_at = %(expires_at)s, "
            "response = %(response)s, response_size = %(response_size)s, "
            "too_large = %(too_large)s WHERE key = %(key)s AND owner = %(owner)s"
        )
        self.complete = finish
        # A deferred key's interim response, only over the claim still in progress (never
        # over the work's final response, which may land first); true when it was stored,
        # or when the key is still ours anyway (deferred already, or finished first).
        self.complete_interim = (
            f"WITH done AS ({finish} AND status = '{_IN_PROGRESS}' RETURNING 1) "
            "SELECT EXISTS (SELECT 1 FROM done) "
            f"OR EXISTS (SELECT 1 FROM {quoted} WHERE key = %(key)s AND owner = %(owner)s)"
        )
        # A deferral token's final response: fenced by the owner, on a key not completed.
        self.complete_final = f"{finish} AND status <> '{_COMPLETED}'"
        self.release_deferred = (
            f"DELETE FROM {quoted} WHERE key = %s AND owner = %s AND status <> '{_COMPLETED}'"
        )
        # Only a claim still in progress: never a final response a deferral's worker stored
        # while the handler was still running.
        self.release = (
            f"DELETE FROM {quoted} WHERE key = %s AND owner = %s AND status = '{_IN_PROGRESS}'"
        )
        self.renew = (
            f"UPDATE {quoted} SET lock_expires_at = %(lock_expires_at)s, "
            "expires_at = %(lock_expires_at)s "
            f"WHERE key = %(key)s AND owner = %(owner)s AND status = '{_IN_PROGRESS}'"
        )
        self.delete = f"DELETE FROM {quoted} WHERE key = %s"
        # A bounded batch: the keys of at most ``limit`` expired rows, skipping rows a claim
        # holds locked (a purge never waits for one), deleted by primary key with the
        # condition checked again on each row's latest version (a key reclaimed meanwhile
        # stays).
        self.purge = self._purge(quoted, "")
        # After a completion, whose time carries no clock-skew margin: finished rows only.
        self.purge_finished = self._purge(quoted, f" AND status <> '{_IN_PROGRESS}'")

    @staticmethod
    def _purge(quoted: str, extra: str) -> str:
        return (
            f"DELETE FROM {quoted} WHERE key = ANY(ARRAY("
            f"SELECT key FROM {quoted} WHERE expires_at <= %(cutoff)s{extra} "
            "LIMIT %(limit)s FOR UPDATE SKIP LOCKED)) "
            f"AND expires_at <= %(cutoff)s{extra}"
        )


def row_to_record(row: Sequence[Any]) -> Record:
    """A ``Record`` from a row of ``Statements.select``'s columns."""
    key_hash, status, fingerprint, owner, lock_expires_at, expires_at, blob, size, too_large = row
    return Record(
        key_hash,
        Status(status),
        fingerprint,
        owner,
        float(lock_expires_at),
        float(expires_at),
        decode_response(bytes(blob)) if blob is not None else None,
        bool(too_large),
        int(size),
    )


def encoded(
    response: StoredResponse, streamed: bool, max_response_bytes: int | None
) -> tuple[bytes | None, bool]:
    """The response's bytea value, or ``None`` and "too large" (streamed, over the limits)."""
    if streamed or (max_response_bytes is not None and len(response.body) > max_response_bytes):
        return None, True
    blob = encode_response(response)
    if len(blob) > MAX_BYTEA_BYTES:
        return None, True
    return blob, False


# -- flows ------------------------------------------------------------------------------


def claim(sql: Statements, request: ClaimRequest) -> Flow[ClaimResult]:
    """Claim in one statement; ``Held`` with the holding row from the same statement.

    Under READ COMMITTED, a conflicting row is locked and the upsert's WHERE is evaluated on
    its latest version, but the statement's second branch reads its snapshot, taken when
    the statement began. When a concurrent transaction inserted or changed the row and
    committed meanwhile, that branch returns nothing (a row inserted after the snapshot) or
    an older version of the row, which, being claimable where the latest was not, is told
    apart: then the statement runs again with a new snapshot (bounded: it takes a write
    committed during each run to need another).
    """
    params = {
        "key": request.key_hash,
        "fingerprint": request.fingerprint,
        "owner": request.owner,
        "lock_expires_at": request.lock_expires_at,
        "now": request.now,
        "stale": request.stale_before,
    }
    for _ in range(CLAIM_ATTEMPTS):
        rows = (yield Statement(sql.claim, params)).rows
        if rows:
            claimed, taken_over, *holding = rows[0]
            if claimed:
                return TAKEN_OVER if taken_over else CLAIMED
            record = row_to_record([request.key_hash, *holding])
            if not record.is_claimable(request.now, request.clock_skew_seconds):
                return Held(record)
    raise StoreUnavailable(
        f"PostgreSQL claim of {request.key_hash!r} raced a concurrent write "
        f"{CLAIM_ATTEMPTS} times in a row",
        cause="write_conflict",
        reason=f"the row of {request.key_hash!r} changed under each of {CLAIM_ATTEMPTS} claims",
    )


def complete(sql: Statements, completion: Completion, max_response_bytes: int | None) -> Flow[bool]:
    """Store the response, fenced by the owner (a deferral's interim one: see SQL)."""
    blob, too_large = encoded(completion.response, completion.streamed, max_response_bytes)
    params = {
        "key": completion.key_hash,
        "owner": completion.owner,
        "status": (Status.DEFERRED if completion.deferred else Status.COMPLETED).value,
        "expires_at": completion.expires_at,
        "response": blob,
        "response_size": completion.body_size,
        "too_large": too_large,
    }
    if not completion.deferred:
        return (yield Statement(sql.complete, params)).rowcount == 1
    return bool((yield Statement(sql.complete_interim, params)).rows[0][0])


def complete_final(
    sql: Statements,
    key_hash: str,
    owner: str,
    expires_at: float,
    response: StoredResponse,
    max_response_bytes: int | None,
) -> Flow[bool]:
    """A deferral token's final response."""
    blob, too_large = encoded(response, False, max_response_bytes)
    params = {
        "key": key_hash,
        "owner": owner,
        "status": _COMPLETED,
        "expires_at": expires_at,
        "response": blob,
        "response_size": len(response.body),
        "too_large": too_large,
    }
    return (yield Statement(sql.complete_final, params)).rowcount == 1


def one(statement: str, params: dict[str, Any] | tuple[Any, ...]) -> Flow[int]:
    """A single statement; its row count."""
    return (yield Statement(statement, params)).rowcount


def get(sql: Statements, key_hash: str) -> Flow[Record | None]:
    rows = (yield Statement(sql.select, (key_hash,))).rows
    return row_to_record(rows[0]) if rows else None


def create_table(sql: Statements) -> Flow[None]:
    """Create the table and its index unless both exist, serialized by an advisory lock.

    Runs inside a transaction (the advisory lock is the transaction's)."""
    if (yield Statement(sql.schema_exists, sql.schema_names)).rows[0][0]:
        return
    yield Statement(sql.create_lock, (sql.table,))
    yield Statement(sql.create_table, ())
    yield Statement(sql.create_index, ())


def purge(statement: str, cutoff: float, limit: int, batches: int | None) -> Flow[int]:
    """Delete expired rows in batches of ``limit`` (at most ``batches`` of them); the count."""
    total = 0
    done = 0
    while batches is None or done < batches:
        deleted = (yield Statement(statement, {"cutoff": cutoff, "limit": limit})).rowcount
        total += deleted
        done += 1
        if deleted < limit:
            break
    return total
