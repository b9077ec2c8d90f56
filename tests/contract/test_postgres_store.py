"""PostgresStore on real PostgreSQL servers: what the contract suite does not see.

Round trips are counted on the wire: every connection of a traced pool writes libpq's
protocol trace, and a round trip is one ``Sync`` (or simple ``Query``) the client sends. The
races a single statement must survive under READ COMMITTED are staged deterministically
with a transaction held open by the test; concurrency is real (threads, tasks, processes).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.protocol import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    Completion,
    Held,
    StoreUnavailable,
)
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.support.ports import free_port

NOW = 1_700_000_000.0
LOCK = 5.0
RESPONSE = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')


def key() -> str:
    return uuid.uuid4().hex * 2


def request(key_hash: str, owner: str = "a1-1", now: float = NOW) -> ClaimRequest:
    return ClaimRequest(key_hash, "f" * 64, owner, now, LOCK, 1.0)


def completion(key_hash: str, owner: str = "a1-1", now: float = NOW) -> Completion:
    return Completion(key_hash, owner, now, 100.0, RESPONSE)


def table() -> str:
    return f"idem_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(postgres_dsn: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_dsn, table=table(), purge_interval_seconds=None) as made:
        made.create_table()
        yield made


class Trace:
    """libpq's protocol trace of every connection of the pools it configures."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / f"trace-{uuid.uuid4().hex[:6]}.txt"
        self.file = self.path.open("w")
        self.mark = 0

    def _trace(self, connection: Any) -> None:
        # libpq writes through a stream of its own on this descriptor, never closed: on
        # the file's own it would outlive the file, and once a new connection's socket
        # took the number, a traced Terminate (a pool closing later) landed in that
        # socket ("server closed the connection unexpectedly"). A duplicate is libpq's.
        connection.pgconn.trace(os.dup(self.file.fileno()))
        flags = psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        connection.pgconn.set_trace_flags(flags)

    def configure(self, connection: psycopg.Connection[Any]) -> None:
        self._trace(connection)

    async def aconfigure(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._trace(connection)

    def since_mark(self) -> tuple[int, int]:
        """(round trips, statements executed) since the last call."""
        self.file.flush()
        text = self.path.read_text()
        sent = [line.split("\t") for line in text[self.mark :].splitlines()]
        self.mark = len(text)
        messages = [fields[2] for fields in sent if fields[0] == "F" and len(fields) > 2]
        round_trips = sum(1 for name in messages if name in ("Sync", "Query"))
        return round_trips, sum(1 for name in messages if name in ("Execute", "Query"))


def traced_store(dsn: str, trace: Trace, **options: Any) -> PostgresStore:
    """A store on a one-connection pool the test gave, whose connection is traced."""
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=1, configure=trace.configure, open=True
    )
    made = PostgresStore(pool=pool, table=table(), purge_interval_seconds=None, **options)
    made.create_table()
    trace.since_mark()
    return made


# -- one statement per claim -----------------------------------------------------------


def test_a_claim_and_a_duplicate_each_take_one_statement_in_one_round_trip(
    postgres_dsn: str, tmp_path: Path
) -> None:
    trace = Trace(tmp_path)
    store = traced_store(postgres_dsn, trace)
    counts = []
    for number in range(8):
        held = key()
        assert store.claim(request(held)) == CLAIMED
        counts.append(trace.since_mark())
        duplicate = store.claim(request(held, owner=f"b{number}-1"))
        assert isinstance(duplicate, Held) and duplicate.record.owner == "a1-1"
        counts.append(trace.since_mark())
    assert all(statements == 1 for _, statements in counts)
    # psycopg prepares the statement on its 5th use: that one call also sends the Parse.
    assert sorted(trips for trips, _ in counts) == [1] * 15 + [2]
    store._transport.pool().close()


