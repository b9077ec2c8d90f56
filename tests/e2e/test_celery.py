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
import inspect
import pickle
import runpy
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from idempotency_middleware import Encryption, MemoryStore, SQLiteStore, idempotent
from idempotency_middleware.celery import TaskCall, idempotent_task
from idempotency_middleware.functions.attempts import function_key_hash
from tests.support.raw_records import RawStore

WAIT_SECONDS = 20.0
QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "quickstart"
SEALING = Encryption(keys={"2026-11": bytes(range(32))}, current="2026-11")
PICKLE = (pickle.dumps, pickle.loads)
SECRET = "card-4242-4242"


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
    sealed: RawStore | None = None  # the encrypted task's store, read behind its back


def until(condition: Any) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def worker(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
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

    # A pickled result, encrypted: what a store's reader may not see, nor forge.
    sealed_path = tmp_path_factory.mktemp("celery") / "sealed.sqlite3"
    sealed_store = SQLiteStore(sealed_path)
    state.sealed = RawStore("sqlite", sealed_store, str(sealed_path))

    @idempotent_task(app, store=sealed_store, serializer=PICKLE, encryption=SEALING)
    def save_card(order: str) -> dict[str, str]:
        state.runs.append(("save_card", order))
        return {"card": SECRET, "order": order}

    state.tasks.update(
        send_receipt=send_receipt, charge=charge, slow_export=slow_export, save_card=save_card
    )

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
        sealed_store.close()


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


def test_with_encryption_a_result_is_stored_sealed_and_its_replay_opened(worker: Worker) -> None:
    task, task_id = worker.tasks["save_card"], fresh("card")
    results = [
        task.apply_async(("order-5",), task_id=task_id).get(timeout=WAIT_SECONDS) for _ in range(2)
    ]
    assert results == [{"card": SECRET, "order": "order-5"}] * 2  # the second, decrypted
    assert worker.runs.count(("save_card", "order-5")) == 1
    assert worker.sealed is not None
    raw = worker.sealed.raw(function_key_hash(task.name, task_id))
    assert task_id.encode() not in raw  # (the key is hashed)
    assert SECRET.encode() not in raw


def test_a_pickle_serializer_warns_unless_encryption_is_given() -> None:
    app = Celery("warnings", set_as_current=False)

    def save(order: str) -> str:
        return order

    with pytest.warns(UserWarning, match="serializer loads with pickle"):
        idempotent_task(app, store=MemoryStore(), serializer=PICKLE, name="t.plain")(save)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sealed = idempotent_task(
            app, store=MemoryStore(), serializer=PICKLE, encryption=SEALING, name="t.sealed"
        )(save)
    assert not hasattr(sealed, "encryption")  # the door's, not handed to Celery as a task option


def test_it_takes_every_option_idempotent_takes_and_names_them_when_one_is_misspelled() -> None:
    app = Celery("options", set_as_current=False)
    ours = set(inspect.signature(idempotent_task).parameters) | {"name"}  # name: a task option
    assert set(inspect.signature(idempotent).parameters) <= ours
    with pytest.raises(
        TypeError, match="'encyrption' \\(did you mean 'encryption'\\?\\)"
    ) as raised:
        idempotent_task(app, store=MemoryStore(), encyrption=SEALING)
    assert "replay_cache_size" in str(raised.value)  # the valid names are listed
    with pytest.raises(TypeError, match="'lock_timeout' \\(did you mean 'lock_timeout_seconds'"):
        idempotent_task(app, store=MemoryStore(), lock_timeout=5)

    def shout(order: str) -> str:
        return order.upper()

    # Celery's own task options, and attributes of the application's own, still go to Celery.
    task = idempotent_task(
        app, store=MemoryStore(), name="t.routed", queue="billing", rate_limit="1/s", team="ops"
    )(shout)
    assert (task.queue, task.rate_limit, task.team) == ("billing", "1/s", "ops")


def test_required_false_runs_a_call_without_key_unprotected() -> None:
    app = Celery("unkeyed", set_as_current=False)
    runs: list[str] = []

    @idempotent_task(
        app, store=MemoryStore(), key=lambda call: call.kwargs.get("key"), required=False
    )
    def ping(order: str, key: str | None = None) -> str:
        runs.append(order)
        return "pong"

    assert [ping.apply(("o-1",), task_id="t-1").get() for _ in range(2)] == ["pong"] * 2
    assert runs == ["o-1", "o-1"]  # no key: each runs, unprotected
    assert ping.apply(("o-2",), {"key": "k-2"}, task_id="t-2").get() == "pong"
    assert ping.apply(("o-2",), {"key": "k-2"}, task_id="t-3").get() == "pong"
    assert runs == ["o-1", "o-1", "o-2"]  # a key: once


def test_forget_clears_the_tasks_replay_cache() -> None:
    app = Celery("cached", set_as_current=False)
    runs: list[str] = []

    store = MemoryStore()

    @idempotent_task(app, store=store, replay_cache_size=8)
    def send(order: str) -> str:
        runs.append(order)
        return f"sent {order}"

    for _ in range(2):  # the second is a replay, and puts the record in the cache
        assert send.apply(("o-1",), task_id="t-1").get() == "sent o-1"
    # Deleted behind the door's back, it still replays: from the cache.
    assert store.delete(function_key_hash(send.name, "t-1")) is True
    assert send.apply(("o-1",), task_id="t-1").get() == "sent o-1"
    assert runs == ["o-1"]
    assert send.consumer.forget("t-1") is False  # nothing left in the store; the cache is cleared
    assert send.apply(("o-1",), task_id="t-1").get() == "sent o-1"
    assert runs == ["o-1", "o-1"]


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
