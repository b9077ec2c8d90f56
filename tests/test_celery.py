"""``idempotent_task`` on a real Celery worker (in a thread of the test process, threads pool
of 2) over a real Redis broker and result backend (``redis_url``).

A task delivered twice with one task id runs once (the second returns the first's result);
a producer's ``Idempotency-Key`` header keys two task ids as one operation; a failing task is
retried (``task.retry``) and, on its ``max_attempts``-th delivery, rejected after
``on_exhausted``; a duplicate delivered while the first still runs is retried after
``retry_after`` and then replays the first's result.
"""

from __future__ import annotations

import gc
import runpy
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from idempotency_middleware import MemoryStore
from idempotency_middleware.celery import TaskCall, idempotent_task

WAIT_SECONDS = 20.0
QUICKSTART = Path(__file__).resolve().parent.parent / "docs" / "snippets" / "quickstart"


@dataclass
class Worker:
    """The app, its tasks, and what they recorded."""

    app: Celery
    tasks: dict[str, Any]
    runs: list[tuple[str, Any]] = field(default_factory=list)
    dead: list[tuple[TaskCall, Exception]] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)


def until(condition: Any) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def worker(redis_url: str) -> Iterator[Worker]:
    server = redis_url.rsplit("/", 1)[0]
    app = Celery("receipts", broker=f"{server}/1", backend=f"{server}/2", set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    state = Worker(app, {})
    store = MemoryStore()

    def on_exhausted(call: TaskCall, error: Exception) -> None:
        state.dead.append((call, error))

    @idempotent_task(app, store=store, max_attempts=3, on_exhausted=on_exhausted)
    def send_receipt(order: str) -> int:
        state.runs.append(("send_receipt", order))
        return len(state.runs)

    # default_retry_delay: a handler failure has no retry_after; Celery's own delay applies.
    @idempotent_task(
        app, store=store, max_attempts=3, on_exhausted=on_exhausted, default_retry_delay=0
    )
    def charge(order: str) -> int:
        state.runs.append(("charge", order))
        raise ValueError(f"card declined ({len(state.runs)})")

    # A short lock timeout: a duplicate's retry_after is at most what is left of it.
    @idempotent_task(app, store=store, lock_timeout_seconds=1)
    def slow_export(order: str) -> str:
        state.runs.append(("slow_export", order))
        state.started.set()
        state.release.wait(WAIT_SECONDS)
        return f"exported {order}"

    state.tasks.update(send_receipt=send_receipt, charge=charge, slow_export=slow_export)

    def on_retry(request: Any = None, **_: Any) -> None:
        state.retried.append(request.id)

    signals.task_retry.connect(on_retry, weak=False)
    try:
        with start_worker(
            app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING"
        ):
            yield state
    finally:
        signals.task_retry.disconnect(on_retry)
        # The results unsubscribe when collected: while Redis (a session server) still runs.
        gc.collect()
        app.close()


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_task_delivered_twice_runs_once(worker: Worker) -> None:
    task, task_id = worker.tasks["send_receipt"], fresh("receipt")
    first = task.apply_async(("order-1",), task_id=task_id).get(timeout=WAIT_SECONDS)
    second = task.apply_async(("order-1",), task_id=task_id).get(timeout=WAIT_SECONDS)
    assert second == first
    assert worker.runs.count(("send_receipt", "order-1")) == 1


def test_the_producers_header_keys_two_sends_as_one_operation(worker: Worker) -> None:
    task, key = worker.tasks["send_receipt"], fresh("op")
    results = [
        task.apply_async(("order-2",), headers={"Idempotency-Key": key}).get(timeout=WAIT_SECONDS)
        for _ in range(2)
    ]
    assert results[0] == results[1]
    assert worker.runs.count(("send_receipt", "order-2")) == 1


def test_a_failing_task_is_retried_then_rejected_after_max_attempts(worker: Worker) -> None:
    task_id = fresh("charge")
    worker.tasks["charge"].apply_async(("order-3",), task_id=task_id)
    until(lambda: any(call.id == task_id for call, _ in worker.dead))
    [(call, error)] = [(call, error) for call, error in worker.dead if call.id == task_id]
    assert call.args == ("order-3",)
    assert isinstance(error, ValueError)
    assert worker.runs.count(("charge", "order-3")) == 3  # deliveries 1, 2 retried; 3 dead
    # Celery signals a retry once the retried delivery may already be running elsewhere.
    until(lambda: worker.retried.count(task_id) >= 2)
    assert worker.retried.count(task_id) == 2
    # Rejected: Celery records no success, and does not deliver it again.
    time.sleep(0.3)
    assert worker.runs.count(("charge", "order-3")) == 3
    assert AsyncResult(task_id, app=worker.app).state != "SUCCESS"


def test_a_duplicate_while_running_is_retried_then_replays(worker: Worker) -> None:
    task, task_id = worker.tasks["slow_export"], fresh("export")
    worker.release.clear()
    worker.started.clear()
    task.apply_async(("order-4",), task_id=task_id)
    assert worker.started.wait(WAIT_SECONDS)
    task.apply_async(("order-4",), task_id=task_id)  # the broker delivers it again meanwhile
    until(lambda: task_id in worker.retried)
    worker.release.set()
    until(lambda: AsyncResult(task_id, app=worker.app).state == "SUCCESS")
    result = AsyncResult(task_id, app=worker.app)
    assert result.get(timeout=WAIT_SECONDS) == "exported order-4"
    assert worker.runs.count(("slow_export", "order-4")) == 1
    assert worker.retried.count(task_id) == 1


def test_a_coroutine_function_or_bind_is_refused() -> None:
    app = Celery("refusals", set_as_current=False)

    async def coroutine(order: str) -> None: ...

    with pytest.raises(TypeError, match="coroutine function"):
        idempotent_task(app, store=MemoryStore())(coroutine)
    with pytest.raises(TypeError, match="binds the task itself"):
        idempotent_task(app, store=MemoryStore(), bind=True)
    with pytest.raises(TypeError, match="key and payload must be callables"):
        idempotent_task(app, store=MemoryStore(), key="task_id")  # type: ignore[arg-type]


def test_the_readme_quick_start_runs_a_task_once_per_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/snippets/quickstart/celery_app.py, as the README quotes it, run in-process
    (``apply``) twice with one task id."""
    monkeypatch.chdir(tmp_path)  # its SQLite file
    module = runpy.run_path(str(QUICKSTART / "celery_app.py"))
    charge = module["charge"]
    results = [charge.apply(("order-9",), task_id="t-9").get() for _ in range(2)]
    assert results == [{"charged": "order-9"}] * 2
    assert charge.consumer.forget("t-9")  # its key was kept: the second was a replay
    module["store"].close()
