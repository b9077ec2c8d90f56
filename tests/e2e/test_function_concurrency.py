"""Simultaneous calls with one key to an ``idempotent`` function run it once: from threads,
from event-loop tasks and from processes. An owner process killed mid-function is taken
over once its lease has passed; one frozen mid-function (SIGSTOP) and resumed after the
takeover has its completion refused, so the store keeps the taker's result.

Overlap is made certain, not likely: the store is wrapped (``ObservedStore``) so the running
function sees every other caller's claim find the key held, and holds the key until all of
them have. Without ``wait_seconds`` those callers get ``KeyInProgressError``; with it they
wait and all get the one result.

Atomic stores only: ``MemoryStore`` (threads, tasks), ``SQLiteStore`` and Amazon's DynamoDB
Local (ids ``dynamodb-local``, run by ``scripts/dynamodb-local.sh``, skipped otherwise).
Never moto: its threaded server does not apply a conditional write atomically
(tests/contract/test_moto_atomicity.py), so two claims of one key can both win there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    AsyncStore,
    DynamoDBStore,
    IdempotencyEvent,
    KeyInProgressError,
    MemoryStore,
    SQLiteStore,
    SyncStore,
    idempotent,
)
from idempotency_middleware.clock import SYSTEM_CLOCK, Clock
from idempotency_middleware.stores.records import Record, Status
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION
from tests.support.function_worker import (
    HOLD_TIMEOUT_SECONDS,
    ObservedStore,
    build_store,
    make_work,
    read_lines,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BURST = 8  # threads or tasks calling at once
PROCESSES = 4  # processes calling at once (each starts a Python interpreter)
WAIT_SECONDS = 10.0  # a duplicate's wait for the running call's result
LOCK_SECONDS = 60.0  # the lock timeout of the crash tests: crossed with a fake clock
WORKER_TIMEOUT_SECONDS = 60.0

WAITS = [pytest.param(0.0, id="no-wait"), pytest.param(WAIT_SECONDS, id="wait")]
PROCESS_BACKENDS = ["sqlite", "redis", "postgres", "dynamodb-local"]


@dataclass
class Backend:
    """One atomic store, as stores for this process and as a spec for a child process."""

    kind: str  # "memory", "sqlite", "redis", "postgres", "dynamodb-local"
    path: Path | None = None
    url: str | None = None  # Redis's URL or PostgreSQL's DSN
    namespace: str = field(default_factory=lambda: f"functions_{uuid.uuid4().hex[:12]}")
    endpoint: str | None = None
    table: str | None = None
    memory: MemoryStore = field(default_factory=MemoryStore)
    opened: list[Any] = field(default_factory=list)

    def spec(self) -> dict[str, Any]:
        if self.kind == "sqlite":
            return {"kind": "sqlite", "path": str(self.path)}
        if self.kind == "redis":
            return {"kind": "redis", "url": self.url, "prefix": f"{self.namespace}:"}
        if self.kind == "postgres":
            return {"kind": "postgres", "dsn": self.url, "table": self.namespace}
        assert self.kind == "dynamodb-local", "a MemoryStore cannot be shared with a child"
        return {"kind": "dynamodb", "endpoint": self.endpoint, "table": self.table}

    def sync_store(self, clock: Clock = SYSTEM_CLOCK) -> SyncStore:
        if self.kind == "memory":
            return self.memory
        store: SyncStore = build_store(self.spec(), clock)
        self.opened.append(store)
        return store

    def async_store(self) -> AsyncStore:
        """For the test's own event loop; ``close_async`` it there."""
        if self.kind == "memory":
            return self.memory
        if self.kind == "sqlite":
            assert self.path is not None
            store = SQLiteStore(self.path)
            self.opened.append(store)
            return store
        if self.kind in ("redis", "postgres"):
            # Closed on the test's loop by close_async (its async client belongs there).
            built: AsyncStore = build_store(self.spec())
            return built
        assert self.table is not None
        return AsyncDynamoDBStore(self.table, endpoint_url=self.endpoint, region_name=REGION)

    def record(self, key_hash: str) -> Record | None:
        store = build_store(self.spec())
        self.opened.append(store)
        record: Record | None = store.get(key_hash)
        return record

    def close(self) -> None:
        for store in self.opened:
            store.close()


