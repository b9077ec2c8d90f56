"""SQLiteStore at its edges: bad settings, a file it cannot use, a lock held past the busy
timeout, a foreign table under its name, and the Python 3.10 fallback for busy errors."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from idempotency_middleware import SQLiteStore
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest, StoreUnavailable
from idempotency_middleware.stores.sqlite.errors import is_busy
from idempotency_middleware.stores.sqlite.transport import rolled_back
from idempotency_middleware.testing import FakeClock


def _request(clock: FakeClock, key: str = "k") -> ClaimRequest:
    return ClaimRequest(key, "fp", uuid.uuid4().hex, clock.now(), lock_timeout_seconds=30)


@pytest.mark.parametrize(
    "settings",
    [
        {"busy_timeout_seconds": -0.1},
        {"purge_batch_size": 0},
        {"async_threads": 0},
        {"max_idle_connections": -1},
    ],
)
def test_out_of_range_settings_are_refused(tmp_path: Path, settings: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SQLiteStore(tmp_path / "db.sqlite3", **settings)  # type: ignore[arg-type]


def test_zero_idle_connections_is_allowed(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "db.sqlite3", max_idle_connections=0, clock=clock)
    try:
        assert store.claim(_request(clock)) == Claimed()
    finally:
        store.close()


def test_repr_names_the_file_and_the_table(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    store = SQLiteStore(path, table_name="idem")
    try:
        assert repr(store) == f"SQLiteStore({str(path)!r}, table_name='idem')"
    finally:
        store.close()


def test_a_file_that_is_not_a_database_answers_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db.sqlite3"
    path.write_bytes(b"this is not an SQLite database file, just some text" * 100)
    clock = FakeClock()
    store = SQLiteStore(path, clock=clock)
    try:
        with pytest.raises(StoreUnavailable, match="claim"):
            store.claim(_request(clock))
        # The file is left as it was: the store never rewrites what it cannot read.
        assert path.read_bytes().startswith(b"this is not")
    finally:
        store.close()


def test_a_lock_held_past_the_busy_timeout_answers_store_unavailable_then_recovers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    # Another process's writer, in rollback-journal mode, holding the file exclusively.
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN EXCLUSIVE")
    clock = FakeClock()
    store = SQLiteStore(path, busy_timeout_seconds=0.05, clock=clock)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            store.claim(_request(clock))
        assert "locked" in str(raised.value).lower()
        holder.execute("ROLLBACK")
        assert store.claim(_request(clock)) == Claimed()
    finally:
        holder.close()
        store.close()


def test_a_foreign_table_under_the_name_raises_its_own_error_not_unavailable(
    tmp_path: Path,
) -> None:
    # Someone else's table with our name and a NOT NULL column we never fill: a
    # configuration error to surface as is, not an outage to answer 503 for.
    path = tmp_path / "db.sqlite3"
    with sqlite3.connect(path) as setup:
        setup.execute(
            "CREATE TABLE idempotency_records (key TEXT PRIMARY KEY, status TEXT, "
            "fingerprint TEXT, owner TEXT, lock_expires_at REAL, expires_at REAL, "
            "response BLOB, response_size INTEGER DEFAULT 0, too_large INTEGER DEFAULT 0, "
            "taken_over INTEGER DEFAULT 0, tenant TEXT NOT NULL)"
        )
    setup.close()
    clock = FakeClock()
    store = SQLiteStore(path, clock=clock)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            store.claim(_request(clock))
        with pytest.raises(sqlite3.IntegrityError):  # and again, on a fresh connection
            store.claim(_request(clock))
    finally:
        store.close()


def test_busy_errors_are_recognised_by_message_without_an_error_code() -> None:
    # Python 3.10's sqlite3 errors carry no sqlite_errorcode; the message tells.
    assert is_busy(sqlite3.OperationalError("database is locked"))
    assert is_busy(sqlite3.OperationalError("database table is locked: t"))
    assert not is_busy(sqlite3.OperationalError("disk I/O error"))


def test_a_connection_that_cannot_roll_back_is_not_reported_sound(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    connection.execute("CREATE TABLE t (x)")
    connection.execute("BEGIN")
    connection.execute("INSERT INTO t VALUES (1)")
    assert rolled_back(connection)
    assert not connection.in_transaction
    connection.close()
    assert not rolled_back(connection)