async def test_an_async_claim_and_duplicate_take_one_statement_each(
    postgres_dsn: str, tmp_path: Path
) -> None:
    trace = Trace(tmp_path)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        postgres_dsn, min_size=1, max_size=1, configure=trace.aconfigure, open=False
    )
    await pool.open()
    store = PostgresStore(async_pool=pool, table=table(), purge_interval_seconds=None)
    await store.acreate_table()
    trace.since_mark()
    held = key()
    assert await store.aclaim(request(held)) == CLAIMED
    assert trace.since_mark() == (1, 1)
    duplicate = await store.aclaim(request(held, owner="b1-1"))
    assert isinstance(duplicate, Held) and duplicate.record.status is Status.IN_PROGRESS
    assert trace.since_mark() == (1, 1)
    assert await store.acomplete(completion(held))
    replay = await store.aclaim(request(held, owner="c1-1"))
    assert isinstance(replay, Held) and replay.record.response == RESPONSE
    assert trace.since_mark() == (2, 2)
    await store.aclose()  # a pool the user gave stays open
    assert not pool.closed
    await pool.close()


def test_a_takeover_is_told_from_replacing_an_expired_record(store: PostgresStore) -> None:
    stale, finished = key(), key()
    assert store.claim(request(stale)) == CLAIMED
    # Before the lock expired by the claimer's margin (1 s): held; after: taken over.
    early = store.claim(request(stale, owner="b1-1", now=NOW + LOCK + 0.5))
    assert isinstance(early, Held)
    assert store.claim(request(stale, owner="b1-1", now=NOW + LOCK + 1.0)) == TAKEN_OVER
    assert store.claim(request(finished)) == CLAIMED
    assert store.complete(completion(finished))
    assert store.claim(request(finished, owner="b1-1", now=NOW + 100.0)) == CLAIMED
    record = store.get(finished)
    assert record is not None and record.owner == "b1-1" and record.response is None


# -- READ COMMITTED: the holding row committed after the claim's snapshot ----------------


def _insert(connection: psycopg.Connection[Any], store: PostgresStore, key_hash: str) -> None:
    connection.execute(
        f'INSERT INTO "{store.table}" (key, status, fingerprint, owner, lock_expires_at, '
        "expires_at) VALUES (%s, 'in_progress', 'fp', 'holder-1', %s, %s)",
        (key_hash, NOW + LOCK, NOW + LOCK),
    )


def _claim_behind_lock(
    dsn: str, store: PostgresStore, claim: ClaimRequest, blocker: psycopg.Connection[Any]
) -> list[object]:
    """Start ``store.claim`` in a thread and return once it waits for ``blocker``'s lock."""
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(store.claim(claim)))
    thread.start()
    with psycopg.connect(dsn, autocommit=True) as watcher:
        blocker_pid = blocker.info.backend_pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND %s = ANY(pg_blocking_pids(pid))",
                (blocker_pid,),
            ).fetchone()
            if row is not None and row[0] > 0:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the claim never waited for the open transaction")
    results.append(thread)
    return results


def _finish(results: list[object]) -> object:
    # The thread went in after the claim started waiting; the claim's answer may already
    # have followed it (once the blocker ended), so find the thread rather than pop it.
    (thread,) = [each for each in results if isinstance(each, threading.Thread)]
    thread.join(10)
    answers = [each for each in results if each is not thread]
    assert len(answers) == 1
    return answers[0]


def test_a_holding_row_inserted_after_the_claims_snapshot_is_still_returned(
    postgres_dsn: str, tmp_path: Path
) -> None:
    trace = Trace(tmp_path)
    store = traced_store(postgres_dsn, trace)
    held = key()
    with psycopg.connect(postgres_dsn) as blocker:
        _insert(blocker, store, held)  # uncommitted: the claim's INSERT waits for it
        results = _claim_behind_lock(postgres_dsn, store, request(held), blocker)
        blocker.commit()
    result = _finish(results)
    assert isinstance(result, Held) and result.record.owner == "holder-1"
    # The snapshot's branch saw no row: the claim ran once more, in the same checkout.
    assert trace.since_mark() == (2, 2)


def test_a_claim_waiting_for_an_insert_that_rolls_back_claims_in_one_statement(
    postgres_dsn: str, tmp_path: Path
) -> None:
    trace = Trace(tmp_path)
    store = traced_store(postgres_dsn, trace)
    held = key()
    with psycopg.connect(postgres_dsn) as blocker:
        _insert(blocker, store, held)
        results = _claim_behind_lock(postgres_dsn, store, request(held), blocker)
        blocker.rollback()
    assert _finish(results) == CLAIMED
    assert trace.since_mark() == (1, 1)