async def close_async(store: AsyncStore) -> None:
    aclose = getattr(store, "aclose", None)
    if aclose is not None and not isinstance(store, SQLiteStore):
        await aclose()


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres", "dynamodb-local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh store: its schema or table created first, as a deployment does."""
    kind: str = request.param
    backend = Backend(kind)
    if kind == "sqlite":
        backend.path = tmp_path / "idempotency.sqlite3"
        with SQLiteStore(backend.path) as creator:
            creator.create_table()
    elif kind in ("redis", "postgres"):
        backend.url = request.getfixturevalue("redis_url" if kind == "redis" else "postgres_dsn")
        with contextlib.closing(build_store(backend.spec())) as creator:
            creator.create_table()
    elif kind == "dynamodb-local":
        backend.endpoint = request.getfixturevalue("dynamodb_local_endpoint")
        backend.table = f"functions-{uuid.uuid4().hex[:12]}"
        with DynamoDBStore(
            backend.table, endpoint_url=backend.endpoint, region_name=REGION
        ) as creator:
            creator.create_table()
    try:
        yield backend
    finally:
        backend.close()


def assert_ran_once(
    results: list[str], refusals: list[float], runs: list[str], wait_seconds: float
) -> None:
    """One run; the others waited for its result (``wait_seconds``) or were refused."""
    assert len(runs) == 1, runs
    if wait_seconds:
        assert refusals == []
        assert results == [results[0]] * len(results)
    else:
        assert len(results) == 1, results
        assert all(retry_after > 0 for retry_after in refusals), refusals
    assert len(results) + len(refusals) == BURST


# --- threads and tasks ------------------------------------------------------------------


@pytest.mark.parametrize("wait_seconds", WAITS)
def test_simultaneous_calls_from_threads_run_the_function_once(
    backend: Backend, wait_seconds: float
) -> None:
    key = f"threads-{uuid.uuid4()}"
    lock = threading.Lock()
    held_by: set[int] = set()
    all_held = threading.Event()

    def on_held() -> None:
        with lock:
            held_by.add(threading.get_ident())
            if len(held_by) == BURST - 1:
                all_held.set()

    runs: list[str] = []

    @idempotent(
        store=ObservedStore(backend.sync_store(), on_held), key="key", wait_seconds=wait_seconds
    )
    def work(key: str) -> str:
        runs.append(threading.current_thread().name)
        if not all_held.wait(HOLD_TIMEOUT_SECONDS):
            raise TimeoutError(f"only {len(held_by)} other callers found the key held")
        return f"ran in {threading.current_thread().name}"

    barrier = threading.Barrier(BURST, timeout=60)
    results: list[str] = []
    refusals: list[float] = []

    def call(_: int) -> None:
        barrier.wait(timeout=10)
        try:
            results.append(work(key))
        except KeyInProgressError as error:
            refusals.append(error.retry_after)

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        list(pool.map(call, range(BURST)))

    assert_ran_once(results, refusals, runs, wait_seconds)
    assert results[0] == f"ran in {runs[0]}"
    assert work(key) == results[0]  # and later calls replay it
    assert len(runs) == 1


@pytest.mark.parametrize("wait_seconds", WAITS)
async def test_simultaneous_calls_from_tasks_run_the_function_once(
    backend: Backend, wait_seconds: float
) -> None:
    key = f"tasks-{uuid.uuid4()}"
    held_by: set[asyncio.Task[Any]] = set()
    all_held = asyncio.Event()

    def on_held() -> None:
        task = asyncio.current_task()
        assert task is not None
        held_by.add(task)
        if len(held_by) == BURST - 1:
            all_held.set()

    runs: list[str] = []
    store = backend.async_store()

    @idempotent(store=ObservedStore(store, on_held), key="key", wait_seconds=wait_seconds)
    async def work(key: str) -> str:
        task = asyncio.current_task()
        assert task is not None
        runs.append(task.get_name())
        await asyncio.wait_for(all_held.wait(), HOLD_TIMEOUT_SECONDS)
        return f"ran in {task.get_name()}"

    results: list[str] = []
    refusals: list[float] = []

    async def call() -> None:
        try:
            results.append(await work(key))
        except KeyInProgressError as error:
            refusals.append(error.retry_after)

    try:
        await asyncio.gather(*(asyncio.create_task(call()) for _ in range(BURST)))
        assert_ran_once(results, refusals, runs, wait_seconds)
        assert results[0] == f"ran in {runs[0]}"
        assert await work(key) == results[0]
        assert len(runs) == 1
    finally:
        await close_async(store)


# --- processes --------------------------------------------------------------------------


class Workers:
    """Child processes running tests/support/function_worker.py; any left running are killed."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, spec: dict[str, Any]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.function_worker", json.dumps(spec)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    @staticmethod
    def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
        """The child's outcome line, once it exited."""
        stdout, stderr = process.communicate(timeout=WORKER_TIMEOUT_SECONDS)
        assert process.returncode == 0, stderr
        output: dict[str, Any] = json.loads(stdout.splitlines()[-1])
        assert output["outcome"] != "error", (output, stderr)
        return output

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)  # a stopped one cannot die
                process.kill()
            process.communicate(timeout=10)


