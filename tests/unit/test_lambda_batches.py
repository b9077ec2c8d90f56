"""``process_lambda_batch`` / ``aprocess_lambda_batch``: Lambda's partial batch failure
response for SQS (standard and FIFO), Kinesis and DynamoDB Streams events, on MemoryStore.

Records to retry are reported; ``ack`` and ``dead`` ones are not. Order is kept where the
source has one: a FIFO group stops at its first retry, a stream at its first retry.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from idempotency_middleware import (
    IdempotentConsumer,
    MemoryStore,
    aprocess_lambda_batch,
    process_lambda_batch,
)

QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:orders"


def sqs_record(
    message_id: str, body: str, *, receive_count: int = 1, group: str | None = None
) -> dict[str, Any]:
    attributes = {"ApproximateReceiveCount": str(receive_count), "SentTimestamp": "1"}
    if group is not None:
        attributes["MessageGroupId"] = group
    return {
        "messageId": message_id,
        "receiptHandle": f"AQEB{uuid.uuid4().hex}",
        "body": body,
        "attributes": attributes,
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": QUEUE_ARN + (".fifo" if group is not None else ""),
    }


def kinesis_record(sequence: str, data: str) -> dict[str, Any]:
    return {
        "kinesis": {"sequenceNumber": sequence, "data": data, "partitionKey": "p"},
        "eventSource": "aws:kinesis",
        "eventID": f"shardId-000000000000:{sequence}",
    }


def dynamodb_record(sequence: str, data: str) -> dict[str, Any]:
    return {
        "dynamodb": {"SequenceNumber": sequence, "Keys": {"id": {"S": data}}},
        "eventSource": "aws:dynamodb",
        "eventID": sequence,
    }


def body_of(record: dict[str, Any]) -> str:
    if "body" in record:
        return str(record["body"])
    if "kinesis" in record:
        return str(record["kinesis"]["data"])
    return str(record["dynamodb"]["Keys"]["id"]["S"])


def key_of(record: dict[str, Any]) -> str:
    """The messageId, or a stream record's sequence number."""
    if "messageId" in record:
        return str(record["messageId"])
    if "kinesis" in record:
        return str(record["kinesis"]["sequenceNumber"])
    return str(record["dynamodb"]["SequenceNumber"])