def test_a_row_taken_over_after_the_claims_snapshot_is_returned_in_its_latest_version(
    postgres_dsn: str, tmp_path: Path
) -> None:
    trace = Trace(tmp_path)
    store = traced_store(postgres_dsn, trace)
    held = key()
    assert store.claim(request(held)) == CLAIMED
    assert store.complete(completion(held))
    later = NOW + 200.0  # the completed record expired
    trace.since_mark()
    with psycopg.connect(postgres_dsn) as blocker:
        # Another claimer replaces the expired record, not committed yet.
        blocker.execute(
            f"UPDATE \"{store.table}\" SET status = 'in_progress', owner = 'holder-2', "
            "lock_expires_at = %s, expires_at = %s, response = NULL WHERE key = %s",
            (later + LOCK, later + LOCK, held),
        )
        results = _claim_behind_lock(
            postgres_dsn, store, request(held, owner="c1-1", now=later), blocker
        )
        blocker.commit()
    result = _finish(results)
    # The snapshot held the expired completed version: told apart, read again.
    assert isinstance(result, Held) and result.record.owner == "holder-2"
    assert result.record.status is Status.IN_PROGRESS
    assert trace.since_mark() == (2, 2)


# -- create_table ------------------------------------------------------------------------


def _created(dsn: str, name: str) -> tuple[bool, bool]:
    with psycopg.connect(dsn) as connection:
        row = connection.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            (name, f"{name}_expires_at"),
        ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def test_create_table_is_safe_twice_and_from_many_threads_at_once(postgres_dsn: str) -> None:
    name = table()
    # The eight create_table transactions queue on one advisory lock, and a statement's
    # timeout counts its wait for that lock: the last one waits out seven others' round trips,
    # and the eight pools connect at once. Under the default 5 s budgets that depends on the
    # machine's load (a loaded full run failed it once); this test is about the race, so its
    # budgets cover the queue.
    stores = [
        PostgresStore(
            postgres_dsn,
            table=name,
            max_size=1,
            statement_timeout_seconds=60.0,
            pool_timeout_seconds=60.0,
        )
        for _ in range(8)
    ]
    barrier = threading.Barrier(len(stores), timeout=60)
    failures: list[BaseException] = []

    def create(each: PostgresStore) -> None:
        barrier.wait()
        try:
            each.create_table()
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=create, args=(each,)) for each in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == []
    stores[0].create_table()  # and again, once it exists
    assert _created(postgres_dsn, name) == (True, True)
    for each in stores:
        each.close()


def _create_in_process(dsn: str, name: str, barrier: Any, results: Any) -> None:
    with PostgresStore(dsn, table=name, max_size=1) as store:
        store.claim  # noqa: B018 (imported and constructed before the start line)
        barrier.wait()
        try:
            store.create_table()
            results.put("ok")
        except StoreUnavailable as error:
            results.put(f"{error.cause}: {error}")


def test_create_table_is_safe_from_several_processes_at_once(postgres_dsn: str) -> None:
    name = table()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(3, timeout=60)
    results = context.Queue()
    processes = [
        context.Process(target=_create_in_process, args=(postgres_dsn, name, barrier, results))
        for _ in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [results.get(timeout=5) for _ in processes] == ["ok"] * 3
    assert _created(postgres_dsn, name) == (True, True)


def test_create_table_needs_no_create_privilege_once_the_table_exists(
    postgres_dsn: str, store: PostgresStore
) -> None:
    role = f"reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}")
        admin.execute(f'GRANT SELECT ON "{store.table}" TO {role}')
    dsn = postgres_dsn.replace("postgres@", f"{role}@")
    with PostgresStore(dsn, table=store.table) as limited:
        limited.create_table()  # exists: nothing to create, nothing refused
        # Writing needs privileges this role lacks: a misconfiguration, said so.
        with pytest.raises(StoreUnavailable) as refused:
            limited.claim(request(key()))
    assert refused.value.cause == "access_denied" and refused.value.misconfigured
    with PostgresStore(dsn, table=table()) as cannot, pytest.raises(StoreUnavailable) as denied:
        cannot.create_table()
    assert denied.value.cause == "access_denied"


# -- purge -------------------------------------------------------------------------------