@pytest.fixture
def workers() -> Iterator[Workers]:
    started = Workers()
    try:
        yield started
    finally:
        started.stop_all()


@pytest.mark.parametrize("wait_seconds", WAITS)
@pytest.mark.parametrize("backend", PROCESS_BACKENDS, indirect=True)
def test_simultaneous_calls_from_processes_run_the_function_once(
    backend: Backend, wait_seconds: float, tmp_path: Path, workers: Workers
) -> None:
    runs = tmp_path / "runs"
    spec = {
        "store": backend.spec(),
        "key": f"processes-{uuid.uuid4()}",
        "runs": str(runs),
        # The one that runs holds the key until every other process found it held.
        "hold": {"until_held": PROCESSES - 1, "log": str(tmp_path / "held")},
        "wait_seconds": wait_seconds,
    }

    children = [workers.start(spec) for _ in range(PROCESSES)]
    outputs = [workers.finish(child) for child in children]

    ran = [output for output in outputs if output["outcome"] == "ran"]
    assert len(ran) == 1, outputs
    assert read_lines(runs) == [f"ran {ran[0]['pid']}"]
    others = [output for output in outputs if output is not ran[0]]
    if wait_seconds:
        assert all(output["outcome"] == "replayed" for output in others), outputs
        assert {output["result"] for output in outputs} == {f"ran in {ran[0]['pid']}"}
    else:
        assert all(output["outcome"] == "in_progress" for output in others), outputs
        assert all(output["events"] == ["conflict"] for output in others), outputs
    assert ran[0]["events"] == ["claimed", "completed"]


def start_owner(
    backend: Backend, tmp_path: Path, workers: Workers, key: str, go: Path, fail: bool = False
) -> subprocess.Popen[str]:
    """A child that claims ``key`` and runs the function, which blocks until ``go`` exists
    (then returns, or raises if ``fail``); returned once the function has started (its run
    is recorded)."""
    runs = tmp_path / "runs"
    child = workers.start(
        {
            "store": backend.spec(),
            "key": key,
            "runs": str(runs),
            "hold": {"until_file": str(go)},
            "lock_timeout_seconds": LOCK_SECONDS,
            "fail": fail,
        }
    )
    wait_for(lambda: bool(read_lines(runs)) or child.poll() is not None, "the child's run")
    assert read_lines(runs) == [f"ran {child.pid}"], child.communicate()
    return child


def after_the_lease(
    backend: Backend, tmp_path: Path, events: list[IdempotencyEvent]
) -> Callable[[str], str]:
    """This process's twin of the child's function, on a clock past the child's lease (the
    child claimed on the real clock: its lease ends within ``LOCK_SECONDS`` from now)."""
    later = FakeClock(start=time.time() + LOCK_SECONDS + 1)
    return make_work(
        backend.sync_store(later),
        runs=tmp_path / "runs",
        lock_timeout_seconds=LOCK_SECONDS,
        clock=later,
        on_event=events.append,
    )


def stored_result(backend: Backend, key_hash: str) -> Any:
    record = backend.record(key_hash)
    assert record is not None and record.status is Status.COMPLETED, record
    assert record.response is not None
    return orjson.loads(record.response.body)


