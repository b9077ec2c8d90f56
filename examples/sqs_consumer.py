"""An SQS consumer that records each payment once, however often SQS delivers it.

SQS delivers at least once: a message comes back when its consumer crashed before deleting
it, and a producer that retries a send makes a second message with a new MessageId. So the
key is the producer's ``IdempotencyKey`` attribute (the MessageId when there is none) and
the handler is ``@idempotent``: a delivery whose key already completed replays the stored
result instead of paying again, and the message is deleted.

    python -m examples.sqs_consumer QUEUE_URL   # AWS_ENDPOINT_URL=... for a local SQS
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

from idempotency_middleware import KeyInProgressError, SQLiteStore, SyncStore, idempotent

logger = logging.getLogger(__name__)

Message = dict[str, Any]  # one message as boto3's receive_message returns it


def message_key(message: Message) -> str:
    """The producer's key, the same on every send of one payment; else the MessageId."""
    attribute = message.get("MessageAttributes", {}).get("IdempotencyKey")
    return str(attribute["StringValue"]) if attribute else str(message["MessageId"])


def consume(
    queue_url: str,
    sqs: Any,  # boto3.client("sqs")
    store: SyncStore,
    ledger: list[str],
    *,
    wait_time_seconds: int = 20,
    stop_when_empty: bool = False,
) -> None:
    """Long-poll ``queue_url`` and record each payment in ``ledger`` once."""

    @idempotent(store=store, key=message_key, payload=lambda message: message["Body"])
    def record_payment(message: Message) -> int:
        ledger.append(message["Body"])  # the side effect: a payment, an email, a row
        return len(ledger)  # the entry's number: a replay returns this same number

    while True:
        response = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_time_seconds,
            MessageAttributeNames=["IdempotencyKey"],
        )
        messages = response.get("Messages", [])
        if not messages and stop_when_empty:
            return
        for message in messages:
            receipt = message["ReceiptHandle"]
            try:
                record_payment(message)
            except KeyInProgressError as error:
                # Another consumer is processing a duplicate right now: look again later.
                sqs.change_message_visibility(
                    QueueUrl=queue_url,
                    ReceiptHandle=receipt,
                    VisibilityTimeout=math.ceil(error.retry_after),
                )
            except Exception:
                # Not deleted: SQS redelivers it after its visibility timeout (then to a DLQ).
                logger.exception("message %s failed", message["MessageId"])
            else:
                # Deleted once recorded. A crash before this line is harmless: the redelivery
                # replays the stored result, and no second payment is recorded.
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=receipt)


if __name__ == "__main__":
    import boto3

    logging.basicConfig(level=logging.INFO)
    ledger: list[str] = []
    # One SQLite file serves every consumer process on this machine; DynamoDBStore(table)
    # serves consumers on many machines.
    with SQLiteStore("consumer-idempotency.sqlite3") as store:
        consume(sys.argv[1], boto3.client("sqs"), store, ledger, stop_when_empty=True)
    print(f"recorded {len(ledger)} payments")
