"""Crash test for consumers: an ``SQSWorker`` process SIGKILLed mid-delivery on moto's SQS.

A worker (``tests/support/sqs_crash_worker.py``, a real subprocess) receives a payment and stops at
one point of its delivery; the test kills it there with SIGKILL. The message comes back when
its visibility timeout (2 s) runs out, to a second worker (here, in the test's process) on
the same SQLite file. The handler's side effect is a line appended to a file and fsynced, so
it is counted across both processes: once, unless the kill came after the side effect and
before the completion was stored; then exactly twice, never more.

The lock timeout (1 s) plus the clock skew margin (0.1 s) is below the visibility timeout,
so the redelivery finds the dead worker's claim free to take over. The only waits are on
the worker's marker file and on SQS's visibility timeout, which cannot be faked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from idempotency_middleware import IdempotentConsumer, Outcome, SQLiteStore, SQSWorker
from tests.conftest import REGION
from tests.support.sqs_crash_worker import VISIBILITY_TIMEOUT, append_effect, consumer_options

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0  # for the subprocess to import, receive, and reach its pause
REDELIVERY_TIMEOUT = 20.0  # the visibility timeout is 2 s; the rest is a loaded machine


@pytest.fixture
def sqs(moto_endpoint: str) -> Iterator[Any]:
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    yield client
    client.close()


@contextlib.contextmanager
def worker_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.sqs_crash_worker"],
            cwd=REPO_ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def effects(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def in_queue(sqs: Any, queue_url: str) -> tuple[int, int]:
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


@pytest.mark.parametrize(
    ("pause_at", "effects_at_the_kill", "effects_in_the_end", "replayed"),
    [
        ("before_effect", 0, 1, False),  # nothing happened: the redelivery runs it once
        ("after_effect", 1, 2, False),  # done but not stored: the redelivery runs it again
        ("before_delete", 1, 1, True),  # stored but not deleted: the redelivery replays
    ],
)
def test_a_worker_killed_mid_delivery_has_its_message_redelivered_and_run_at_most_twice(
    sqs: Any,
    moto_endpoint: str,
    tmp_path: Path,
    pause_at: str,
    effects_at_the_kill: int,
    effects_in_the_end: int,
    replayed: bool,
) -> None:
    queue_url = sqs.create_queue(
        QueueName=f"crash-{uuid.uuid4().hex[:12]}",
        Attributes={"VisibilityTimeout": str(VISIBILITY_TIMEOUT)},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=queue_url, MessageBody="pay 10 to alice")
    effects_file, paused = tmp_path / "effects.txt", tmp_path / "paused"
    database = tmp_path / "consumer.sqlite3"
    env = {
        "CRASH_SQS_ENDPOINT": moto_endpoint,
        "CRASH_QUEUE_URL": queue_url,
        "CRASH_SQLITE": str(database),
        "CRASH_EFFECTS_FILE": str(effects_file),
        "CRASH_PAUSED_FILE": str(paused),
        "CRASH_PAUSE_AT": pause_at,
    }
    log = tmp_path / "worker.log"

    # 1. The first worker receives the message and is killed where it paused.
    with worker_process(env, log) as first:
        deadline = time.monotonic() + START_TIMEOUT
        while not paused.exists():
            assert first.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the worker never paused: {log.read_text()}"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
    assert len(effects(effects_file)) == effects_at_the_kill
    assert sum(in_queue(sqs, queue_url)) == 1  # not deleted: in flight, or visible again

    # 2. A second worker gets it once its visibility timeout ran out.
    def handle(message: dict[str, Any]) -> str:
        append_effect(effects_file, f"{message['Body']} {os.getpid()}")
        return "paid"

    with SQLiteStore(database) as store:
        consumer = IdempotentConsumer(handle, store=store, **consumer_options())
        worker = SQSWorker(
            consumer,
            queue_url,
            client=sqs,
            wait_time_seconds=1,
            visibility_timeout=VISIBILITY_TIMEOUT,
        )
        outcomes: list[Outcome] = []
        deadline = time.monotonic() + REDELIVERY_TIMEOUT
        # A redelivery a hair before the dead claim's lock (and margin) ran out is put back
        # for the rest of it (retry); the next one takes over.
        while not any(outcome.action == "ack" for outcome in outcomes):
            assert time.monotonic() < deadline, f"never redelivered: {outcomes}"
            outcomes += worker.run_once()

    acked = outcomes[-1]
    assert acked == Outcome("ack", "paid", replayed=replayed)
    assert all(outcome.action == "retry" for outcome in outcomes[:-1]), outcomes
    lines = effects(effects_file)
    assert len(lines) == effects_in_the_end, lines
    assert lines[-1].endswith(str(os.getpid()) if not replayed else str(first.pid))
    assert in_queue(sqs, queue_url) == (0, 0)  # deleted: it never comes back