class Handler:
    """Runs each record, failing on bodies starting with ``fail``."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def __call__(self, record: dict[str, Any]) -> str:
        body = body_of(record)
        self.runs.append(body)
        if body.startswith("fail"):
            raise ValueError(f"cannot process {body}")
        return body.upper()


def consumer(handler: Handler, **options: Any) -> IdempotentConsumer:
    return IdempotentConsumer(
        handler, store=MemoryStore(), key=key_of, name=f"tests.batch.{uuid.uuid4().hex}", **options
    )


def failed(response: dict[str, Any]) -> list[str]:
    return [each["itemIdentifier"] for each in response["batchItemFailures"]]


def test_sqs_reports_the_records_to_retry_and_not_the_dead_ones() -> None:
    handler = Handler()
    dead: list[str] = []
    orders = consumer(
        handler, max_attempts=3, on_exhausted=lambda record, error: dead.append(key_of(record))
    )
    event = {
        "Records": [
            sqs_record("m-1", "a"),
            sqs_record("m-2", "fail-b", receive_count=1),  # retried
            sqs_record("m-3", "fail-c", receive_count=3),  # its last attempt: dead
            sqs_record("m-4", "d"),
        ]
    }

    assert process_lambda_batch(orders, event) == {"batchItemFailures": [{"itemIdentifier": "m-2"}]}
    assert dead == ["m-3"]
    assert handler.runs == ["a", "fail-b", "fail-c", "d"]
    # Lambda's retry of the whole batch: completed records replay; the failing one runs again.
    assert failed(process_lambda_batch(orders, event)) == ["m-2"]
    assert handler.runs[4:] == ["fail-b", "fail-c"]


def test_sqs_fifo_reports_a_groups_later_records_without_running_them() -> None:
    handler = Handler()
    orders = consumer(handler, max_attempts=2)
    event = {
        "Records": [
            sqs_record("a-1", "fail-a1", group="a"),  # retried: group a stops here
            sqs_record("b-1", "b1", group="b"),
            sqs_record("a-2", "a2", group="a"),  # behind a-1: reported, not run
            sqs_record("c-1", "fail-c1", group="c", receive_count=2),  # dead: c goes on
            sqs_record("c-2", "c2", group="c"),
            sqs_record("b-2", "b2", group="b"),
        ]
    }

    assert failed(process_lambda_batch(orders, event)) == ["a-1", "a-2"]
    assert handler.runs == ["fail-a1", "b1", "fail-c1", "c2", "b2"]


@pytest.mark.parametrize("record", [kinesis_record, dynamodb_record], ids=["kinesis", "dynamodb"])
def test_a_stream_stops_at_its_first_retry_and_reports_it_and_every_later_record(
    record: Any,
) -> None:
    handler = Handler()
    dead: list[str] = []
    # A stream record carries no delivery count: max_attempts never makes one dead.
    events = consumer(
        handler, max_attempts=1, on_exhausted=lambda record, error: dead.append(str(error))
    )
    event = {"Records": [record("101", "x"), record("102", "fail-y"), record("103", "z")]}

    assert failed(process_lambda_batch(events, event)) == ["102", "103"]
    assert handler.runs == ["x", "fail-y"]
    assert dead == []


def test_a_dead_stream_record_lets_the_rest_go_on() -> None:
    handler = Handler()
    # The key function fails on one record: that one is dead, the stream goes on.
    events = IdempotentConsumer(
        handler,
        store=MemoryStore(),
        key=lambda record: None if body_of(record) == "keyless" else key_of(record),
        name=f"tests.batch.{uuid.uuid4().hex}",
    )
    event = {"Records": [kinesis_record("1", "keyless"), kinesis_record("2", "w")]}

    assert failed(process_lambda_batch(events, event)) == []
    assert handler.runs == ["w"]


def test_the_delivery_count_is_sqs_approximate_receive_count() -> None:
    counts: list[int | None] = []

    class Counting(IdempotentConsumer):
        def process(self, message: Any, delivery_count: int | None = None) -> Any:
            counts.append(delivery_count)
            return super().process(message, delivery_count)

    orders = Counting(Handler(), store=MemoryStore(), key=key_of, name=uuid.uuid4().hex)
    event = {"Records": [sqs_record("m-1", "a", receive_count=4), sqs_record("m-2", "b")]}

    process_lambda_batch(orders, event)

    assert counts == [4, 1]


def test_an_async_consumer_runs_the_batch_on_the_event_loop() -> None:
    runs: list[str] = []

    async def handle(record: dict[str, Any]) -> str:
        runs.append(body_of(record))
        if body_of(record).startswith("fail"):
            raise ValueError("no")
        return "ok"

    orders = IdempotentConsumer(handle, store=MemoryStore(), key=key_of, name=uuid.uuid4().hex)
    event = {
        "Records": [
            sqs_record("f-1", "fail", group="g"),
            sqs_record("f-2", "next", group="g"),
            sqs_record("h-1", "other", group="h"),
        ]
    }

    assert failed(asyncio.run(aprocess_lambda_batch(orders, event))) == ["f-1", "f-2"]
    assert runs == ["fail", "other"]


def test_an_empty_batch_reports_nothing() -> None:
    assert process_lambda_batch(consumer(Handler()), {"Records": []}) == {"batchItemFailures": []}


@pytest.mark.parametrize(
    "event",
    [
        {"detail-type": "OrderPlaced", "detail": {}},  # EventBridge
        {"Records": [{"eventSource": "aws:s3", "s3": {}}]},
        {"Records": [sqs_record("m-1", "a"), kinesis_record("1", "b")]},
        {"Records": [{"eventSource": "aws:sqs", "body": "no messageId"}]},
        [],
    ],
    ids=["eventbridge", "s3", "mixed", "no-identifier", "not-a-mapping"],
)
def test_an_event_of_another_kind_is_a_value_error(event: Any) -> None:
    handler = Handler()
    with pytest.raises(ValueError, match=r"SQS, Kinesis or DynamoDB Streams|identifier"):
        process_lambda_batch(consumer(handler), event)
    assert handler.runs == []
