"""``SQSWorker`` on moto's SQS in server mode (boto3 over HTTP to 127.0.0.1).

Each test makes its own queue. SQS's visibility timeouts run on the wall clock (moto's too),
so the tests that watch one keep it to a second or two.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from idempotency_middleware import (
    IdempotentConsumer,
    MemoryStore,
    Outcome,
    SQLiteStore,
    SQSWorker,
    StoreUnavailableError,
)
from idempotency_middleware.consumers.sqs_worker import max_receive_count
from tests.conftest import REGION
from tests.unit.test_missing_extras import run_python

# A safety bound on every wait for something that should happen at once.
WAIT = 10.0


@pytest.fixture
def sqs(moto_endpoint: str) -> Iterator[Any]:
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    yield client
    client.close()


def new_queue(sqs: Any, visibility_timeout: int = 30, fifo: bool = False) -> str:
    name = f"orders-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
    attributes = {"VisibilityTimeout": str(visibility_timeout)}
    if fifo:
        attributes |= {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    return str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


def send(sqs: Any, queue_url: str, body: str, key: str | None = None, **extra: Any) -> None:
    attributes = {"IdempotencyKey": {"DataType": "String", "StringValue": key}} if key else {}
    sqs.send_message(QueueUrl=queue_url, MessageBody=body, MessageAttributes=attributes, **extra)


def message_key(message: dict[str, Any]) -> str:
    """The producer's key when it set one, else the message id."""
    attribute = message.get("MessageAttributes", {}).get("IdempotencyKey")
    return str(attribute["StringValue"]) if attribute else str(message["MessageId"])


