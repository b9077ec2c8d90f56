"""Every thread, task and event loop a door or a store starts is ended by its ``close()`` /
``aclose()``, or when its loop ends, or (the lease renewer) once it has nothing to do.

Each test takes the process's threads as its baseline, runs many doors (or one door many
times), ends them the way a user would, and counts again: the threads started meanwhile,
the tasks still pending, the event loops still alive after a collection (weak references).
A thread that ends by itself is waited for with a bounded join, never with a sleep.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from psycopg_pool.pool import MaintenanceTask

from idempotency_middleware import (
    IdempotentConsumer,
    MemoryStore,
    PostgresStore,
    RedisStore,
    SQLiteStore,
    SQSWorker,
    idempotent,
)
from idempotency_middleware.consumers import sqs_worker
from idempotency_middleware.stores.protocol import StoreUnavailable
from tests.conftest import REGION

# A bound on every join: what ends must end well within it.
JOIN = 5.0
RENEWER = "idempotency-lease-renewer"
WATCHDOG = "idempotency-postgres-deadlines"
# A short lock: the lease renewer ticks every 0.05 s, so an idle one ends at once.
SHORT_LOCK = 0.3


def started_since(baseline: set[threading.Thread]) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread not in baseline]


def joined(threads: list[threading.Thread]) -> list[str]:
    """Join each of ``threads`` (bounded); the names of those still alive."""
    for thread in threads:
        thread.join(JOIN)
    return [thread.name for thread in threads if thread.is_alive()]


def live(loops: list[weakref.ref[asyncio.AbstractEventLoop]]) -> int:
    gc.collect()
    return sum(1 for loop in loops if loop() is not None)


@pytest.fixture
def baseline() -> Iterator[set[threading.Thread]]:
    gc.collect()
    yield set(threading.enumerate())


@pytest.fixture(params=["memory", "sqlite"])
def sync_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    store = SQLiteStore(tmp_path / "store.sqlite3")
    try:
        yield store
    finally:
        store.close()


def test_fifty_decorated_sync_functions_share_one_renewer_that_ends_when_idle(
    sync_store: Any, baseline: set[threading.Thread]
) -> None:
    # Before, every decorated function started its own renewer thread at its first call,
    # and none ever ended: 50 functions, 50 threads for the life of the process. (Counted
    # among all threads: the renewer an earlier test left, still ending at its next tick,
    # may be the one that serves these calls.)
    renewers_seen: list[int] = []

    def renewers() -> list[threading.Thread]:
        return [thread for thread in threading.enumerate() if thread.name == RENEWER]

    def serving_renewers() -> int:
        # A renewer whose tick found no claim ends, and the next claim starts another: the
        # one ending may still be alive, on its way out, while that claim runs (seen as two,
        # one run in a few on a loaded machine). It ends within a moment, while a second
        # renewer serving claims never would: joined in turn, a bounded while, until one is
        # left.
        deadline = time.monotonic() + JOIN
        found = renewers()
        while len(found) > 1 and time.monotonic() < deadline:
            for thread in found:
                thread.join(0.01)
            found = renewers()
        return len(found)

    def function(number: int) -> Callable[[str], int]:
        def body(key: str) -> int:
            renewers_seen.append(serving_renewers())
            return number

        body.__qualname__ = f"body{number}"
        decorate = idempotent(
            store=sync_store, key="key", name=f"owned.f{number}", lock_timeout_seconds=SHORT_LOCK
        )
        return decorate(body)

    functions = [function(number) for number in range(50)]
    assert [call(f"k-{uuid.uuid4().hex}") for call in functions] == list(range(50))

    assert max(renewers_seen) == 1  # one renewer, whatever the number of functions
    assert {thread.name for thread in started_since(baseline)} <= {RENEWER}
    assert joined(renewers()) == []  # idle: it ended by itself
    # And it starts again, lazily, for the next call.
    assert functions[0](f"k-{uuid.uuid4().hex}") == 0
    assert renewers_seen[-1] == 1
    assert joined(renewers()) == []


def test_fifty_asyncio_runs_of_an_idempotent_coroutine_leave_no_loop_alive(
    baseline: set[threading.Thread],
) -> None:
    # Before, the lease renewal of each loop kept it alive (its timer's handle held the
    # loop, and the renewal state held the timer): 50 runs, 50 closed loops never freed.
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    pending: list[int] = []

    @idempotent(store=MemoryStore(), key="key", name="owned.coroutine")
    async def charge(key: str) -> str:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return key

    async def call(key: str) -> str:
        answer = await charge(key)
        pending.append(len(asyncio.all_tasks()) - 1)  # beside this one
        return answer

    keys = [f"k-{number}" for number in range(50)]
    assert [asyncio.run(call(key)) for key in keys] == keys

    assert len(loops) == 50 and live(loops) == 0
    assert pending == [0] * 50
    assert started_since(baseline) == []


async def _hold_and_wait(store: Any, name: str) -> list[str]:
    """A first call holding its key while a duplicate waits (``wait_seconds``) for it, on
    the pushed changes of ``store``; both answers."""
    first_runs = asyncio.Event()
    release = asyncio.Event()

    @idempotent(store=store, key="key", name=name, wait_seconds=30)
    async def charge(key: str) -> str:
        first_runs.set()
        await release.wait()
        return f"{key}-done"

    first = asyncio.ensure_future(charge("k"))
    await first_runs.wait()
    duplicate = asyncio.ensure_future(charge("k"))
    # (The listener's thread says so with a flag: looked at, bounded by the test's timeout.)
    while not store.wakeups.subscribed:  # noqa: ASYNC110 - the duplicate's wait started it
        await asyncio.sleep(0.005)
    release.set()
    return list(await asyncio.gather(first, duplicate))


def _redis(redis_url: str) -> RedisStore:
    return RedisStore(redis_url, prefix=f"owned-{uuid.uuid4().hex[:8]}:")


def _postgres(postgres_dsn: str) -> PostgresStore:
    store = PostgresStore(postgres_dsn, table=f"owned_{uuid.uuid4().hex[:10]}")
    store.create_table()
    store.close()
    return store


@pytest.fixture(params=["redis", "postgres"])
def pushing_store(request: pytest.FixtureRequest) -> Any:
    if request.param == "redis":
        return _redis(request.getfixturevalue("redis_url"))
    return _postgres(request.getfixturevalue("postgres_dsn"))


def test_a_waited_on_store_closed_with_aclose_ends_its_listener(
    pushing_store: Any, baseline: set[threading.Thread]
) -> None:
    # Before, aclose() left the wake-up listener thread running (only close() stopped it).
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main() -> list[str]:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        try:
            return await _hold_and_wait(pushing_store, f"owned.{uuid.uuid4().hex[:8]}")
        finally:
            await pushing_store.aclose()

    assert asyncio.run(main()) == ["k-done", "k-done"]

    assert [thread.name for thread in started_since(baseline)] == []
    assert live(loops) == 0


def test_a_waited_on_store_closed_with_close_ends_its_listener(
    pushing_store: Any, baseline: set[threading.Thread]
) -> None:
    first_runs, release = threading.Event(), threading.Event()

    name = f"owned.{uuid.uuid4().hex[:8]}"

    # (A 3 s lock: the renewer ticks every 0.5 s, and ends within a tick once idle.)
    @idempotent(store=pushing_store, key="key", name=name, wait_seconds=30, lock_timeout_seconds=3)
    def charge(key: str) -> str:
        first_runs.set()
        release.wait(JOIN)
        return f"{key}-done"

    answers: list[str] = []
    callers = [threading.Thread(target=lambda: answers.append(charge("k"))) for _ in range(2)]
    callers[0].start()
    assert first_runs.wait(JOIN)
    callers[1].start()
    while not pushing_store.wakeups.subscribed:  # the duplicate's wait started the listener
        callers[1].join(0.005)
    release.set()
    assert joined(callers) == [] and answers == ["k-done", "k-done"]
    pushing_store.close()

    # The renewer and the statement watchdog are the process's: they end once idle.
    idle_ending = {RENEWER, WATCHDOG}
    assert [t.name for t in started_since(baseline) if t.name not in idle_ending] == []
    assert joined(started_since(baseline)) == []


class LostClaimAnswers(MemoryStore):
    """A MemoryStore whose claims land but answer as if the connection was cut, so each
    attempt leaves the release of its claim to a background task. Releases are recorded;
    with ``hang_releases`` they never end (until cancelled)."""

    def __init__(self, hang_releases: bool = False) -> None:
        super().__init__()
        self.hang_releases = hang_releases
        self.released = threading.Event()
        self.cancelled: list[str] = []
        self.loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def aclaim(self, request: Any) -> Any:
        self.loops.append(weakref.ref(asyncio.get_running_loop()))
        self.claim(request)
        raise StoreUnavailable("answer lost")

    async def arelease(self, key: str, owner: str) -> bool:
        if self.hang_releases:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(key)
                raise
        released = self.release(key, owner)
        self.released.set()
        return released


def _worker(store: MemoryStore, sqs: Any, queue_url: str) -> SQSWorker:
    async def handle(message: dict[str, Any]) -> str:
        return str(message["Body"])

    consumer = IdempotentConsumer(
        handle, store=store, key=lambda message: message["MessageId"], name="owned.sqs"
    )
    return SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=0)


@pytest.fixture
def sqs_queue(moto_endpoint: str) -> Iterator[tuple[Any, str]]:
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    queue = client.create_queue(QueueName=f"owned-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    client.send_message(QueueUrl=queue, MessageBody="order-1")
    yield client, queue
    client.close()


def test_a_lost_claims_release_goes_on_between_sqs_batches(sqs_queue: tuple[Any, str]) -> None:
    # Before, the worker's loop ran only inside run_once(): a background release spawned by
    # a batch stalled until the next batch came, and close() closed the loop with it pending.
    sqs, queue = sqs_queue
    store = LostClaimAnswers()
    worker = _worker(store, sqs, queue)
    try:
        [outcome] = worker.run_once()
        assert outcome.action == "retry"
        assert store.released.wait(JOIN)  # with no batch running
    finally:
        worker.close()


def test_a_closed_sqs_worker_cancels_its_background_work_and_ends_its_loop(
    sqs_queue: tuple[Any, str], baseline: set[threading.Thread], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (No grace: a release that never ends is cancelled at once.)
    monkeypatch.setattr(sqs_worker, "CLOSE_TIMEOUT_SECONDS", 0.0, raising=False)
    sqs, queue = sqs_queue
    store = LostClaimAnswers(hang_releases=True)
    worker = _worker(store, sqs, queue)
    [outcome] = worker.run_once()
    assert outcome.action == "retry"

    worker.close()

    assert len(store.cancelled) == 1  # cancelled cleanly, not destroyed pending
    assert joined(started_since(baseline)) == [] and started_since(baseline) == []
    assert len(store.loops) == 1 and live(store.loops) == 0


class HoldsThePool(MaintenanceTask):
    """Runs on one of the pool's worker threads, holding the pool (as psycopg_pool's own
    tasks do, adding a connection) until told to return."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.running, self.proceed = threading.Event(), threading.Event()

    def _run(self, pool: Any) -> None:
        self.running.set()
        self.proceed.wait(JOIN)


def test_a_postgres_store_dropped_unclosed_is_not_closed_from_its_pools_own_worker(
    postgres_dsn: str, baseline: set[threading.Thread], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, the pool of a store dropped while one of its workers held it (adding a
    # connection) was freed on that worker, whose __del__ then joined its own thread:
    # "Exception ignored in ... RuntimeError: cannot join current thread".
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: unraisable.append(repr(hook)))
    store = PostgresStore(postgres_dsn, table=f"owned_{uuid.uuid4().hex[:10]}")
    store.create_table()  # the sync pool, with its worker threads
    pool = store._transport.pool()
    task = HoldsThePool(pool)
    pool.run_task(task)
    assert task.running.wait(JOIN)
    del pool
    del store
    gc.collect()  # dropped, while a worker holds its pool

    task.proceed.set()

    assert joined(started_since(baseline)) == []  # its threads ended (the watchdog's too)
    gc.collect()
    assert unraisable == []
