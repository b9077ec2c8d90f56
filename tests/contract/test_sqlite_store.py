"""SQLiteStore: the store protocol on one SQLite file, shared by threads and processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from idempotency_middleware import IdempotencyWSGIMiddleware
from idempotency_middleware.stores.kit import Flow
from idempotency_middleware.stores.protocol import (
    Claimed,
    ClaimRequest,
    Completion,
    Held,
    StoreUnavailable,
)
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.stores.sqlite import SQLiteStore
from idempotency_middleware.testing import FakeClock
from idempotency_middleware.web.wsgi import Environ, StartResponse, WSGIApp
from tests.support.ports import free_port
from tests.support.servers import HOST, serve_wsgi

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK = 10.0
TTL = 100.0
RESPONSE = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')


def claim_request(
    key: str = "k", *, owner: str = "owner-a", now: float | None = None, lock: float = LOCK
) -> ClaimRequest:
    return ClaimRequest(
        key_hash=key,
        fingerprint="fp",
        owner=owner,
        now=time.time() if now is None else now,
        lock_timeout_seconds=lock,
    )


def completion(
    key: str = "k",
    *,
    owner: str = "owner-a",
    now: float | None = None,
    ttl: float = TTL,
    response: StoredResponse = RESPONSE,
    **extra: Any,
) -> Completion:
    return Completion(
        key_hash=key,
        owner=owner,
        now=time.time() if now is None else now,
        ttl_seconds=ttl,
        response=response,
        **extra,
    )


@pytest.fixture(params=["returning", "changes"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteStore]:
    """A store on a fresh file, without periodic purge (tests of purge make their own).

    Parametrized over both ways of detecting a won claim: ``RETURNING`` (SQLite >= 3.35)
    and the ``changes()`` fallback for older SQLite builds.
    """
    with SQLiteStore(tmp_path / "idempotency.sqlite3", purge_interval_seconds=None) as store:
        store._ops.use_returning = request.param == "returning" and store._ops.use_returning
        yield store


# -- the store protocol -------------------------------------------------------------------
# What every store guarantees (claims, fencing, deadlines, renewals, deletes, both flavours,
# the RETURNING and changes() paths) is held to the contract, tests/contract/test_store_contract.py
# (kinds sqlite, sqlite-async, sqlite-changes); here, only what is SQLite's own.


def test_response_over_max_response_bytes_is_completed_but_marked_too_large(
    tmp_path: Path,
) -> None:
    with SQLiteStore(tmp_path / "db.sqlite3", max_response_bytes=8) as store:
        store.claim(claim_request())
        assert store.complete(completion()) is True
        result = store.claim(claim_request(owner="b"))
    assert isinstance(result, Held)
    assert result.record.status is Status.COMPLETED
    assert result.record.response is None
    assert result.record.response_not_stored is True
    assert result.record.response_size == len(RESPONSE.body)


def test_response_within_max_response_bytes_is_kept(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db.sqlite3", max_response_bytes=len(RESPONSE.body)) as store:
        store.claim(claim_request())
        store.complete(completion())
        record = store.get("k")
    assert record is not None
    assert record.response == RESPONSE
    assert record.response_not_stored is False


# -- schema, files and errors -------------------------------------------------------------


def test_schema_is_created_on_first_use_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with SQLiteStore(path, table_name="idem") as store:
        assert not path.exists()  # no I/O before first use
        store.claim(claim_request())
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    assert {"idem", "idem_expires_at"} <= tables
    raw.close()


def test_create_table_is_safe_to_repeat(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "db.sqlite3") as store:
        store.create_table()
        store.claim(claim_request())
        store.create_table()
        assert store.get("k") is not None


def test_several_stores_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        assert first.claim(claim_request(owner="one")) == Claimed()
        held = second.claim(claim_request(owner="two"))
        assert isinstance(held, Held)
        assert held.record.owner == "one"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"path": ":memory:"}, "MemoryStore"),
        ({"path": ""}, "MemoryStore"),
        ({"path": "x.db", "table_name": "idem; DROP TABLE x"}, "identifier"),
        ({"path": "x.db", "synchronous": "sometimes"}, "synchronous"),
    ],
)
def test_bad_configuration_is_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SQLiteStore(**arguments)


def test_unopenable_file_raises_store_unavailable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "missing-directory" / "db.sqlite3")
    with pytest.raises(StoreUnavailable) as raised:
        store.claim(claim_request())
    assert raised.value.code


@pytest.fixture
def write_lock_held(tmp_path: Path) -> Iterator[Path]:
    """A database file whose write lock another connection holds for the whole test."""
    path = tmp_path / "locked.sqlite3"
    with SQLiteStore(path) as store:
        store.create_table()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield path
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_lock_held_past_the_busy_timeout_raises_store_unavailable(write_lock_held: Path) -> None:
    with SQLiteStore(write_lock_held, busy_timeout_seconds=0.2) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised:
            store.claim(claim_request())
        waited = time.monotonic() - started
        assert 0.15 < waited < 3
        assert raised.value.code in ("SQLITE_BUSY", "OperationalError")
        assert len(store._transport._pool._idle) == 1  # a lock timeout does not cost the connection
        # Reads still work beside the writer (WAL), and the store recovers afterwards.
        assert store.get("k") is None


def test_store_recovers_once_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with SQLiteStore(path, busy_timeout_seconds=0.1) as store:
        store.create_table()
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable):
            store.claim(claim_request())
        holder.execute("ROLLBACK")
        holder.close()
        assert store.claim(claim_request()) == Claimed()


def test_a_writer_waits_for_the_lock_within_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with SQLiteStore(path, busy_timeout_seconds=5) as store:
        store.create_table()
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        timer = threading.Timer(0.3, lambda: holder.execute("ROLLBACK"))
        timer.start()
        try:
            assert store.claim(claim_request()) == Claimed()
        finally:
            timer.join()
            holder.close()


def test_close_is_idempotent_and_the_store_reopens(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite3")
    store.claim(claim_request())
    store.close()
    store.close()
    assert isinstance(store.claim(claim_request(owner="b")), Held)
    store.close()


# -- periodic purge -----------------------------------------------------------------------


def _expired_rows(store: SQLiteStore, count: int, now: float) -> None:
    for number in range(count):
        key = f"old-{number}"
        store.claim(claim_request(key, now=now - 100))
        store.complete(completion(key, now=now - 100, ttl=10))


def _stored_keys(store: SQLiteStore, keys: Iterable[str]) -> set[str]:
    return {key for key in keys if store.get(key) is not None}


def test_purge_expired_deletes_expired_records_only(store: SQLiteStore) -> None:
    now = time.time()
    _expired_rows(store, 5, now)
    store.claim(claim_request("stale-claim", now=now - 100, lock=1))  # expired in progress
    store.claim(claim_request("live-claim", now=now))
    store.claim(claim_request("live-done", now=now))
    store.complete(completion("live-done", now=now))
    store.purge_batch_size = 2  # several batches
    assert store.purge_expired(now) == 6
    keys = [f"old-{n}" for n in range(5)] + ["stale-claim", "live-claim", "live-done"]
    assert _stored_keys(store, keys) == {"live-claim", "live-done"}


def test_writes_purge_expired_records_at_most_once_per_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    now = clock.now()
    with SQLiteStore(tmp_path / "db.sqlite3", purge_interval_seconds=60, clock=clock) as store:
        # The first write of the process purges (nothing yet); the expired rows written
        # within the interval stay stored.
        _expired_rows(store, 3, now)
        clock.advance(59.9)
        store.claim(claim_request("fresh-1", now=now))
        old = [f"old-{n}" for n in range(3)]
        assert _stored_keys(store, old) == set(old)
        clock.advance(0.2)
        store.claim(claim_request("fresh-2", now=now))  # this write purges
        assert _stored_keys(store, old) == set()
        assert _stored_keys(store, ["fresh-1", "fresh-2"]) == {"fresh-1", "fresh-2"}


def test_purge_expired_defaults_to_the_stores_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    with SQLiteStore(tmp_path / "db.sqlite3", purge_interval_seconds=None, clock=clock) as store:
        store.claim(claim_request("done", now=clock.now()))
        store.complete(completion("done", now=clock.now(), ttl=TTL))
        assert store.purge_expired() == 0
        clock.advance(TTL + 1)
        assert store.purge_expired() == 1
        assert store.get("done") is None


def test_a_full_purge_batch_lets_the_next_write_continue(tmp_path: Path) -> None:
    now = time.time()
    path = tmp_path / "db.sqlite3"
    with SQLiteStore(path, purge_interval_seconds=None) as seeder:
        _expired_rows(seeder, 5, now)
    old = [f"old-{n}" for n in range(5)]
    with SQLiteStore(path, purge_interval_seconds=3600, purge_batch_size=2) as store:
        remaining = []
        for number in range(4):
            store.claim(claim_request(f"new-{number}", now=now))
            remaining.append(len(_stored_keys(store, old)))
    assert remaining == [3, 1, 0, 0]


def test_purge_that_cannot_get_the_lock_does_not_fail_the_write(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    now = time.time()
    with SQLiteStore(path, purge_interval_seconds=None) as seeder:
        _expired_rows(seeder, 2, now)
    with SQLiteStore(path, purge_interval_seconds=3600, busy_timeout_seconds=5) as store:
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        purge_after_write = store._ops.purge_batch

        def another_worker_writes_first(cutoff: float, statement: str) -> Flow[None]:
            holder.execute("BEGIN IMMEDIATE")
            try:
                yield from purge_after_write(cutoff, statement)
            finally:
                holder.execute("ROLLBACK")

        store._ops.purge_batch = another_worker_writes_first  # type: ignore[method-assign]
        started = time.monotonic()
        assert store.claim(claim_request("new", now=now)) == Claimed()
        assert time.monotonic() - started < 1  # did not wait the 5 s busy timeout
        holder.close()
        assert _stored_keys(store, ["old-0", "old-1"]) == {"old-0", "old-1"}
        # The connection went back to the pool with its full busy timeout.
        (connection,) = store._transport._pool._idle
        assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


# -- async methods ------------------------------------------------------------------------


async def test_async_context_manager_stops_the_stores_threads(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    async with SQLiteStore(tmp_path / "db.sqlite3") as store:
        assert await store.aclaim(claim_request()) == Claimed()
        started = [
            thread
            for thread in set(threading.enumerate()) - before
            if thread.name.startswith("idempotency-sqlite")
        ]
        assert started
    assert not any(thread.is_alive() for thread in started)


async def test_async_methods_do_not_block_the_event_loop(write_lock_held: Path) -> None:
    # The claim waits (in a worker thread) for a write lock another connection holds until
    # its busy timeout runs out; meanwhile the loop keeps running other tasks.
    async with SQLiteStore(write_lock_held, busy_timeout_seconds=0.6) as store:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.aclaim(claim_request())
        waited = time.monotonic() - started
        ticking.cancel()
        assert waited >= 0.5
        assert ticks >= 20


def _use_store_after_fork(store: SQLiteStore, results: Any) -> None:
    try:
        sync = store.claim(claim_request("child-sync", owner="child"))
        in_thread = asyncio.run(store.aclaim(claim_request("child-async", owner="child")))
        results.put((type(sync).__name__, type(in_thread).__name__))
    except BaseException as error:
        results.put(("error", repr(error)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_store_used_before_fork_works_in_the_child(tmp_path: Path) -> None:
    # gunicorn --preload: the app (and its store) may be used in the master, then forked.
    # The child must open its own connections and worker threads, not inherit them.
    with SQLiteStore(tmp_path / "db.sqlite3") as store:
        assert store.claim(claim_request("parent")) == Claimed()
        assert asyncio.run(store.aclaim(claim_request("parent-async"))) == Claimed()
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        child = context.Process(target=_use_store_after_fork, args=(store, results))
        child.start()
        try:
            assert results.get(timeout=20) == ("Claimed", "Claimed")
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        assert isinstance(store.claim(claim_request("child-sync")), Held)
        assert store.claim(claim_request("parent-again")) == Claimed()


# -- real servers -------------------------------------------------------------------------


def _wait_for(condition: Callable[[], bool], seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.05)


async def _post_all(base_url: str, count: int, key: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=20, limits=limits) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": key})
                    for _ in range(count)
                )
            )
        )


def test_uvicorn_workers_hammering_one_key_run_the_handler_once(tmp_path: Path) -> None:
    workers = 3
    runs_file, hits_file = tmp_path / "runs.txt", tmp_path / "hits.txt"
    ready_dir = tmp_path / "ready"
    ready_dir.mkdir()
    environment = dict(
        os.environ,
        IDEM_SQLITE_PATH=str(tmp_path / "shared.sqlite3"),
        IDEM_RUNS_FILE=str(runs_file),
        IDEM_HITS_FILE=str(hits_file),
        IDEM_READY_DIR=str(ready_dir),
    )
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.support.sqlite_worker_app:create_app",
            "--factory",
            "--workers",
            str(workers),
            "--host",
            HOST,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO_ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _wait_for(
            lambda: len(list(ready_dir.iterdir())) == workers or server.poll() is not None,
            20,
            "uvicorn workers did not start",
        )
        assert server.poll() is None, "uvicorn exited"
        base_url = f"http://{HOST}:{port}"
        _wait_for(lambda: _answers(base_url), 10, "uvicorn does not answer")
        key = f"order-{uuid.uuid4()}"

        burst = asyncio.run(_post_all(base_url, 30, key))
        later = asyncio.run(_post_all(base_url, 10, key))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)
        assert server.stderr is not None
        errors = server.stderr.read().decode(errors="replace")
        server.stderr.close()

    runs = runs_file.read_text().splitlines()
    assert len(runs) == 1, runs
    run_id = runs[0].split()[1]
    statuses = [response.status_code for response in burst + later]
    assert all(status < 500 for status in statuses), (statuses, errors)
    assert set(statuses) <= {201, 409}, statuses
    originals = [
        r for r in burst if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    assert len(originals) == 1
    for response in burst + later:
        if response.status_code == 409:
            assert "retry-after" in response.headers
        else:
            assert response.json()["run"] == run_id
    assert all(r.status_code == 201 for r in later)
    assert all(r.headers["idempotent-replayed"] == "true" for r in later)
    # The requests really were spread over several worker processes.
    hit_pids = {line for line in hits_file.read_text().splitlines()}
    assert len(hit_pids) >= 2, hit_pids


def _answers(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _wsgi_app(runs: list[str], lock: threading.Lock) -> WSGIApp:
    def app(environ: Environ, start_response: StartResponse) -> list[bytes]:
        run_id = uuid.uuid4().hex
        with lock:
            runs.append(run_id)
        time.sleep(0.2)
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [run_id.encode()]

    return app


def test_threaded_wsgi_server_on_sqlite_runs_the_handler_once(tmp_path: Path) -> None:
    runs: list[str] = []
    with SQLiteStore(tmp_path / "db.sqlite3") as store:
        app = IdempotencyWSGIMiddleware(_wsgi_app(runs, threading.Lock()), store=store)
        with serve_wsgi(app) as base_url:
            burst = asyncio.run(_post_all(base_url, 20, "wsgi-key"))
            replay = httpx.post(
                f"{base_url}/orders", json={"item": "book"}, headers={"Idempotency-Key": "wsgi-key"}
            )
    assert len(runs) == 1
    statuses = sorted(response.status_code for response in burst)
    assert set(statuses) <= {201, 409}, statuses
    assert statuses.count(201) >= 1
    assert replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.text == runs[0]
