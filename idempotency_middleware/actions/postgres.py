"""One-time actions on a ``PostgresStore``: a table of their own beside the store's
(``<table>_actions``, in the same schema), made on first use, through the store's pools.

Every step is one statement on an autocommit connection: an ``INSERT ... ON CONFLICT DO
UPDATE ... WHERE`` or an ``UPDATE ... WHERE <the step's condition>``, in a ``WITH`` whose
main query returns the written row, or, when the condition did not hold, the row as the
statement found it: why a consume failed comes from the same round trip, never from a
second read. Under READ COMMITTED the write sees the row's latest version but that sibling
``SELECT`` reads the statement's snapshot, which may predate a write committed while the
statement waited for the row: a row that would have met the condition can only be such an
older version, so the statement then runs again on a new snapshot (once, in practice:
consumed, canceled and locked are final). Times are the store clock's, never the server's.

The table is created when a step finds it missing (``42P01``), or by
:meth:`PostgresActions.create_table`: in a transaction holding an advisory lock on its name,
so creators queue instead of racing on the catalogs, then ``CREATE ... IF NOT EXISTS``;
safe to run twice, and from several processes at once. Rows past ``purge_at`` are answered
as absent at once; a bounded purge (the store's ``purge_batch_size`` rows, skipping rows
others hold locked) rides on a create at most once per the store's
``purge_interval_seconds`` (``None``: never).

Table layout (one row per action; times are epoch seconds)::

    action_id        text              primary key
    created_at       double precision
    active_at        double precision
    expires_at       double precision
    purge_at         double precision  indexed, for the purge
    data             text              the caller's JSON
    pin_hash         text              scrypt$n$r$p$<base64>, NULL without a PIN
    attempts_left    integer           NULL without a PIN
    consumed_at      double precision
    consumed_reason  text
    canceled_at      double precision
    created_by       text              the create's nonce
    consumed_by      text              the consume's nonce (NULL until consumed)

A table made by an earlier version lacks the last two columns: a step that finds one
missing (``42703``) runs the creation again, which adds them (``ADD COLUMN IF NOT EXISTS``).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from typing import Any

from ..stores.postgres import PostgresStore
from ..stores.postgres.ops import (
    InTransaction,
    Statement,
    StatementFlow,
    StoreUnavailable,
    piggybacked,
)
from .model import ADDED_FIELDS, RECORD_FIELDS, ActionRecord
from .steps import Cancel, Consume, Insert, Read, SpendAttempt, Step, Written, apply

# The SQLSTATE of a statement on a table that does not exist (undefined_table).
UNDEFINED_TABLE = "42P01"
# ... and on a column that does not exist (undefined_column): a table of an earlier version.
UNDEFINED_COLUMN = "42703"

# How many times a step runs when each run raced a write committed meanwhile.
STEP_ATTEMPTS = 5

# The advisory lock class of table creators (the store's own, keyed by another name).
_CREATE_LOCK_CLASS = 1768189257

COLUMNS = RECORD_FIELDS
ADDED_COLUMNS = ADDED_FIELDS
_LIST = ", ".join(COLUMNS)

# Open: neither consumed nor canceled, not expired (ActionRecord.is_open).
_OPEN = "consumed_at IS NULL AND canceled_at IS NULL AND expires_at > %(now)s"


class ActionStatements:
    """The SQL for the actions table of the store table ``store_table`` (which the store
    checked: a plain identifier, optionally schema-qualified)."""

    def __init__(self, store_table: str) -> None:
        schema, _, bare = store_table.rpartition(".")
        self.name = f"{store_table}_actions"
        qualifier = f'"{schema}".' if schema else ""
        table = self.table = f'{qualifier}"{bare}_actions"'
        index = f"{bare}_actions_purge_at"
        self.schema_exists = (
            "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL "
            "AND (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            f"AND attname IN ({', '.join(repr(c) for c in ADDED_COLUMNS)}) "
            f"AND NOT attisdropped) = {len(ADDED_COLUMNS)}"
        )
        self.schema_names = (table, f'{qualifier}"{index}"', table)
        self.create_lock = f"SELECT pg_advisory_xact_lock({_CREATE_LOCK_CLASS}, hashtext(%s))"
        self.create_table = (
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "action_id text PRIMARY KEY, "
            "created_at double precision NOT NULL, "
            "active_at double precision NOT NULL, "
            "expires_at double precision NOT NULL, "
            "purge_at double precision NOT NULL, "
            "data text NOT NULL, "
            "pin_hash text, "
            "attempts_left integer, "
            "consumed_at double precision, "
            "consumed_reason text, "
            "canceled_at double precision, "
            "created_by text, "
            "consumed_by text)"
        )
        self.add_columns = f"ALTER TABLE {table} " + ", ".join(
            f"ADD COLUMN IF NOT EXISTS {column} text" for column in ADDED_COLUMNS
        )
        self.create_index = f'CREATE INDEX IF NOT EXISTS "{index}" ON {table} (purge_at)'
        self.select = f"SELECT {_LIST} FROM {table} WHERE action_id = %s"
        values = ", ".join(f"%({column})s" for column in COLUMNS)
        replace = ", ".join(f"{column} = excluded.{column}" for column in COLUMNS[1:])
        # A free id: absent, or its old action past its retention (not purged yet).
        self.insert = self._written(
            f"INSERT INTO {table} AS a ({_LIST}) VALUES ({values}) "
            f"ON CONFLICT (action_id) DO UPDATE SET {replace} WHERE a.purge_at <= %(now)s"
        )
        update = f"UPDATE {table} SET"
        where = f"WHERE action_id = %(action_id)s AND {_OPEN}"
        consume = (
            f"{update} consumed_at = %(now)s, consumed_reason = %(reason)s, "
            "consumed_by = %(nonce)s "
            f"{where} AND active_at <= %(now)s AND "
        )
        self.consume = self._written(consume + "pin_hash IS NULL")
        self.consume_with_pin = self._written(
            consume + "pin_hash = %(pin_hash)s AND attempts_left > 0"
        )
        # Fenced by the count itself: concurrent wrong guesses each take one attempt, and
        # none is taken once it reaches 0.
        self.spend_attempt = self._written(
            f"{update} attempts_left = attempts_left - 1 {where} AND attempts_left > 0"
        )
        self.cancel = self._written(f"{update} canceled_at = %(now)s {where}")
        # A bounded batch, skipping rows others hold locked (it never waits for one): the
        # ids of at most ``limit`` forgotten actions, deleted with the condition checked
        # again on each row's latest version (an id created again meanwhile stays).
        self.purge = (
            f"DELETE FROM {table} WHERE action_id = ANY(ARRAY("
            f"SELECT action_id FROM {table} WHERE purge_at <= %(cutoff)s "
            "LIMIT %(limit)s FOR UPDATE SKIP LOCKED)) AND purge_at <= %(cutoff)s"
        )

    def _written(self, write: str) -> str:
        """``write`` as one statement answering ``(true, the row written)`` or, when it
        did not apply, ``(false, the row as the statement's snapshot has it)`` (no row:
        absent)."""
        return (
            f"WITH written AS ({write} RETURNING {_LIST}) "
            f"SELECT true, {_LIST} FROM written "
            "UNION ALL "
            f"SELECT false, {_LIST} FROM {self.table} "
            "WHERE action_id = %(action_id)s AND NOT EXISTS (SELECT 1 FROM written)"
        )


# -- what each step sends, and what it answered (no I/O) ----------------------------------------


def _record(row: Sequence[Any]) -> ActionRecord:
    return ActionRecord(**dict(zip(COLUMNS, row, strict=True)))


def step_flow(sql: ActionStatements, step: Step) -> StatementFlow[Written]:
    """Carry out ``step``: one statement (again when it raced a concurrent write)."""
    if isinstance(step, Read):
        rows = (yield Statement(sql.select, (step.action_id,))).rows
        return Written(True, _record(rows[0]) if rows else None)
    params: dict[str, Any] = {"action_id": step.action_id, "now": step.now}
    if isinstance(step, Insert):
        statement = sql.insert
        params.update((column, getattr(step.record, column)) for column in COLUMNS)
    elif isinstance(step, Consume):
        statement = sql.consume if step.pin_hash is None else sql.consume_with_pin
        params.update(pin_hash=step.pin_hash, reason=step.reason, nonce=step.nonce)
    elif isinstance(step, SpendAttempt):
        statement = sql.spend_attempt
    else:
        assert isinstance(step, Cancel)
        statement = sql.cancel
    for _ in range(STEP_ATTEMPTS):
        rows = (yield Statement(statement, params)).rows
        applied = bool(rows) and bool(rows[0][0])
        found = _record(rows[0][1:]) if rows else None
        if applied:
            assert found is not None
            return Written(True, found)
        if not apply(step, found).ok:
            return Written(False, found)
        # The snapshot's row would have met the condition, so the row the write saw was
        # newer (or absent from the snapshot): committed while the statement ran.
    raise StoreUnavailable(
        f"PostgreSQL action step raced a concurrent write {STEP_ATTEMPTS} times in a row",
        cause="write_conflict",
        reason=f"the action's row changed under each of {STEP_ATTEMPTS} runs of one step",
    )


def create_flow(sql: ActionStatements) -> StatementFlow[None]:
    """Create the table and its index unless both exist (and add the columns a table of an
    earlier version lacks), under the creators' advisory lock
    (in a transaction: the lock is the transaction's)."""
    if (yield Statement(sql.schema_exists, sql.schema_names)).rows[0][0]:
        return
    yield Statement(sql.create_lock, (sql.name,))
    yield Statement(sql.create_table, ())
    yield Statement(sql.add_columns, ())
    yield Statement(sql.create_index, ())


def _in_transaction(flow: StatementFlow[None]) -> Generator[InTransaction, None, None]:
    yield InTransaction(flow)


class _Purges:
    """When the next piggybacked purge is due (by the steps' own time)."""

    def __init__(self, store: PostgresStore) -> None:
        self.interval = store.purge_interval_seconds
        self.batch = store.purge_batch_size
        self.next = 0.0
        self.lock = threading.Lock()

    def after(self, sql: ActionStatements, step: Step) -> StatementFlow[None]:
        """One purge batch after ``step``, when one is due (on a create)."""
        if self.interval is None or not isinstance(step, Insert):
            return
        with self.lock:
            if step.now < self.next:
                return
            self.next = step.now + self.interval
        if (yield from piggybacked(sql.purge, step.now, self.batch)) >= self.batch:
            with self.lock:
                self.next = 0.0  # more to delete: the next create continues


def _operation(step: Step) -> str:
    return f"action {type(step).__name__.lower()}"


class PostgresActions:
    """Steps on a ``PostgresStore``, one statement each, through its transport (and its
    breaker): ``write`` on its sync pool, ``awrite`` on the running loop's async pool."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._sql = ActionStatements(store.table)
        self._purges = _Purges(store)

    def create_table(self) -> None:
        """Create the actions table and its index; safe to call again, and concurrently."""
        self._store.run_flow("action create_table", _in_transaction(create_flow(self._sql)))

    async def acreate_table(self) -> None:
        """:meth:`create_table` on the running loop's pool."""
        await self._store.arun_flow("action create_table", _in_transaction(create_flow(self._sql)))

    def _flow(self, step: Step) -> StatementFlow[Written]:
        written = yield from step_flow(self._sql, step)
        yield from self._purges.after(self._sql, step)
        return written

    def write(self, step: Step) -> Written:
        try:
            return self._store.run_flow(_operation(step), self._flow(step))
        except StoreUnavailable as error:
            if error.code not in (UNDEFINED_TABLE, UNDEFINED_COLUMN):
                raise
        self.create_table()  # its first use: the step found no table (or an older one)
        return self._store.run_flow(_operation(step), self._flow(step))

    async def awrite(self, step: Step) -> Written:
        try:
            return await self._store.arun_flow(_operation(step), self._flow(step))
        except StoreUnavailable as error:
            if error.code not in (UNDEFINED_TABLE, UNDEFINED_COLUMN):
                raise
        await self.acreate_table()
        return await self._store.arun_flow(_operation(step), self._flow(step))