def _fill(store: PostgresStore, expired: int, live: int) -> None:
    rows = [(key(), NOW - 10.0) for _ in range(expired)] + [
        (key(), NOW + 100.0) for _ in range(live)
    ]
    with psycopg.connect(store.dsn) as connection, connection.cursor() as cursor:
        cursor.executemany(
            f'INSERT INTO "{store.table}" (key, status, fingerprint, owner, lock_expires_at, '
            "expires_at) VALUES (%s, 'completed', 'fp', 'o-1', %s, %s)",
            [(k, at, at) for k, at in rows],
        )


def _count(store: PostgresStore) -> int:
    with psycopg.connect(store.dsn) as connection:
        row = connection.execute(f'SELECT count(*) FROM "{store.table}"').fetchone()
    assert row is not None
    return int(row[0])


def test_purge_expired_deletes_in_batches(postgres_dsn: str, tmp_path: Path) -> None:
    trace = Trace(tmp_path)
    store = traced_store(postgres_dsn, trace, purge_batch_size=10)
    _fill(store, expired=25, live=5)
    assert store.purge_expired(NOW, clock_skew_seconds=0.0) == 25
    assert trace.since_mark() == (3, 3)  # 10 + 10 + 5: three bounded statements
    assert _count(store) == 5
    assert store.purge_expired(NOW) == 0


async def test_apurge_expired_keeps_claims_within_the_clock_skew_margin(
    store: PostgresStore,
) -> None:
    fresh = key()
    assert await store.aclaim(request(fresh)) == CLAIMED
    # Its lock expired 0.5 s ago: inside the 1 s margin, a slower host may still hold it.
    assert await store.apurge_expired(NOW + LOCK + 0.5) == 0
    assert await store.apurge_expired(NOW + LOCK + 1.0) == 1
    await store.aclose()


def test_writes_purge_one_batch_at_most_once_per_interval(postgres_dsn: str) -> None:
    clock = FakeClock(NOW)
    with PostgresStore(
        postgres_dsn, table=table(), clock=clock, purge_interval_seconds=60, purge_batch_size=10
    ) as store:
        store.create_table()
        _fill(store, expired=15, live=0)
        first = key()
        store.claim(request(first))  # the first write of the process purges a batch
        assert _count(store) == 1 + 5
        store.claim(request(key()))  # a full batch was deleted: the next write continues
        assert _count(store) == 2
        _fill(store, expired=3, live=0)
        store.claim(request(key()))  # within the interval: no purge
        assert _count(store) == 6
        clock.advance(60)
        # After a completion, finished rows only: the two claims past their locks stay.
        assert store.complete(completion(first, now=NOW + 100))
        assert _count(store) == 3
        clock.advance(60)
        store.claim(request(key(), now=NOW + 100))  # after a claim, stale claims too
        assert _count(store) == 2


# -- errors and their causes ---------------------------------------------------------------


def test_a_missing_table_says_how_to_create_it(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn, table="no_such_idem_table")
    with store, pytest.raises(StoreUnavailable) as missing:
        store.claim(request(key()))
    assert missing.value.cause == "no_table" and missing.value.code == "42P01"
    assert missing.value.reason.startswith("no such table 'no_such_idem_table' on ")
    assert missing.value.fix == (
        f"create it: store.create_table(), or `{store.create_table_command()}`"
    )
    assert store.breaker_state == "closed"  # a misconfiguration is no outage


async def test_a_missing_table_async(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn, table="no_such_idem_table")
    with pytest.raises(StoreUnavailable) as missing:
        await store.aget(key())
    assert missing.value.cause == "no_table"
    await store.aclose()


def test_an_unknown_role_is_bad_credentials(postgres_dsn: str) -> None:
    dsn = postgres_dsn.replace("postgres@", "nobody_like_this@")
    with PostgresStore(dsn, table=table(), connect_timeout=1) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as refused:
            store.claim(request(key()))
    assert refused.value.cause == "bad_credentials" and refused.value.code == "28000"
    assert time.monotonic() - started < 3


def test_a_closed_port_is_unreachable_fast_and_opens_the_breaker() -> None:
    port = free_port()
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with PostgresStore(dsn, connect_timeout=1, breaker_threshold=2) as store:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as down:
                store.claim(request(key()))
            assert down.value.cause == "unreachable"
            assert time.monotonic() - started < 2.5
        with pytest.raises(StoreUnavailable) as refused:
            store.claim(request(key()))
        assert refused.value.cause == "breaker_open"
        assert store.breaker_state == "open"


