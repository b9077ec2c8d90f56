"""``SQSWorker``'s ``dead_letter`` option checked at construction, and the pure parts of
sending a dead message to the dead-letter queue (no SQS needed: tests/e2e/test_sqs_dead_letters.py
runs them on moto)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotency_middleware import IdempotentConsumer, MemoryStore, SQSWorker
from idempotency_middleware.consumers.sqs_dead_letters import (
    NoDeadLetterQueueError,
    dead_letter_entry,
    dead_letter_target,
    queue_name_and_account,
)

QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


class UnusedClient:
    """A client the worker must not call while it is being made."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the client was called: {name}")


def worker(**options: Any) -> SQSWorker:
    consumer = IdempotentConsumer(
        lambda message: None,
        store=MemoryStore(),
        key=lambda message: message["MessageId"],
        name="tests.dead_letters",
    )
    return SQSWorker(consumer, QUEUE_URL, client=UnusedClient(), **options)


def test_dead_letter_defaults_to_delete() -> None:
    assert worker().dead_letter == "delete"


@pytest.mark.parametrize("value", ["delete", "queue", "leave"])
def test_each_dead_letter_choice_is_taken(value: str) -> None:
    assert worker(dead_letter=value).dead_letter == value


@pytest.mark.parametrize("value", ["dlq", "Queue", "", None, 1, True])
def test_an_unknown_dead_letter_is_a_value_error_naming_the_choices(value: object) -> None:
    with pytest.raises(ValueError) as refused:
        worker(dead_letter=value)
    assert str(refused.value) == (
        f"dead_letter must be one of 'delete', 'queue', 'leave', got {value!r}"
    )


def test_a_misspelled_dead_letter_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="dead_letter"):
        worker(dead_letters="queue")


@pytest.mark.parametrize(
    ("policy", "target"),
    [
        (
            '{"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:1:dlq", "maxReceiveCount": 5}',
            "arn:aws:sqs:eu-west-1:1:dlq",
        ),
        ('{"maxReceiveCount": 5}', None),
        ('{"deadLetterTargetArn": ""}', None),
        (None, None),
        ("not json", None),
    ],
)
def test_the_redrive_policys_target_is_read_when_there_is_one(
    policy: str | None, target: str | None
) -> None:
    assert dead_letter_target(policy) == target


def test_a_queue_arn_gives_its_name_and_account() -> None:
    assert queue_name_and_account("arn:aws:sqs:eu-west-1:123456789012:dlq.fifo") == (
        "dlq.fifo",
        "123456789012",
    )


@pytest.mark.parametrize(
    "arn", ["dlq", "arn:aws:sns:eu-west-1:1:topic", "arn:aws:sqs:eu-west-1::dlq"]
)
def test_a_target_that_is_no_queue_arn_is_refused(arn: str) -> None:
    with pytest.raises(NoDeadLetterQueueError, match="is not a queue ARN"):
        queue_name_and_account(arn)


MESSAGE = {
    "MessageId": "m-1",
    "ReceiptHandle": "r-1",
    "Body": "pay 20 to bob",
    "Attributes": {"ApproximateReceiveCount": "3", "MessageGroupId": "bob"},
    "MessageAttributes": {"IdempotencyKey": {"DataType": "String", "StringValue": "payment-2"}},
}


def test_a_dead_letter_keeps_its_body_and_message_attributes() -> None:
    assert dead_letter_entry("0", MESSAGE, fifo=False) == {
        "Id": "0",
        "MessageBody": "pay 20 to bob",
        "MessageAttributes": MESSAGE["MessageAttributes"],
    }


def test_a_fifo_dead_letter_keeps_its_group_and_is_deduplicated_on_its_message_id() -> None:
    entry = dead_letter_entry("0", MESSAGE, fifo=True)
    assert (entry["MessageGroupId"], entry["MessageDeduplicationId"]) == ("bob", "m-1")


def test_a_dead_letter_keeps_its_trace_header() -> None:
    traced = {
        **MESSAGE,
        "Attributes": {"AWSTraceHeader": "Root=1-5759e988-bd862e3fe1be46a994272793"},
    }
    assert dead_letter_entry("0", traced, fifo=False)["MessageSystemAttributes"] == {
        "AWSTraceHeader": {
            "DataType": "String",
            "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793",
        }
    }


def test_a_dead_letter_without_message_attributes_sends_none() -> None:
    bare = {"MessageId": "m-1", "Body": "b", "Attributes": {}, "ReceiptHandle": "r"}
    assert dead_letter_entry("3", bare, fifo=False) == {"Id": "3", "MessageBody": "b"}
