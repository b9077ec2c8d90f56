"""The examples in examples/ run as tests, each side effect counted across redeliveries,
duplicates and retries.

- ``examples.sqs_consumer`` (an ``SQSWorker``) reads a real queue (moto's SQS on 127.0.0.1):
  a producer retry (two messages, one idempotency key), a consumer that crashes after
  recording a payment and before deleting its message (redelivered), and a duplicate that
  arrives while the first is still running (put back for SQS to redeliver). Its stores:
  DynamoDB on moto and SQLite.
- ``examples.lambda_batch``'s handler gets SQS batch events (DynamoDB on moto): duplicates,
  a failing record, Lambda's retry of the whole batch, a duplicate in flight elsewhere.
- ``examples.celery_task`` and ``examples.service_method``: redeliveries and retries.

No test here races two claims of one key at the same instant: moto's threaded server does
not apply a conditional write atomically. tests/e2e/test_function_concurrency.py does that on
atomic stores.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest

from idempotency_middleware import (
    DynamoDBStore,
    KeyReusedError,
    SQLiteStore,
    SyncStore,
)
from tests.conftest import REGION, new_table

# --- SQS consumer on a real queue ---------------------------------------------------------


@pytest.fixture(scope="module")
def sqs(moto_endpoint: str) -> Iterator[Any]:
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    try:
        yield client
    finally:
        client.close()


def new_queue(sqs: Any, visibility_timeout: int = 1) -> str:
    name = f"payments-{uuid.uuid4().hex[:12]}"
    url: str = sqs.create_queue(
        QueueName=name, Attributes={"VisibilityTimeout": str(visibility_timeout)}
    )["QueueUrl"]
    return url


@pytest.fixture(params=["moto-dynamodb", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SyncStore]:
    """The consumers' store: DynamoDB on moto (its requests one at a time here) or SQLite."""
    created: SQLiteStore | DynamoDBStore
    if request.param == "sqlite":
        created = SQLiteStore(tmp_path / "consumer.sqlite3")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        created = DynamoDBStore(new_table(endpoint), endpoint_url=endpoint, region_name=REGION)
    with created:
        yield created


def send(sqs: Any, queue_url: str, body: str, key: str | None = None) -> str:
    """Send one message (with the producer's ``IdempotencyKey`` attribute); its MessageId."""
    attributes = {"IdempotencyKey": {"DataType": "String", "StringValue": key}} if key else {}
    message_id: str = sqs.send_message(
        QueueUrl=queue_url, MessageBody=body, MessageAttributes=attributes
    )["MessageId"]
    return message_id


class ConsumerCrashed(BaseException):
    """The consumer died between recording a payment and deleting it (a ``BaseException``,
    as a dying process is not a failure the worker could log and go on from)."""


@dataclass
class SpySQS:
    """Forwards to the SQS client; counts deliveries of each message, remembers the latest
    receipt handle of each, and makes the first delete of the bodies in ``crash_before_delete``
    fail, as a consumer dying right after its side effect would."""

    client: Any
    crash_before_delete: set[str] = field(default_factory=set)
    deliveries: Counter[str] = field(default_factory=Counter)
    receipts: dict[str, str] = field(default_factory=dict)  # MessageId -> latest handle
    bodies: dict[str, str] = field(default_factory=dict)  # receipt handle -> body
    deleted: set[str] = field(default_factory=set)  # MessageIds
    visibility_changes: list[int] = field(default_factory=list)  # the consumer's own
    batches: int | None = None  # receive this many batches, then find the queue empty

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)  # get_queue_attributes, as it is

    def receive_message(self, **kwargs: Any) -> Any:
        if self.batches is not None:
            if self.batches == 0:
                return {}
            self.batches -= 1
        response = self.client.receive_message(**kwargs)
        for message in response.get("Messages", []):
            self.deliveries[message["MessageId"]] += 1
            self.receipts[message["MessageId"]] = message["ReceiptHandle"]
            self.bodies[message["ReceiptHandle"]] = message["Body"]
        return response

    def delete_message_batch(self, **kwargs: Any) -> Any:
        for entry in kwargs["Entries"]:
            body = self.bodies[entry["ReceiptHandle"]]
            if body in self.crash_before_delete:
                self.crash_before_delete.discard(body)
                raise ConsumerCrashed(f"crashed before deleting {body!r}")
        response = self.client.delete_message_batch(**kwargs)
        handles = {entry["ReceiptHandle"] for entry in kwargs["Entries"]}
        self.deleted.update(
            message_id for message_id, receipt in self.receipts.items() if receipt in handles
        )
        return response

    def change_message_visibility_batch(self, **kwargs: Any) -> Any:
        self.visibility_changes += [entry["VisibilityTimeout"] for entry in kwargs["Entries"]]
        return self.client.change_message_visibility_batch(**kwargs)

    def redeliver_now(self, queue_url: str) -> None:
        """Make every message received and not deleted visible again at once, instead of
        waiting out its visibility timeout."""
        for message_id, receipt in self.receipts.items():
            if message_id not in self.deleted:
                self.client.change_message_visibility(
                    QueueUrl=queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
                )