async def test_a_closed_port_is_unreachable_fast_async() -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    store = PostgresStore(dsn, connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as down:
        await store.aclaim(request(key()))
    assert down.value.cause == "unreachable" and time.monotonic() - started < 2.5
    await store.aclose()


def test_a_statement_past_its_timeout_is_timed_out(postgres_dsn: str, store: PostgresStore) -> None:
    held = key()
    assert store.claim(request(held)) == CLAIMED
    with (
        PostgresStore(postgres_dsn, table=store.table, statement_timeout_seconds=0.2) as impatient,
        psycopg.connect(postgres_dsn) as blocker,
    ):
        blocker.execute(f'SELECT 1 FROM "{store.table}" WHERE key = %s FOR UPDATE', (held,))
        with pytest.raises(StoreUnavailable) as slow:
            impatient.complete(completion(held))
        assert slow.value.cause == "timed_out" and slow.value.code == "57014"
    # Nothing was written: the owner's completion, retried by the engine, still lands.
    assert store.complete(completion(held))


def test_a_pool_with_every_connection_busy_is_timed_out(postgres_dsn: str) -> None:
    with PostgresStore(postgres_dsn, table=table(), max_size=1, pool_timeout_seconds=0.2) as store:
        store.create_table()
        pool = store._transport.pool()
        busy = pool.getconn()
        try:
            with pytest.raises(StoreUnavailable) as waited:
                store.claim(request(key()))
            assert waited.value.cause == "timed_out"
        finally:
            pool.putconn(busy)
        assert store.claim(request(key())) == CLAIMED


# -- constructor -------------------------------------------------------------------------


def test_the_constructor_refuses_what_cannot_work(postgres_dsn: str) -> None:
    with pytest.raises(ValueError, match="plain SQL identifier"):
        PostgresStore(postgres_dsn, table='x"; DROP TABLE y; --')
    with pytest.raises(ValueError, match="min_size"):
        PostgresStore(postgres_dsn, min_size=3, max_size=2)
    with pytest.raises(ValueError, match="positive"):
        PostgresStore(postgres_dsn, pool_timeout_seconds=0)
    with pytest.raises(ValueError, match="needs a dsn"):
        PostgresStore()
    store = PostgresStore(postgres_dsn, table="app.idempotency")
    assert repr(store) == f"PostgresStore({store.where!r}, table='app.idempotency')"


def test_a_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch, postgres_dsn: str) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(ModuleNotFoundError, match=r"idempotency-middleware\[postgres\]"):
        PostgresStore(postgres_dsn)


def test_a_schema_qualified_table_and_no_prepared_statements(postgres_dsn: str) -> None:
    schema = f"s_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    # prepare_threshold=None: what PgBouncer's transaction pooling (before 1.21) needs.
    with PostgresStore(
        postgres_dsn, table=f"{schema}.idem", prepare_threshold=None, statement_timeout_seconds=None
    ) as store:
        store.create_table()
        store.create_table()
        for number in range(8):
            assert store.claim(request(key(), owner=f"a{number}-1")) == CLAIMED
    assert _created(postgres_dsn, f"{schema}.idem") == (True, True)


def test_a_pool_the_user_gave_keeps_its_settings(postgres_dsn: str) -> None:
    with ConnectionPool(postgres_dsn, min_size=1, max_size=1, open=True) as pool:
        store = PostgresStore(pool=pool, table=table())
        store.create_table()
        held = key()
        assert store.claim(request(held)) == CLAIMED
        store.close()  # the user's pool stays open, its connection as it was
        with pool.connection() as connection:
            assert not connection.autocommit
        assert store.get(held) is not None