def in_queue(sqs: Any, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


class Boom(Exception):
    pass


class Handler:
    """Records the bodies it ran; raises ``Boom`` for bodies starting with ``fail``."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def __call__(self, message: dict[str, Any]) -> str:
        self.runs.append(message["Body"])
        if message["Body"].startswith("fail"):
            raise Boom(message["Body"])
        return str(message["Body"]).upper()


def consumer_of(handler: Any, store: Any = None, **options: Any) -> IdempotentConsumer:
    return IdempotentConsumer(
        handler,
        store=store or MemoryStore(),
        key=message_key,
        name=f"tests.sqs.{uuid.uuid4().hex[:8]}",
        **options,
    )


def worker_for(consumer: IdempotentConsumer, sqs: Any, queue_url: str, **options: Any) -> SQSWorker:
    options.setdefault("wait_time_seconds", 0)
    return SQSWorker(consumer, queue_url, client=sqs, **options)


def test_an_acked_message_is_deleted_with_the_handlers_result(sqs: Any) -> None:
    queue_url = new_queue(sqs)
    send(sqs, queue_url, "order-1")
    send(sqs, queue_url, "order-2")
    handler = Handler()
    worker = worker_for(consumer_of(handler), sqs, queue_url)

    outcomes = worker.run_once()

    assert sorted(outcome.result for outcome in outcomes) == ["ORDER-1", "ORDER-2"]
    assert {outcome.action for outcome in outcomes} == {"ack"}
    assert sorted(handler.runs) == ["order-1", "order-2"]
    assert in_queue(sqs, queue_url) == (0, 0)  # deleted, not merely in flight
    assert worker.visibility_timeout == 30  # the queue's, read from its attributes


def test_a_dead_message_is_deleted_after_on_exhausted(sqs: Any) -> None:
    queue_url = new_queue(sqs)
    send(sqs, queue_url, "fail-1")
    exhausted: list[tuple[str, Exception]] = []
    consumer = consumer_of(
        Handler(),
        max_attempts=1,  # the first delivery (ApproximateReceiveCount 1) is the last
        on_exhausted=lambda message, error: exhausted.append((message["Body"], error)),
    )

    [outcome] = worker_for(consumer, sqs, queue_url).run_once()

    assert outcome.action == "dead" and isinstance(outcome.error, Boom)
    assert [(body, type(error)) for body, error in exhausted] == [("fail-1", Boom)]
    assert in_queue(sqs, queue_url) == (0, 0)


def test_a_failed_handler_is_left_to_its_visibility_timeout_and_counted(sqs: Any) -> None:
    queue_url = new_queue(sqs)
    send(sqs, queue_url, "fail-1")
    exhausted: list[str] = []
    consumer = consumer_of(
        Handler(), max_attempts=2, on_exhausted=lambda message, _: exhausted.append(message)
    )
    # The worker's visibility timeout (1 s), not the queue's (30 s), on each receive.
    worker = worker_for(consumer, sqs, queue_url, visibility_timeout=1, wait_time_seconds=5)

    [first] = worker.run_once()

    assert first.action == "retry" and isinstance(first.error, Boom)
    assert first.retry_after is None and exhausted == []
    assert in_queue(sqs, queue_url) == (0, 1)  # not deleted: in flight until its timeout
    # Back after 1 s: ApproximateReceiveCount 2 reaches max_attempts.
    [second] = worker.run_once()
    assert second.action == "dead" and len(exhausted) == 1
    assert in_queue(sqs, queue_url) == (0, 0)


def test_a_retry_is_visible_again_after_retry_after(sqs: Any, tmp_path: Path) -> None:
    queue_url = new_queue(sqs, visibility_timeout=30)
    send(sqs, queue_url, "order-1")
    # A store that cannot open its file: every claim fails, the outcome is retry after 1 s.
    broken = SQLiteStore(tmp_path / "missing" / "store.sqlite3")
    handler = Handler()
    worker = worker_for(consumer_of(handler, store=broken), sqs, queue_url)

    [outcome] = worker.run_once()
    put_back = time.monotonic()

    assert outcome.action == "retry" and isinstance(outcome.error, StoreUnavailableError)
    assert outcome.retry_after == 1 and handler.runs == []
    # Not the queue's 30 s: received again about a second later, a second delivery.
    again = sqs.receive_message(
        QueueUrl=queue_url, WaitTimeSeconds=5, MessageSystemAttributeNames=["All"]
    )["Messages"]
    assert time.monotonic() - put_back < 5
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"


def test_a_duplicate_delivery_replays_and_is_deleted(sqs: Any) -> None:
    queue_url = new_queue(sqs)
    # A producer that retried its send: two messages, two MessageIds, one key.
    send(sqs, queue_url, "order-1", key="o-1")
    send(sqs, queue_url, "order-1", key="o-1")
    handler = Handler()
    worker = worker_for(consumer_of(handler), sqs, queue_url, max_messages=1)

    first, second = worker.run_once() + worker.run_once()

    assert first == Outcome("ack", "ORDER-1")
    assert second == Outcome("ack", "ORDER-1", replayed=True)
    assert handler.runs == ["order-1"]
    assert in_queue(sqs, queue_url) == (0, 0)


def test_run_stops_when_the_event_is_set(sqs: Any) -> None:
    queue_url = new_queue(sqs)
    handler = Handler()
    worker = worker_for(consumer_of(handler), sqs, queue_url, wait_time_seconds=1)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    send(sqs, queue_url, "order-1")
    send(sqs, queue_url, "order-2")
    deadline = time.monotonic() + WAIT
    while len(handler.runs) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)

    stop.set()
    thread.join(timeout=WAIT)

    assert not thread.is_alive()
    assert sorted(handler.runs) == ["order-1", "order-2"]
    assert in_queue(sqs, queue_url) == (0, 0)


def test_an_async_handler_runs_on_the_workers_own_loop(sqs: Any) -> None:
    queue_url = new_queue(sqs)
    loops: list[object] = []

    async def handle(message: dict[str, Any]) -> str:
        import asyncio

        loops.append(asyncio.get_running_loop())
        return str(message["Body"]).upper()

    with worker_for(consumer_of(handle), sqs, queue_url) as worker:
        send(sqs, queue_url, "order-1")
        first = worker.run_once()
        send(sqs, queue_url, "order-2")
        second = worker.run_once()

    assert first + second == [Outcome("ack", "ORDER-1"), Outcome("ack", "ORDER-2")]
    assert len(loops) == 2 and loops[0] is loops[1]  # one loop, kept between batches
    assert in_queue(sqs, queue_url) == (0, 0)


def test_a_handler_slower_than_the_visibility_timeout_is_not_received_twice(
    sqs: Any,
) -> None:
    queue_url = new_queue(sqs, visibility_timeout=2)
    send(sqs, queue_url, "order-1")
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def slow(message: dict[str, Any]) -> str:
        runs.append(message["Body"])
        started.set()
        release.wait(WAIT)  # until the other consumer has polled past the 2 s timeout
        return "done"

    worker = worker_for(consumer_of(slow), sqs, queue_url)
    outcomes: list[Outcome] = []
    thread = threading.Thread(target=lambda: outcomes.extend(worker.run_once()))
    thread.start()
    assert started.wait(WAIT)
    received_at = time.monotonic()

    # Another consumer polls until well past the original visibility timeout.
    stolen: list[Any] = []
    while time.monotonic() - received_at < 3.2:
        stolen += sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1).get("Messages", [])
    release.set()
    thread.join(WAIT)

    assert stolen == []
    assert outcomes == [Outcome("ack", "done")] and runs == ["order-1"]
    assert in_queue(sqs, queue_url) == (0, 0)


def test_a_fifo_group_stops_at_its_first_retry(sqs: Any) -> None:
    queue_url = new_queue(sqs, fifo=True)
    for body in ("fail-a1", "a2"):
        send(sqs, queue_url, body, MessageGroupId="a")
    send(sqs, queue_url, "b1", MessageGroupId="b")
    handler = Handler()

    outcomes = worker_for(consumer_of(handler), sqs, queue_url).run_once()

    by_body = dict(zip(["fail-a1", "a2", "b1"], outcomes, strict=True))
    assert by_body["fail-a1"].action == "retry" and isinstance(by_body["fail-a1"].error, Boom)
    # a2 did not run: put back at once, behind a1, so the group keeps its order.
    assert by_body["a2"].action == "retry" and by_body["a2"].retry_after == 0
    assert by_body["b1"] == Outcome("ack", "B1")
    assert handler.runs == ["fail-a1", "b1"]
    assert in_queue(sqs, queue_url) == (1, 1)  # a2 visible, a1 in flight; b1 deleted


def test_a_message_sqs_refuses_to_delete_is_logged_and_the_rest_deleted(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url = new_queue(sqs)
    send(sqs, queue_url, "order-1")
    send(sqs, queue_url, "order-2")

    def handle(message: dict[str, Any]) -> str:
        if message["Body"] == "order-1":
            message["ReceiptHandle"] = "not-a-receipt-handle"  # SQS will refuse this entry
        return "done"

    with caplog.at_level(logging.WARNING, logger="idempotency_middleware.consumers.sqs_worker"):
        outcomes = worker_for(consumer_of(handle), sqs, queue_url).run_once()

    assert [outcome.action for outcome in outcomes] == ["ack", "ack"]
    assert in_queue(sqs, queue_url) == (0, 1)  # order-2 deleted; order-1 comes back, replays
    assert "could not delete message" in caplog.text


def test_bad_options_are_refused_at_construction(sqs: Any) -> None:
    consumer = consumer_of(Handler())
    with pytest.raises(ValueError, match="max_messages must be an int from 1 to 10"):
        SQSWorker(consumer, "https://sqs/q", client=sqs, max_messages=11)
    with pytest.raises(ValueError, match="wait_time_seconds must be an int from 0 to 20"):
        SQSWorker(consumer, "https://sqs/q", client=sqs, wait_time_seconds=21)
    with pytest.raises(ValueError, match="visibility_timeout must be an int from 1"):
        SQSWorker(consumer, "https://sqs/q", client=sqs, visibility_timeout=0)
    with pytest.raises(TypeError, match="takes an IdempotentConsumer"):
        SQSWorker(Handler(), "https://sqs/q", client=sqs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue_url"):
        SQSWorker(consumer, "", client=sqs)


def test_without_boto3_the_worker_names_the_sqs_extra() -> None:
    result = run_python(
        """
        from idempotency_middleware import IdempotentConsumer, MemoryStore, SQSWorker

        def handle(message):
            return None

        consumer = IdempotentConsumer(handle, store=MemoryStore(), key=lambda m: m["MessageId"])
        try:
            SQSWorker(consumer, "https://sqs.eu-west-1.amazonaws.com/1/orders")
        except ModuleNotFoundError as error:
            print(error.name, error)
        """,
        refused=("boto3", "botocore"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "boto3 SQSWorker needs boto3, which is not installed: "
        'pip install "idempotency-middleware[sqs]" (or pass client=)'
    ]


# -- warnings about options that do not fit the queue ----------------------------------------


def queue_with_redrive(sqs: Any, visibility_timeout: int, max_receive_count: int) -> str:
    dead_letters = new_queue(sqs)
    arn = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    queue_url = new_queue(sqs, visibility_timeout=visibility_timeout)
    policy = {"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receive_count)}
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"RedrivePolicy": json.dumps(policy)})
    return queue_url


def keep_dead_message(message: dict[str, Any], error: Exception) -> None:
    """An ``on_exhausted`` keeping dead messages (so deleting them is not warned about)."""


def worker_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "idempotency_middleware.consumers.sqs_worker"
        and record.levelno == logging.WARNING
    ]


def test_options_that_do_not_fit_the_queue_are_warned_about_once_at_start(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url = queue_with_redrive(sqs, visibility_timeout=30, max_receive_count=5)
    consumer = consumer_of(
        Handler(),
        ttl_seconds=600,
        lock_timeout_seconds=60,
        max_attempts=8,
        on_exhausted=keep_dead_message,
    )
    worker = worker_for(consumer, sqs, queue_url)

    with caplog.at_level(logging.WARNING, logger="idempotency_middleware.consumers.sqs_worker"):
        worker.run_once()
        send(sqs, queue_url, "order-1")
        worker.run_once()

    lock, ttl, attempts = worker_warnings(caplog)
    assert lock.startswith(f"SQS worker on {queue_url}: the consumer's lock timeout (60 s)")
    assert "plus its clock skew margin (1 s) outlasts the visibility timeout (30 s)" in lock
    assert "set lock_timeout_seconds to at most 29" in lock
    # 30 s x 5 receives, plus an hour for backlogs.
    assert "ttl_seconds (600) does not outlive" in ttl
    assert "set ttl_seconds to at least 3750" in ttl
    assert "max_attempts (8) is above the queue's maxReceiveCount (5)" in attempts
    assert "on_exhausted is never called; set max_attempts to at most 5" in attempts


def test_options_that_fit_the_queue_are_not_warned_about(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url = queue_with_redrive(sqs, visibility_timeout=30, max_receive_count=5)
    consumer = consumer_of(
        Handler(),
        ttl_seconds=3750,
        lock_timeout_seconds=29,
        max_attempts=5,
        on_exhausted=keep_dead_message,
    )

    with caplog.at_level(logging.WARNING, logger="idempotency_middleware.consumers.sqs_worker"):
        send(sqs, queue_url, "order-1")
        [outcome] = worker_for(consumer, sqs, queue_url).run_once()

    assert outcome.action == "ack"
    assert worker_warnings(caplog) == []


def test_the_workers_own_visibility_timeout_is_the_one_checked(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The queue says 30 s, the worker asks for 120 s on each receive: a 60 s lock fits.
    queue_url = queue_with_redrive(sqs, visibility_timeout=30, max_receive_count=5)
    consumer = consumer_of(
        Handler(), ttl_seconds=600, lock_timeout_seconds=60, on_exhausted=keep_dead_message
    )

    with caplog.at_level(logging.WARNING, logger="idempotency_middleware.consumers.sqs_worker"):
        worker_for(consumer, sqs, queue_url, visibility_timeout=120).run_once()

    [ttl] = worker_warnings(caplog)
    assert "visibility timeout (120 s) times maxReceiveCount (5)" in ttl
    assert "at least 4200" in ttl


def test_without_a_redrive_policy_only_the_lock_timeout_is_checked(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url = new_queue(sqs, visibility_timeout=30)
    consumer = consumer_of(Handler(), ttl_seconds=60, lock_timeout_seconds=45, max_attempts=50)

    with caplog.at_level(logging.WARNING, logger="idempotency_middleware.consumers.sqs_worker"):
        worker_for(consumer, sqs, queue_url).run_once()

    [lock] = worker_warnings(caplog)
    assert "lock timeout (45 s)" in lock


@pytest.mark.parametrize(
    ("policy", "count"),
    [
        ('{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:1:dlq", "maxReceiveCount": "5"}', 5),
        ('{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:1:dlq", "maxReceiveCount": 3}', 3),
        (None, None),
        ("not json", None),
        ('{"deadLetterTargetArn": "arn"}', None),
    ],
)
def test_the_redrive_policys_max_receive_count_is_read_when_there_is_one(
    policy: str | None, count: int | None
) -> None:
    assert max_receive_count(policy) == count