def queue_counts(sqs: Any, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages left in the queue."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def test_consumer_records_each_payment_once_across_duplicates_and_a_crash(
    sqs: Any, store: SyncStore
) -> None:
    from examples.sqs_consumer import consume

    queue_url = new_queue(sqs)
    send(sqs, queue_url, "pay 10 to alice", key="payment-1")
    send(sqs, queue_url, "pay 10 to alice", key="payment-1")  # the producer's retry
    crashed_on = send(sqs, queue_url, "pay 20 to bob", key="payment-2")
    send(sqs, queue_url, "pay 30 to carol")  # no attribute: keyed by its MessageId
    ledger: list[str] = []
    spy = SpySQS(sqs, crash_before_delete={"pay 20 to bob"})

    # The first consumer records bob's payment, then dies before deleting its message.
    with pytest.raises(ConsumerCrashed):
        consume(queue_url, spy, store, ledger, wait_time_seconds=0, stop_when_empty=True)
    assert "pay 20 to bob" in ledger

    # Its messages come back (at once here, rather than after the visibility timeout), and
    # a restarted consumer finishes the queue: bob's redelivery replays, no second payment.
    spy.redeliver_now(queue_url)
    consume(queue_url, spy, store, ledger, wait_time_seconds=0, stop_when_empty=True)

    assert sorted(ledger) == ["pay 10 to alice", "pay 20 to bob", "pay 30 to carol"]
    assert spy.deliveries[crashed_on] == 2
    assert len(spy.deliveries) == 4  # four messages, every one deleted in the end
    assert spy.deleted == set(spy.deliveries)
    assert queue_counts(sqs, queue_url) == (0, 0)