async def test_an_async_pool_with_every_connection_busy_is_timed_out(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn, table=table(), max_size=1, pool_timeout_seconds=0.2)
    await store.acreate_table()
    pool = await store._transport.loop_pools.get()
    busy = await pool.getconn(timeout=1)
    try:
        with pytest.raises(StoreUnavailable) as waited:
            await store.aclaim(request(key()))
        assert waited.value.cause == "timed_out"
    finally:
        await pool.putconn(busy)
    assert await store.aclaim(request(key())) == CLAIMED
    await store.aclose()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_half_open_breaker_lets_one_claim_probe(flavour: str) -> None:
    clock = FakeClock(NOW)
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    store = PostgresStore(dsn, connect_timeout=1, clock=clock, breaker_threshold=1)

    def claim() -> object:
        if flavour == "sync":
            return store.claim(request(key()))
        return asyncio.run(store.aclaim(request(key())))

    for expected in ("unreachable", "breaker_open"):
        with pytest.raises(StoreUnavailable) as failed:
            claim()
        assert failed.value.cause == expected
    clock.advance(5.0)  # the cool-down is over: the next claim probes the store
    with pytest.raises(StoreUnavailable) as probed:
        claim()
    assert probed.value.cause == "unreachable" and store.breaker_state == "open"
    store.close()


def test_a_forked_worker_makes_its_own_pool(store: PostgresStore) -> None:
    held = key()
    assert store.claim(request(held)) == CLAIMED  # the parent's pool exists
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:
        record = store.get(held)  # not through the parent's connections
        results.put(record.owner if record is not None else None)
        store.close()

    process = context.Process(target=child)
    process.start()
    process.join(30)
    assert results.get(timeout=5) == "a1-1"
    assert store.claim(request(held, owner="b1-1")) != CLAIMED  # the parent's pool still works


def test_every_failure_has_its_cause() -> None:
    from psycopg_pool import PoolClosed, TooManyRequests

    from idempotency_middleware.stores.postgres.errors import cause_of, unavailable

    refused = psycopg.OperationalError(
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: FATAL:  '
        'no pg_hba.conf entry for host "10.0.0.2", user "app", database "app"'
    )
    crowded = psycopg.OperationalError("FATAL:  sorry, too many clients already")
    cases = {
        TooManyRequests("queue full"): "throttled",
        PoolClosed("closed"): "unknown",
        ValueError("not a store error"): "unknown",
        refused: "access_denied",
        crowded: "throttled",
        psycopg.errors.ConnectionTimeout("connection timeout expired"): "timed_out",
        psycopg.errors.DataError("invalid input"): "server_error",
        psycopg.errors.SerializationFailure("could not serialize"): "write_conflict",
    }
    assert {error: cause_of(error) for error in cases} == cases
    failure = unavailable("claim", refused, "db:5432/app", "idempotency")
    assert failure.code == "28000" and failure.misconfigured
    assert unavailable("get", ValueError(""), "db", "t").reason == "PostgreSQL at db: ValueError"


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_purge_that_fails_does_not_fail_the_write_it_rides_on(
    postgres_dsn: str, store: PostgresStore, flavour: str
) -> None:
    role = f"nodelete_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT SELECT, INSERT, UPDATE ON "{store.table}" TO {role}')
    dsn = postgres_dsn.replace("postgres@", f"{role}@")
    # The first write of a process purges: here its DELETE is refused (no privilege).
    with PostgresStore(dsn, table=store.table) as limited:
        held = key()
        if flavour == "sync":
            assert limited.claim(request(held)) == CLAIMED
        else:
            assert asyncio.run(limited.aclaim(request(held))) == CLAIMED
        assert store.get(held) is not None


async def test_a_cancelled_claim_gives_its_busy_connection_up(
    postgres_dsn: str, store: PostgresStore
) -> None:
    held = key()
    with psycopg.connect(postgres_dsn) as blocker:
        _insert(blocker, store, held)  # the claim will wait for this transaction
        waiting = asyncio.ensure_future(store.aclaim(request(held, owner="b1-1")))
        with psycopg.connect(postgres_dsn, autocommit=True) as watcher:
            for _ in range(500):
                await asyncio.sleep(0.01)
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND %s = ANY(pg_blocking_pids(pid))",
                    (blocker.info.backend_pid,),
                ).fetchone()
                if row is not None and row[0]:
                    break
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        blocker.commit()
    # The cancelled statement's connection was not reused: the next claims answer.
    result = await store.aclaim(request(held, owner="c1-1"))
    assert isinstance(result, Held) and result.record.owner == "holder-1"
    await store.aclose()