@pytest.mark.parametrize("backend", PROCESS_BACKENDS, indirect=True)
def test_an_owner_killed_mid_function_is_taken_over_after_its_lease(
    backend: Backend, tmp_path: Path, workers: Workers
) -> None:
    key = f"killed-{uuid.uuid4()}"
    child = start_owner(backend, tmp_path, workers, key, go=tmp_path / "never")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    me = f"ran in {os.getpid()}"

    # Within the dead owner's lease the key is still held: refused, not run.
    with pytest.raises(KeyInProgressError):
        make_work(backend.sync_store(), runs=tmp_path / "runs")(key)

    events: list[IdempotencyEvent] = []
    work = after_the_lease(backend, tmp_path, events)
    assert work(key) == me  # taken over and run
    assert work(key) == me  # then replayed
    assert [event.kind for event in events] == ["taken_over", "completed", "replayed"]
    assert read_lines(tmp_path / "runs") == [f"ran {child.pid}", f"ran {os.getpid()}"]
    assert stored_result(backend, events[0].key_hash) == me


@pytest.mark.parametrize("backend", PROCESS_BACKENDS, indirect=True)
def test_a_duplicate_waiting_on_a_killed_owner_takes_over_when_its_lease_ends(
    backend: Backend, tmp_path: Path, workers: Workers
) -> None:
    key = f"waited-{uuid.uuid4()}"
    child = start_owner(backend, tmp_path, workers, key, go=tmp_path / "never")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)

    # A duplicate told to wait longer than the lease polls the dead owner's claim until
    # the lease ends, then claims the key and runs. Its clock starts now; its waits
    # between polls move it (a FakeClock's sleeps advance it), so no real time passes.
    clock = FakeClock(start=time.time())
    events: list[IdempotencyEvent] = []
    work = make_work(
        backend.sync_store(clock),
        runs=tmp_path / "runs",
        lock_timeout_seconds=LOCK_SECONDS,
        wait_seconds=2 * LOCK_SECONDS,
        clock=clock,
        on_event=events.append,
    )
    assert work(key) == f"ran in {os.getpid()}"
    assert [event.kind for event in events] == ["taken_over", "completed"]
    assert LOCK_SECONDS - 1 <= sum(clock.slept) <= LOCK_SECONDS + 2  # polled the lease out
    assert read_lines(tmp_path / "runs") == [f"ran {child.pid}", f"ran {os.getpid()}"]


@pytest.mark.parametrize("fail", [False, True], ids=["returns", "raises"])
@pytest.mark.parametrize("backend", PROCESS_BACKENDS, indirect=True)
def test_a_frozen_owner_taken_over_cannot_touch_the_record_when_it_resumes(
    backend: Backend, fail: bool, tmp_path: Path, workers: Workers
) -> None:
    key = f"frozen-{uuid.uuid4()}"
    go = tmp_path / "go"
    child = start_owner(backend, tmp_path, workers, key, go, fail=fail)
    os.kill(child.pid, signal.SIGSTOP)  # mid-function, its lease no longer renewed
    me = f"ran in {os.getpid()}"
    events: list[IdempotencyEvent] = []
    try:
        work = after_the_lease(backend, tmp_path, events)
        assert work(key) == me  # taken over from the frozen owner
    finally:
        go.touch()
        os.kill(child.pid, signal.SIGCONT)

    output = workers.finish(child)
    if fail:
        # Its function raised: the release of its claim was refused (fenced by its owner
        # token), so it did not delete the taker's record.
        assert output["outcome"] == "failed"
    else:
        # It finished and got its own result back; storing it was refused (fenced).
        assert output["outcome"] == "ran"
        assert output["result"] == f"ran in {child.pid}"
    assert output["events"] == ["claimed", "lost"]
    # The store kept the taker's result, which every later call replays.
    assert stored_result(backend, events[0].key_hash) == me
    assert work(key) == me
    assert [event.kind for event in events] == ["taken_over", "completed", "replayed"]
    assert read_lines(tmp_path / "runs") == [f"ran {child.pid}", f"ran {os.getpid()}"]