class BlockingLedger(list[str]):
    """A ledger whose first entry waits for ``proceed``: a payment still being recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = threading.Event()
        self.proceed = threading.Event()

    def append(self, entry: str) -> None:
        self.recording.set()
        if not self.proceed.wait(timeout=20):
            raise TimeoutError("the test never let the payment finish")
        super().append(entry)


def test_a_duplicate_arriving_while_the_first_still_runs_is_redelivered_later(
    sqs: Any, store: SyncStore, caplog: pytest.LogCaptureFixture
) -> None:
    from examples.sqs_consumer import consume

    # A long visibility timeout: nothing comes back on its own during the test.
    queue_url = new_queue(sqs, visibility_timeout=60)
    send(sqs, queue_url, "pay 40 to dave", key="payment-4")
    ledger = BlockingLedger()
    first = SpySQS(sqs, batches=1)  # it stops after its one message
    consumer = threading.Thread(
        target=consume,
        args=(queue_url, first, store, ledger),
        kwargs={"wait_time_seconds": 0, "stop_when_empty": True},
    )
    consumer.start()
    try:
        assert ledger.recording.wait(timeout=20)
        # Meanwhile the producer's retry reaches a second consumer: the key is in progress,
        # so it leaves the message for SQS to redeliver, and records nothing.
        duplicate = send(sqs, queue_url, "pay 40 to dave", key="payment-4")
        second = SpySQS(sqs)
        with caplog.at_level(logging.WARNING, logger="idempotency_middleware.consumers.consumer"):
            consume(queue_url, second, store, ledger, wait_time_seconds=0, stop_when_empty=True)
        assert list(second.deliveries) == [duplicate]
        assert second.deleted == set()
        # Put back until the first run's claim could be taken over (its lock timeout, 20 s,
        # plus the clock skew margin), not failed: its retry_after.
        [put_back] = second.visibility_changes
        assert 1 <= put_back <= 21
        assert [r for r in caplog.records if r.name.startswith("idempotency_middleware")] == []
    finally:
        ledger.proceed.set()
        consumer.join(timeout=20)
    assert not consumer.is_alive()
    assert ledger == ["pay 40 to dave"]
    assert sum(queue_counts(sqs, queue_url)) == 1  # the duplicate, back in a second

    # Redelivered once the first finished: it replays, and is deleted.
    second.redeliver_now(queue_url)
    consume(queue_url, second, store, ledger, wait_time_seconds=0, stop_when_empty=True)
    assert ledger == ["pay 40 to dave"]
    assert second.deleted == {duplicate}
    assert queue_counts(sqs, queue_url) == (0, 0)


# --- the examples that build their store at import -----------------------------------------


def fresh(name: str) -> ModuleType:
    """Import ``name`` anew: its module-level store is built from the environment as set
    now, as a new Lambda container or worker process would."""
    module = sys.modules.get(name)
    return importlib.reload(module) if module is not None else importlib.import_module(name)


@pytest.fixture
def lambda_batch(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("IDEMPOTENCY_TABLE", new_table(moto_endpoint))
    monkeypatch.setenv("DYNAMODB_ENDPOINT_URL", moto_endpoint)
    module = fresh("examples.lambda_batch")
    try:
        yield module
    finally:
        module.store.close()


def sqs_record(message_id: str, body: str, key: str | None = None) -> dict[str, Any]:
    """One record of an SQS event as Lambda delivers it."""
    attributes = {"IdempotencyKey": {"stringValue": key, "dataType": "String"}} if key else {}
    return {
        "messageId": message_id,
        "receiptHandle": f"AQEB{message_id}",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"},
        "messageAttributes": attributes,
        "md5OfBody": "0" * 32,
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:signups",
        "awsRegion": REGION,
    }


def failed(response: dict[str, Any]) -> list[str]:
    return [failure["itemIdentifier"] for failure in response["batchItemFailures"]]


def test_lambda_batch_reports_failing_records_and_a_retry_runs_nothing_again(
    lambda_batch: ModuleType,
) -> None:
    event = {
        "Records": [
            sqs_record("m-1", '{"email": "ada@example.com"}', key="signup-1"),
            sqs_record("m-2", '{"email": "ada@example.com"}', key="signup-1"),  # a duplicate
            sqs_record("m-3", "not json"),  # fails, every time
            sqs_record("m-4", '{"email": "bob@example.com"}'),  # keyed by its messageId
        ]
    }

    assert failed(lambda_batch.handler(event, None)) == ["m-3"]
    assert lambda_batch.sent_emails == ["ada@example.com", "bob@example.com"]

    # Lambda retries the batch (SQS redelivers it whole when the function errs or times out):
    # the completed records replay; only the failing one runs, and fails, again.
    assert failed(lambda_batch.handler(event, None)) == ["m-3"]
    assert lambda_batch.sent_emails == ["ada@example.com", "bob@example.com"]


class BlockingOutbox(list[str]):
    """``sent_emails`` whose first send waits for ``proceed``: an email still going out."""

    def __init__(self) -> None:
        super().__init__()
        self.sending = threading.Event()
        self.proceed = threading.Event()

    def append(self, address: str) -> None:
        self.sending.set()
        if not self.proceed.wait(timeout=20):
            raise TimeoutError("the test never let the email go")
        super().append(address)


def test_lambda_batch_reports_a_duplicate_in_flight_elsewhere_as_failed(
    lambda_batch: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = BlockingOutbox()
    monkeypatch.setattr(lambda_batch, "sent_emails", outbox)
    original = {"Records": [sqs_record("m-1", '{"email": "eve@example.com"}', key="signup-5")]}
    duplicate = {"Records": [sqs_record("m-9", '{"email": "eve@example.com"}', key="signup-5")]}
    responses: list[dict[str, Any]] = []
    # Another container is processing the original.
    elsewhere = threading.Thread(
        target=lambda: responses.append(lambda_batch.handler(original, None))
    )
    elsewhere.start()
    try:
        assert outbox.sending.wait(timeout=20)
        assert failed(lambda_batch.handler(duplicate, None)) == ["m-9"]
    finally:
        outbox.proceed.set()
        elsewhere.join(timeout=20)
    assert responses == [{"batchItemFailures": []}]

    # SQS redelivers the duplicate later: it replays.
    assert failed(lambda_batch.handler(duplicate, None)) == []
    assert outbox == ["eve@example.com"]
    assert lambda_batch.given_up == []


def test_lambda_batch_gives_up_on_a_record_at_its_last_attempt(
    lambda_batch: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lambda_batch, "given_up", [])
    record = sqs_record("m-5", "not json")
    record["attributes"]["ApproximateReceiveCount"] = "3"  # the consumer's max_attempts

    # Not reported: SQS deletes it, and on_exhausted kept it for a redrive.
    assert failed(lambda_batch.handler({"Records": [record]}, None)) == []
    assert lambda_batch.given_up == ["m-5"]


@pytest.fixture
def celery_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("RECEIPTS_IDEMPOTENCY_DB", str(tmp_path / "receipts.sqlite3"))
    module = fresh("examples.celery_task")
    try:
        yield module
    finally:
        module.store.close()


def test_celery_task_sends_each_receipt_once_across_redeliveries_and_restarts(
    celery_task: ModuleType,
) -> None:
    assert celery_task.send_receipt("receipt-order-1", "order-1") == 1
    # Redelivered (the worker died before acknowledging it), or retried: the same task id.
    assert celery_task.send_receipt("receipt-order-1", "order-1") == 1
    assert celery_task.send_receipt(task_id="receipt-order-1", order_id="order-1") == 1
    assert celery_task.outbox == [("order-1", 1)]
    assert celery_task.send_receipt("receipt-order-2", "order-2") == 2  # another task

    # The same task id with other arguments is a bug in the producer, not a retry.
    with pytest.raises(KeyReusedError):
        celery_task.send_receipt("receipt-order-1", "order-3")

    # A new worker process on the same file (the module imported anew: a new store, an
    # empty outbox): nothing is sent again.
    celery_task.store.close()
    restarted = fresh("examples.celery_task")
    assert restarted.send_receipt("receipt-order-1", "order-1") == 1
    assert restarted.outbox == []


async def test_service_method_charges_once_per_request_id() -> None:
    from examples.service_method import PaymentGateway, PaymentService, Receipt

    gateway = PaymentGateway()
    request_id = f"req-{uuid.uuid4()}"
    first = await PaymentService(gateway).charge(request_id, 1999)
    assert first == Receipt(request_id, 1999, "ch_1")

    # A retry, reaching another instance of the service: the same Receipt, rebuilt.
    retry = await PaymentService(gateway).charge(request_id, 1999)
    assert retry == first and type(retry) is Receipt
    assert await PaymentService(gateway).charge(request_id=request_id, amount=1999) == first
    assert gateway.charges == [1999]

    with pytest.raises(KeyReusedError):  # the same request id with another amount
        await PaymentService(gateway).charge(request_id, 2999)
    assert await PaymentService(gateway).charge(f"req-{uuid.uuid4()}", 2999) != first
    assert gateway.charges == [1999, 2999]
