"""Lambda batches: an ``IdempotentConsumer`` run over each record of a Lambda event from SQS,
Kinesis or DynamoDB Streams, answered as a partial batch failure response.

The records to deliver again (outcome ``retry``) are reported in ``batchItemFailures``;
``ack`` and ``dead`` records are not (done, or given up). The event source mapping needs
``FunctionResponseTypes: ["ReportBatchItemFailures"]``. Order is kept where the source has
one: an SQS FIFO message group stops at its first record to retry (its later records are
reported without running), and a stream stops at its first record to retry (it and every
later record are reported).

The walk over the records is written once (``_batch``, a generator that yields each record
to process and receives its outcome); the sync and the async function only drive it.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, NamedTuple

from .consumer import IdempotentConsumer, Outcome

# eventSource of each kind of record (DynamoDB Streams records say "aws:dynamodb").
_SQS = "aws:sqs"
_KINESIS = "aws:kinesis"
_DYNAMODB = "aws:dynamodb"
_SOURCES = (_SQS, _KINESIS, _DYNAMODB)

BatchResponse = dict[str, list[dict[str, str]]]


class _Delivery(NamedTuple):
    """One record to process, with its delivery count (SQS only)."""

    record: Mapping[str, Any]
    delivery_count: int | None


def _records(event: object) -> tuple[str, list[Mapping[str, Any]]]:
    """The event's source and records; ``ValueError`` for an event of another kind."""
    records = event.get("Records") if isinstance(event, Mapping) else None
    if not isinstance(records, list) or not all(isinstance(each, Mapping) for each in records):
        raise ValueError(
            "not a Lambda event from SQS, Kinesis or DynamoDB Streams: it has no 'Records' "
            "list of records"
        )
    sources = {record.get("eventSource") for record in records}
    if not records:
        return _SQS, records
    if len(sources) != 1 or next(iter(sources)) not in _SOURCES:
        raise ValueError(
            f"not a Lambda event from SQS, Kinesis or DynamoDB Streams: its records' "
            f"eventSource is {sorted(map(str, sources))} (expected one of {list(_SOURCES)})"
        )
    return str(next(iter(sources))), records


def _item_identifier(source: str, record: Mapping[str, Any]) -> str:
    """What ``batchItemFailures`` names a record by: the SQS ``messageId``, or the stream
    record's sequence number."""
    try:
        if source == _SQS:
            return str(record["messageId"])
        if source == _KINESIS:
            return str(record["kinesis"]["sequenceNumber"])
        return str(record["dynamodb"]["SequenceNumber"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"a {source} record without its identifier ({error!r})") from error


def _receive_count(record: Mapping[str, Any]) -> int | None:
    """SQS's ``ApproximateReceiveCount`` of a record (``None`` when it does not say)."""
    attributes = record.get("attributes")
    count = attributes.get("ApproximateReceiveCount") if isinstance(attributes, Mapping) else None
    try:
        return int(count) if count is not None else None
    except (TypeError, ValueError):
        return None


def _fifo_group(record: Mapping[str, Any]) -> str | None:
    """The message group of an SQS FIFO record (``None`` on a standard queue)."""
    attributes = record.get("attributes")
    group = attributes.get("MessageGroupId") if isinstance(attributes, Mapping) else None
    if group is None and str(record.get("eventSourceARN", "")).endswith(".fifo"):
        return ""  # a FIFO queue's record that does not name its group: one group
    return None if group is None else str(group)


def _batch(event: object) -> Generator[_Delivery, Outcome, BatchResponse]:
    """Yields each record to process and receives its outcome; returns the response."""
    source, records = _records(event)
    identifiers = [_item_identifier(source, record) for record in records]
    failed: list[str] = []
    blocked_groups: set[str] = set()
    for index, record in enumerate(records):
        if source == _SQS:
            group = _fifo_group(record)
            if group is not None and group in blocked_groups:
                failed.append(identifiers[index])  # kept in order behind its group's retry
                continue
            outcome = yield _Delivery(record, _receive_count(record))
            if outcome.action == "retry":
                failed.append(identifiers[index])
                if group is not None:
                    blocked_groups.add(group)
            continue
        # A stream shard is ordered: nothing after a record to retry may run before it.
        outcome = yield _Delivery(record, None)
        if outcome.action == "retry":
            failed.extend(identifiers[index:])
            break
    return {"batchItemFailures": [{"itemIdentifier": each} for each in failed]}


def process_lambda_batch(consumer: IdempotentConsumer, event: Mapping[str, Any]) -> BatchResponse:
    """Run ``consumer`` (a sync handler) over each record of a Lambda SQS, Kinesis or
    DynamoDB Streams event; the partial batch failure response naming the records to deliver
    again. ``ValueError`` for an event of another kind."""
    walk = _batch(event)
    try:
        delivery = next(walk)
        while True:
            delivery = walk.send(consumer.process(delivery.record, delivery.delivery_count))
    except StopIteration as done:
        response: BatchResponse = done.value
        return response


async def aprocess_lambda_batch(
    consumer: IdempotentConsumer, event: Mapping[str, Any]
) -> BatchResponse:
    """``process_lambda_batch`` for a consumer with a coroutine handler (records one at a
    time, in order)."""
    walk = _batch(event)
    try:
        delivery = next(walk)
        while True:
            outcome = await consumer.aprocess(delivery.record, delivery.delivery_count)
            delivery = walk.send(outcome)
    except StopIteration as done:
        response: BatchResponse = done.value
        return response


__all__ = ["BatchResponse", "aprocess_lambda_batch", "process_lambda_batch"]
