"""SQLiteStore's async methods run inline on the event loop first (sqlite/transport.py).

An async call runs on the loop's thread, on a connection that never waits for a lock,
when one is idle; when SQLite answers busy it runs again on the store's threads, which
wait up to the busy timeout. These tests watch where each call ran: on the transport's
threads (counted) or on the loop's thread (traced on the inline connection).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware.clock import SYSTEM_CLOCK
from idempotency_middleware.stores.breaker import CircuitBreaker
from idempotency_middleware.stores.kit import Flow
from idempotency_middleware.stores.protocol import Claimed, Held, StoreUnavailable
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.stores.sqlite import SQLiteStore
from idempotency_middleware.stores.sqlite import transport as transport_module
from idempotency_middleware.stores.sqlite.ops import INLINE_MAX_BODY_BYTES, PURGE, Statement
from idempotency_middleware.testing import FakeClock
from tests.contract.test_sqlite_store import RESPONSE, TTL, claim_request, completion
from tests.e2e.test_breaker_outage import NOT_A_DATABASE
from tests.support.faultproxy import wait_until

LOGGER = "idempotency_middleware.stores.sqlite"
WAIT_SECONDS = 10.0


def deferral_key() -> tuple[str, str]:
    """A key hash and an owner in the shapes a deferral token carries."""
    return uuid.uuid4().hex * 2, f"{uuid.uuid4().hex}-{uuid.uuid4().hex[:8]}"


def token_for(key: str, owner: str, now: float) -> str:
    return f"{key}.{owner}.{int(now + TTL) + 1}"


class ThreadCalls:
    """Every call the store hands to its thread pool, in order: its operation's name
    (``names``) and the transport's method running it (``calls``)."""

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        self.calls: list[str] = []
        self.started = asyncio.Event()
        original = store._transport._threads.run
        loop = asyncio.get_running_loop()

        async def counted(call: Callable[..., Any], *args: Any) -> Any:
            self.names.append(args[0])
            self.calls.append(call.__name__)

            def on_the_thread(*arguments: Any) -> Any:
                loop.call_soon_threadsafe(self.started.set)
                return call(*arguments)

            return await original(on_the_thread, *args)

        monkeypatch.setattr(store._transport._threads, "run", counted)


