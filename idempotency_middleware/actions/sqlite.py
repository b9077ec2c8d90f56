"""One-time actions on an ``SQLiteStore``: a table of their own beside the store's
(``<table_name>_actions``), made on first use, in the same file and through the store's
own connections.

Each step is one ``BEGIN IMMEDIATE`` transaction: it takes the file's write lock (so every
process sharing the file sees the steps one at a time), reads the row, applies the step's
condition (``steps.apply``, the same code as MemoryStore's) and writes the row when the
condition holds. The row as it was comes back from the same transaction when it does not.

Table layout (one row per action; times are epoch seconds)::

    action_id        TEXT     primary key
    created_at       REAL
    active_at        REAL
    expires_at       REAL
    purge_at         REAL     indexed: rows past it are deleted, a batch at a time
    data             TEXT     the caller's JSON
    pin_hash         TEXT     scrypt$n$r$p$<base64>, NULL without a PIN
    attempts_left    INTEGER  NULL without a PIN
    consumed_at      REAL
    consumed_reason  TEXT
    canceled_at      REAL
    created_by       TEXT     the create's nonce
    consumed_by      TEXT     the consume's nonce (NULL until consumed)

A table made by an earlier version gains the last two columns on first use.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..stores.kit import Flow
from ..stores.sqlite import SQLiteStore
from ..stores.sqlite.ops import OFF_LOOP, Statement
from .model import ADDED_FIELDS, RECORD_FIELDS, ActionRecord
from .steps import Insert, Read, Step, Written, apply

PURGE_INTERVAL_SECONDS = 60.0
PURGE_BATCH = 500

_COLUMNS = RECORD_FIELDS
_ADDED_COLUMNS = ADDED_FIELDS


class _Statements:
    def __init__(self, store_table: str) -> None:
        # The store validated its table name (letters, digits, underscores).
        name = f"{store_table}_actions"
        table = f'"{name}"'
        self.create_table = (
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "action_id TEXT PRIMARY KEY NOT NULL, created_at REAL NOT NULL, "
            "active_at REAL NOT NULL, expires_at REAL NOT NULL, purge_at REAL NOT NULL, "
            "data TEXT NOT NULL, pin_hash TEXT, attempts_left INTEGER, consumed_at REAL, "
            "consumed_reason TEXT, canceled_at REAL, created_by TEXT, consumed_by TEXT)"
        )
        self.table_info = f"PRAGMA table_info({table})"
        self.add_column = f"ALTER TABLE {table} ADD COLUMN {{}} TEXT"
        self.create_index = f'CREATE INDEX IF NOT EXISTS "{name}_purge_at" ON {table} (purge_at)'
        columns = ", ".join(_COLUMNS)
        self.select = f"SELECT {columns} FROM {table} WHERE action_id = ?"
        placeholders = ", ".join("?" for _ in _COLUMNS)
        self.upsert = f"INSERT OR REPLACE INTO {table} ({columns}) VALUES ({placeholders})"
        self.purge = (
            f"DELETE FROM {table} WHERE rowid IN "
            f"(SELECT rowid FROM {table} WHERE purge_at <= ? LIMIT {PURGE_BATCH})"
        )


def _first(rows: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    return rows[0] if rows else None


def _record(row: tuple[Any, ...] | None) -> ActionRecord | None:
    if row is None:
        return None
    return ActionRecord(**dict(zip(_COLUMNS, row, strict=True)))


def _row(record: ActionRecord) -> tuple[Any, ...]:
    return tuple(getattr(record, column) for column in _COLUMNS)


class SQLiteActions:
    """Steps on the store's file, as flows its transport runs (the async flavour on the
    store's own threads)."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._sql = _Statements(store.table_name)
        self._schema_ready = False
        self._next_purge = 0.0

    def _steps(self, step: Step) -> Flow[Written]:
        yield OFF_LOOP  # (awaited: on the store's threads, never inline on the loop)
        # (Two threads may both make the schema at first: IF NOT EXISTS makes that harmless.)
        if not self._schema_ready:
            yield Statement(self._sql.create_table)
            yield Statement(self._sql.create_index)
            present = {row[1] for row in (yield Statement(self._sql.table_info)).rows}
            for column in _ADDED_COLUMNS:
                if column not in present:
                    try:
                        yield Statement(self._sql.add_column.format(column))
                    except sqlite3.OperationalError as error:
                        # Another thread or process added it first.
                        if "duplicate column" not in str(error):
                            raise
            self._schema_ready = True
        select = Statement(self._sql.select, (step.action_id,))
        if isinstance(step, Read):
            return Written(True, _record(_first((yield select).rows)))
        # (A failure leaves the transaction to the store's transport: it rolls back, or
        # closes the connection, as for its own statements.)
        yield Statement("BEGIN IMMEDIATE")
        written = apply(step, _record(_first((yield select).rows)))
        if written.ok:
            assert written.record is not None
            yield Statement(self._sql.upsert, _row(written.record))
        if isinstance(step, Insert) and step.now >= self._next_purge:
            # Bounded, and inside the create's own transaction: no second lock.
            self._next_purge = step.now + PURGE_INTERVAL_SECONDS
            yield Statement(self._sql.purge, (step.now,))
        yield Statement("COMMIT")
        return written

    def write(self, step: Step) -> Written:
        return self._store.run_flow("action " + type(step).__name__.lower(), self._steps(step))

    async def awrite(self, step: Step) -> Written:
        return await self._store.arun_flow(
            "action " + type(step).__name__.lower(), self._steps(step)
        )