class Traced:
    """The thread of every statement run on one connection."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.statements: list[tuple[int, str]] = []
        self.began: dict[str, asyncio.Event] = {}
        self._loop = asyncio.get_running_loop()
        connection.set_trace_callback(self._record)

    def beginning(self, prefix: str) -> asyncio.Event:
        """Set (on the loop) when a statement starting with ``prefix`` starts running."""
        return self.began.setdefault(prefix, asyncio.Event())

    def _record(self, statement: str) -> None:
        self.statements.append((threading.get_ident(), statement))
        for prefix, event in self.began.items():
            if statement.startswith(prefix):
                self._loop.call_soon_threadsafe(event.set)

    def threads(self) -> set[int]:
        return {thread for thread, _ in self.statements}

    def saw(self, prefix: str) -> bool:
        return any(statement.startswith(prefix) for _, statement in self.statements)


def the_inline_connection(store: SQLiteStore) -> sqlite3.Connection:
    (connection,) = store._transport._inline_pool._idle
    return connection


def breaker_state(store: SQLiteStore) -> str:
    """Read afresh (a function, so that mypy does not narrow it)."""
    return store.breaker.state


def is_closed(connection: sqlite3.Connection) -> bool:
    try:
        connection.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


async def background_done(store: SQLiteStore) -> None:
    """Wait for what the store handed to its threads (closing a discarded inline connection
    is one): ``close()`` waits for its thread pool to finish. The store reopens on use."""
    await asyncio.to_thread(store.close)


async def after_the_threads_work(store: SQLiteStore) -> None:
    """Wait for a no-op on the store's thread pool (with one thread: after what it was
    handed before)."""
    pool = store._transport._threads.pool()
    await asyncio.get_running_loop().run_in_executor(pool, lambda: None)


async def warmed_up(store: SQLiteStore) -> sqlite3.Connection:
    """Run a first async call (on a thread: it leaves an inline connection behind)."""
    assert store._transport._inline_pool._idle == []
    assert await store.aget("warm-up") is None
    return the_inline_connection(store)


@pytest.fixture(params=["returning", "changes"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    """A store on a fresh file, without periodic purge, over both claim detections."""
    with SQLiteStore(tmp_path / "idempotency.sqlite3", purge_interval_seconds=None) as store:
        store._ops.use_returning = request.param == "returning" and store._ops.use_returning
        yield store


# -- inline on the loop ---------------------------------------------------------------------


async def test_the_first_async_call_runs_on_a_thread_and_leaves_an_inline_connection(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threaded = ThreadCalls(store, monkeypatch)
    connection = await warmed_up(store)
    assert threaded.calls == ["_run_then_open_inline"]
    # The inline connection never waits for a lock, and never checkpoints.
    assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    assert connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # The thread's own connection keeps the full busy timeout.
    (pooled,) = store._transport._pool._idle
    assert pooled.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


async def test_later_async_calls_run_inline_on_the_loop_and_follow_the_protocol(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = await warmed_up(store)
    traced = Traced(connection)
    threaded = ThreadCalls(store, monkeypatch)
    now = time.time()

    assert await store.aclaim(claim_request(now=now, lock=1)) == Claimed()
    assert await store.arenew("k", "owner-a", now + 2) is True
    assert await store.arenew("k", "intruder", now + 3) is False
    assert isinstance(await store.aclaim(claim_request(owner="b", now=now + 1.5)), Held)
    assert await store.acomplete(completion(owner="intruder")) is False
    assert await store.acomplete(completion()) is True
    held = await store.aclaim(claim_request(owner="b"))
    assert isinstance(held, Held)
    assert held.record.response == RESPONSE
    assert await store.arelease("k", "intruder") is False
    assert await store.arelease("k", "owner-a") is False  # completed: not released
    assert await store.adelete("k") is True
    assert await store.adelete("k") is False
    assert await store.aget("k") is None
    assert await store.aclaim(claim_request(owner="c")) == Claimed()
    assert await store.arelease("k", "c") is True
    assert await store.aget("k") is None

    # A deferred key: completed by its token, or forgotten by it.
    key, owner = deferral_key()
    assert await store.aclaim(claim_request(key, owner=owner, now=now)) == Claimed()
    assert await store.acomplete(completion(key, owner=owner, now=now, deferred=True)) is True
    token = token_for(key, owner, now)
    final = [(b"content-type", b"text/plain")]
    assert await store.acomplete_deferred(token, 200, final, b"final") is True
    assert await store.acomplete_deferred(token, 200, final, b"again") is False
    record = await store.aget(key)
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.response is not None
    assert record.response.body == b"final"
    other, other_owner = deferral_key()
    assert await store.aclaim(claim_request(other, owner=other_owner, now=now)) == Claimed()
    assert await store.acomplete(completion(other, owner=other_owner, deferred=True)) is True
    assert await store.arelease_deferred(token_for(other, other_owner, now)) is True
    assert await store.arelease_deferred(token_for(other, other_owner, now)) is False
    assert await store.aget(other) is None

    assert threaded.names == []  # not one call went to the thread pool
    assert traced.threads() == {threading.get_ident()}  # all on the loop's thread
    for statement in ("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE", "SELECT"):
        assert traced.saw(statement), statement
    assert the_inline_connection(store) is connection  # the same one, given back each time


async def test_calls_at_once_on_one_loop_take_turns_on_the_inline_connection(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await warmed_up(store)
    threaded = ThreadCalls(store, monkeypatch)
    now = time.time()
    results = await asyncio.gather(
        *(store.aclaim(claim_request(owner=f"owner-{n}", now=now)) for n in range(20))
    )
    assert sum(isinstance(result, Claimed) for result in results) == 1
    assert threaded.names == []
    assert len(store._transport._inline_pool._idle) == 1


# -- a lock held by another worker ------------------------------------------------------------


async def test_a_held_write_lock_sends_the_call_to_a_thread_which_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db.sqlite3"
    async with SQLiteStore(path, purge_interval_seconds=None, busy_timeout_seconds=20) as store:
        inline = await warmed_up(store)
        (pooled,) = store._transport._pool._idle
        inline_traced, pooled_traced = Traced(inline), Traced(pooled)
        threaded = ThreadCalls(store, monkeypatch)
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")  # another worker's write
        try:
            # Reads run inline beside the writer (WAL).
            assert await store.aget("k") is None
            assert threaded.names == []

            on_the_thread = pooled_traced.beginning("BEGIN IMMEDIATE")
            reached_the_thread: list[float] = []

            async def release_once_the_thread_waits() -> None:
                # The loop runs this while the claim waits on its thread for the lock: it
                # is the only way the lock is ever released, so a blocked loop (an inline
                # attempt that waits) never finishes the claim within the busy timeout.
                await threaded.started.wait()
                reached_the_thread.append(time.monotonic())
                await on_the_thread.wait()
                holder.execute("ROLLBACK")

            started = time.monotonic()
            result, _ = await asyncio.wait_for(
                asyncio.gather(store.aclaim(claim_request()), release_once_the_thread_waits()),
                WAIT_SECONDS * 2,
            )
        finally:
            if holder.in_transaction:
                holder.execute("ROLLBACK")
            holder.close()
        assert result == Claimed(taken_over=False)  # once: a second claim would be Held
        assert time.monotonic() - started < store.busy_timeout_seconds / 2
        # The inline attempt gave up at once (the busy timeout is 20 s).
        assert reached_the_thread[0] - started < 2.0
        assert threaded.names == ["claim"]
        assert threaded.calls == ["run"]  # from the statement that met the lock
        # The inline attempt met the lock on the loop's thread and gave up before writing.
        loop_thread = threading.get_ident()
        assert inline_traced.saw("BEGIN IMMEDIATE")
        assert not inline_traced.saw("INSERT")
        assert inline_traced.threads() == {loop_thread}
        assert pooled_traced.saw("INSERT")
        assert loop_thread not in pooled_traced.threads()
        # The inline connection was given back, sound, and the next call runs inline again.
        assert the_inline_connection(store) is inline
        record = await store.aget("k")
        assert record is not None
        assert record.owner == "owner-a"
        assert threaded.names == ["claim"]
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT count(*) FROM idempotency_records").fetchone()[0] == 1
    finally:
        raw.close()


async def test_a_lock_held_past_the_busy_timeout_answers_store_unavailable_from_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db.sqlite3"
    async with SQLiteStore(path, busy_timeout_seconds=0.05) as store:
        inline = await warmed_up(store)
        threaded = ThreadCalls(store, monkeypatch)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailable) as raised:
                await store.acomplete(completion())
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert raised.value.cause == "busy"
        assert threaded.names == ["complete"]
        assert the_inline_connection(store) is inline


# -- what never runs inline ----------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{"synchronous": "full"}, {"async_inline": False}, {"max_idle_connections": 0}],
    ids=["synchronous-full", "async_inline-off", "no-idle-connections"],
)
async def test_these_options_never_run_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    # FULL: an fsync per commit; off: asked; no idle connection: none kept for the next call.
    async with SQLiteStore(
        tmp_path / "db.sqlite3", purge_interval_seconds=None, **options
    ) as store:
        threaded = ThreadCalls(store, monkeypatch)
        now = time.time()
        key, owner = deferral_key()
        assert await store.aclaim(claim_request(key, owner=owner, now=now)) == Claimed()
        assert await store.arenew(key, owner, now + 20) is True
        assert await store.acomplete(completion(key, owner=owner, now=now, deferred=True))
        assert await store.acomplete_deferred(token_for(key, owner, now), 200) is True
        assert await store.arelease_deferred(token_for(key, owner, now)) is False
        assert await store.arelease(key, owner) is False
        assert await store.aget(key) is not None
        assert await store.adelete(key) is True
        assert threaded.names == [
            "claim",
            "renew",
            "complete",
            "complete_deferred",
            "release_deferred",
            "release",
            "get",
            "delete",
        ]
        assert store._transport._inline_pool._idle == []


async def test_a_database_that_will_not_use_wal_never_runs_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A file system where WAL cannot be used: SQLite leaves the file in its journal mode.
    class NoWal(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql.upper().startswith("PRAGMA JOURNAL_MODE"):
                return super().execute("PRAGMA journal_mode")
            return super().execute(sql, *args)

    real_connect = sqlite3.connect
    monkeypatch.setattr(
        sqlite3, "connect", lambda *args, **kwargs: real_connect(*args, factory=NoWal, **kwargs)
    )
    caplog.set_level(logging.WARNING, LOGGER)
    async with SQLiteStore(tmp_path / "db.sqlite3", purge_interval_seconds=None) as store:
        threaded = ThreadCalls(store, monkeypatch)
        assert await store.aclaim(claim_request()) == Claimed()
        assert await store.acomplete(completion()) is True
        assert isinstance(await store.aclaim(claim_request(owner="b")), Held)
        assert threaded.names == ["claim", "complete", "claim"]
        assert threaded.calls == ["_run_then_open_inline", "run", "run"]
    assert "not WAL" in caplog.text


@pytest.mark.parametrize(
    ("size", "threaded_calls"),
    [(INLINE_MAX_BODY_BYTES, []), (INLINE_MAX_BODY_BYTES + 1, ["complete"])],
)
async def test_a_completion_with_a_large_body_is_written_on_a_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch, size: int, threaded_calls: list[str]
) -> None:
    await warmed_up(store)
    threaded = ThreadCalls(store, monkeypatch)
    response = StoredResponse(200, [], b"x" * size)
    assert await store.aclaim(claim_request()) == Claimed()
    assert await store.acomplete(completion(response=response)) is True
    assert threaded.names == threaded_calls
    record = await store.aget("k")
    assert record is not None
    assert record.response == response


@pytest.mark.parametrize(
    ("size", "threaded_calls"),
    [(INLINE_MAX_BODY_BYTES, []), (INLINE_MAX_BODY_BYTES + 1, ["complete_deferred"])],
)
async def test_a_deferred_completion_with_a_large_body_is_written_on_a_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch, size: int, threaded_calls: list[str]
) -> None:
    await warmed_up(store)
    threaded = ThreadCalls(store, monkeypatch)
    now = time.time()
    key, owner = deferral_key()
    assert await store.aclaim(claim_request(key, owner=owner, now=now)) == Claimed()
    assert await store.acomplete(completion(key, owner=owner, now=now, deferred=True)) is True
    body = b"y" * size
    assert await store.acomplete_deferred(token_for(key, owner, now), 200, [], body) is True
    assert threaded.names == threaded_calls
    record = await store.aget(key)
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.response is not None
    assert record.response.body == body


# -- checkpoints and purges, on the store's threads -------------------------------------------


async def test_every_n_inline_calls_checkpoint_the_wal_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_module, "CHECKPOINT_EVERY", 5)
    path = tmp_path / "db.sqlite3"
    # One thread: waiting for a no-op on it waits for whatever was submitted before.
    async with SQLiteStore(path, purge_interval_seconds=None, async_threads=1) as store:
        await warmed_up(store)
        checkpoints: list[str] = []
        checkpoint = store._transport._checkpoint

        def recorded() -> None:
            checkpoints.append(threading.current_thread().name)
            checkpoint()

        monkeypatch.setattr(store._transport, "_checkpoint", recorded)
        threaded = ThreadCalls(store, monkeypatch)
        size = path.stat().st_size
        for number in range(4):
            assert await store.aclaim(claim_request(f"k-{number}")) == Claimed()
        await after_the_threads_work(store)
        assert checkpoints == []
        assert path.stat().st_size == size  # every write still in the WAL only

        assert await store.aclaim(claim_request("k-4")) == Claimed()  # the 5th inline call
        wait_until(lambda: path.stat().st_size > size, WAIT_SECONDS, "the WAL was not checkpointed")
        assert len(checkpoints) == 1
        assert checkpoints[0].startswith("idempotency-sqlite")
        assert threaded.names == []
        await after_the_threads_work(store)
        # The WAL was copied whole: the next write restarts it, which syncs its header, so
        # that write goes to a thread; a read stays inline.
        assert store._transport._wal_restart_due
        assert await store.aget("k-0") is not None
        assert threaded.names == []
        assert await store.aclaim(claim_request("k-5")) == Claimed()
        assert threaded.names == ["claim"]
        assert not store._transport._wal_restart_due
        # The count starts again.
        for number in range(6, 9):
            assert await store.aclaim(claim_request(f"k-{number}")) == Claimed()
        await after_the_threads_work(store)
        assert len(checkpoints) == 1
        assert threaded.names == ["claim"]


def test_a_checkpoint_on_a_broken_file_logs_and_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "db.sqlite3"
    path.write_bytes(NOT_A_DATABASE)
    caplog.set_level(logging.DEBUG, LOGGER)
    with SQLiteStore(path) as store:
        store._transport._checkpoint()
    assert "SQLite checkpoint skipped" in caplog.text
    assert path.read_bytes() == NOT_A_DATABASE


async def test_a_purge_piggybacked_on_an_inline_write_runs_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    path = tmp_path / "db.sqlite3"
    async with SQLiteStore(path, purge_interval_seconds=60, clock=clock) as store:
        past = clock.now() - 1000
        old = [f"old-{number}" for number in range(3)]
        for key in old:  # (the first of these writes purges: nothing yet)
            assert store.claim(claim_request(key, now=past)) == Claimed()
            assert store.complete(completion(key, now=past, ttl=10)) is True
        await warmed_up(store)
        purges: list[int] = []
        gate = threading.Event()
        quietly = store._transport._quietly

        def gated(operation: str, flow: Flow[None]) -> None:
            assert operation == PURGE
            purges.append(threading.get_ident())
            assert gate.wait(WAIT_SECONDS)
            quietly(operation, flow)

        monkeypatch.setattr(store._transport, "_quietly", gated)
        threaded = ThreadCalls(store, monkeypatch)
        clock.advance(59)
        assert await store.aclaim(claim_request("new-1", now=clock.now())) == Claimed()
        clock.advance(2)  # past the interval: this write purges
        assert await store.aclaim(claim_request("new-2", now=clock.now())) == Claimed()
        assert threaded.names == []
        # The purge waits on its thread (the gate), so the inline claim did not run it.
        assert all(await asyncio.gather(*(store.aget(key) for key in old)))
        gate.set()
        wait_until(
            lambda: all(store.get(key) is None for key in old),
            WAIT_SECONDS,
            "expired rows were not purged",
        )
        assert len(purges) == 1
        assert purges[0] != threading.get_ident()
        assert store.get("new-1") is not None
        assert store.get("new-2") is not None


def test_a_purge_on_a_thread_on_a_broken_file_logs_and_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "db.sqlite3"
    path.write_bytes(NOT_A_DATABASE)
    caplog.set_level(logging.DEBUG, LOGGER)
    with SQLiteStore(path) as store:
        store._transport._quietly(PURGE, store._ops.purge_batch(time.time(), store._ops.sql.purge))
    assert "purge of expired idempotency records skipped" in caplog.text
    assert path.read_bytes() == NOT_A_DATABASE


# -- failures of an inline call --------------------------------------------------------------


async def test_an_open_breaker_refuses_claims_before_any_connection_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The breaker admits a half-open probe once, before the transport: a probe that meets a
    # lock inline goes on on a thread without asking again.
    async with SQLiteStore(tmp_path / "db.sqlite3", breaker_threshold=1) as store:
        inline = await warmed_up(store)
        traced = Traced(inline)
        threaded = ThreadCalls(store, monkeypatch)
        store.breaker.failed(StoreUnavailable("test outage", cause="io_error", reason="test"))
        assert breaker_state(store) == "open"
        with pytest.raises(StoreUnavailable) as refused:
            await store.aclaim(claim_request())
        assert refused.value.cause == "breaker_open"
        assert threaded.names == []
        assert traced.statements == []
        assert the_inline_connection(store) is inline
        # A finishing call the store answers closes the breaker.
        assert await store.arelease("k", "owner-a") is False
        assert breaker_state(store) == "closed"
        assert await store.aclaim(claim_request()) == Claimed()
        assert the_inline_connection(store) is inline
        assert threaded.names == []
        assert not is_closed(inline)


async def test_a_bad_argument_is_refused_inline_and_keeps_the_inline_connection(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    inline = await warmed_up(store)
    threaded = ThreadCalls(store, monkeypatch)
    with pytest.raises(ValueError, match="malformed"):
        await store.acomplete_deferred("not a token", 200)
    with pytest.raises(ValueError, match="malformed"):
        await store.arelease_deferred("not a token")
    assert threaded.names == []
    assert the_inline_connection(store) is inline
    assert await store.aclaim(claim_request()) == Claimed()


async def test_an_sqlite_error_inline_surfaces_and_closes_the_inline_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db.sqlite3"
    async with SQLiteStore(path, purge_interval_seconds=None) as store:
        inline = await warmed_up(store)
        threaded = ThreadCalls(store, monkeypatch)
        with sqlite3.connect(path) as other:  # someone drops the table under the store
            other.execute("DROP TABLE idempotency_records")
        other.close()
        with pytest.raises(StoreUnavailable, match="no such table"):
            await store.aclaim(claim_request())
        assert threaded.names == []  # not retried on a thread: it was no lock
        assert store._transport._inline_pool._idle == []
        await background_done(store)  # the discarded connection is closed off the loop
        assert is_closed(inline)
        # The next call opens a new inline connection (on a thread) and gets the same error.
        with pytest.raises(StoreUnavailable, match="no such table"):
            await store.aclaim(claim_request())
        assert threaded.calls == ["_run_then_open_inline"]


async def test_a_foreign_table_error_inline_surfaces_as_is_and_closes_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db.sqlite3"
    async with SQLiteStore(path, purge_interval_seconds=None) as store:
        inline = await warmed_up(store)
        threaded = ThreadCalls(store, monkeypatch)
        # Someone else's table under the store's name, with a NOT NULL column it never fills.
        with sqlite3.connect(path) as other:
            other.execute("DROP TABLE idempotency_records")
            other.execute(
                "CREATE TABLE idempotency_records (key TEXT PRIMARY KEY, status TEXT, "
                "fingerprint TEXT, owner TEXT, lock_expires_at REAL, expires_at REAL, "
                "response BLOB, response_size INTEGER DEFAULT 0, too_large INTEGER DEFAULT 0, "
                "taken_over INTEGER DEFAULT 0, tenant TEXT NOT NULL)"
            )
        other.close()
        with pytest.raises(sqlite3.IntegrityError):
            await store.aclaim(claim_request())
        assert threaded.names == []
        # As a pooled connection that failed so would be: closed (its transaction with it),
        # not reused.
        assert store._transport._inline_pool._idle == []
        await background_done(store)
        assert is_closed(inline)


async def test_an_inline_connection_that_cannot_roll_back_is_closed(
    store: SQLiteStore,
) -> None:
    inline = await warmed_up(store)

    def breaks_its_connection() -> Flow[None]:
        yield Statement("BEGIN")
        assert inline.in_transaction  # (the flow's statement ran on it)
        inline.close()  # the transaction cannot be rolled back now
        raise RuntimeError("broken mid-call")

    with pytest.raises(RuntimeError, match="broken mid-call"):
        await store._transport.arun("test", breaks_its_connection())
    assert store._transport._inline_pool._idle == []


async def test_when_the_inline_connection_cannot_be_opened_the_call_still_answers(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threaded = ThreadCalls(store, monkeypatch)
    attempts: list[int] = []
    open_inline = store._transport._inline_pool._connect
    failing = True

    def connect() -> sqlite3.Connection:
        attempts.append(threading.get_ident())
        if failing:
            raise sqlite3.OperationalError("unable to open database file")
        return open_inline()

    monkeypatch.setattr(store._transport._inline_pool, "_connect", connect)
    assert await store.aclaim(claim_request()) == Claimed()
    assert store._transport._inline_pool._idle == []
    assert await store.acomplete(completion()) is True  # tried again, on a thread again
    assert len(attempts) == 2
    assert threading.get_ident() not in attempts  # never opened on the loop
    assert threaded.calls == ["_run_then_open_inline"] * 2
    failing = False
    record = await store.aget("k")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert len(store._transport._inline_pool._idle) == 1
    assert await store.adelete("k") is True  # inline now
    assert threaded.calls == ["_run_then_open_inline"] * 3


# -- closing --------------------------------------------------------------------------------


async def test_close_closes_the_inline_connections_and_the_store_works_again(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    inline = await warmed_up(store)
    assert await store.aclaim(claim_request()) == Claimed()
    await store.aclose()
    assert store._transport._inline_pool._idle == []
    assert is_closed(inline)
    threaded = ThreadCalls(store, monkeypatch)
    assert isinstance(await store.aclaim(claim_request(owner="b")), Held)
    assert threaded.calls == ["_run_then_open_inline"]
    reopened = the_inline_connection(store)
    assert reopened is not inline
    assert await store.arelease("k", "owner-a") is True
    assert threaded.calls == ["_run_then_open_inline"]


async def test_an_inline_connection_in_use_during_close_is_closed_when_given_back(
    store: SQLiteStore,
) -> None:
    inline = await warmed_up(store)

    def closes_the_store_meanwhile() -> Flow[bool]:
        # close() from another thread while this flow has the inline connection.
        closer = threading.Thread(target=store._transport._inline_pool.close)
        closer.start()
        closer.join()
        return bool((yield Statement(store._ops.sql.delete, ("k",))).changed)

    assert await store._transport.arun("delete", closes_the_store_meanwhile()) is False
    assert store._transport._inline_pool._idle == []
    await background_done(store)
    assert is_closed(inline)


# -- what the inline call leaves to others -----------------------------------------------------


async def test_the_breakers_hooks_run_outside_the_inline_call(tmp_path: Path) -> None:
    # A hook (an event listener) may call the store: the inline connection is back in its
    # pool (or discarded) by then.
    async with SQLiteStore(tmp_path / "db.sqlite3", purge_interval_seconds=None) as store:
        await warmed_up(store)
        seen: list[int] = []

        class Recording(CircuitBreaker):
            def succeeded(self) -> None:
                seen.append(len(store._transport._inline_pool._idle))
                super().succeeded()

            def failed(self, error: StoreUnavailable) -> None:
                seen.append(len(store._transport._inline_pool._idle))
                super().failed(error)

        store.breaker = Recording(5, 30.0, SYSTEM_CLOCK)
        assert await store.aclaim(claim_request()) == Claimed()
        with sqlite3.connect(tmp_path / "db.sqlite3") as other:
            other.execute("DROP TABLE idempotency_records")
        other.close()
        with pytest.raises(StoreUnavailable, match="no such table"):
            await store.aget("k")
        assert seen == [1, 0]


async def test_a_background_call_after_the_thread_pool_shut_down_is_dropped_not_raised(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # The write it rides on has committed: a store closing meanwhile must not fail it.
    inline = await warmed_up(store)
    caplog.set_level(logging.DEBUG, LOGGER)
    pool = store._transport._threads.pool()
    pool.shutdown(wait=True)
    ran: list[int] = []
    assert store._transport._in_background(ran.append, 1) is False
    assert ran == []
    assert "background append not run" in caplog.text
    # A connection to discard is then closed where it is.
    store._transport._close_off_the_loop(inline)
    assert is_closed(inline)
