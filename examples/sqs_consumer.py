"""An SQS consumer that records each payment once, however often SQS delivers it.

SQS delivers at least once: a message comes back when its consumer crashed before deleting
it, and a producer that retries a send makes a second message with a new MessageId. So the
key is the producer's ``IdempotencyKey`` attribute (the MessageId when there is none), and an
``SQSWorker`` runs an ``IdempotentConsumer``: a delivery whose key already completed replays
the stored result instead of paying again, and the message is deleted; a duplicate still
running elsewhere goes back to the queue until that run's claim could be taken over.

    python -m examples.sqs_consumer             # on a fresh clone (after `make install`)
    python -m examples.sqs_consumer QUEUE_URL   # your queue (AWS_ENDPOINT_URL=... for a local SQS)

With no queue URL it starts moto's SQS on 127.0.0.1, sends four payments there (one of them
twice, as a producer's retry does) and consumes them: three are recorded, not four.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
from typing import Any

from idempotency_middleware import IdempotentConsumer, SQLiteStore, SQSWorker, SyncStore

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

    def record_payment(message: Message) -> int:
        ledger.append(message["Body"])  # the side effect: a payment, an email, a row
        return len(ledger)  # the entry's number: a replay returns this same number

    consumer = IdempotentConsumer(
        record_payment,
        store=store,
        key=message_key,  # the payload is the message's Body: a redelivery is the same work
        name="payments.record",
        lock_timeout_seconds=20,  # below the queue's visibility timeout (30 s by default)
        max_attempts=5,  # then given up: logged, and deleted
    )
    worker = SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=wait_time_seconds)
    # Each batch: ack (deleted), retry (back to the queue), or dead (deleted, given up).
    while worker.run_once() or not stop_when_empty:
        pass


def local_queue(sqs: Any) -> str:
    """A queue on moto's SQS with four payments, one sent twice (a producer's retry)."""
    queue_url = str(sqs.create_queue(QueueName="payments")["QueueUrl"])
    for body, key in [
        ("pay 10 to alice", "payment-1"),
        ("pay 10 to alice", "payment-1"),
        ("pay 20 to bob", "payment-2"),
        ("pay 30 to carol", "payment-3"),
    ]:
        attributes = {"IdempotencyKey": {"DataType": "String", "StringValue": key}}
        sqs.send_message(QueueUrl=queue_url, MessageBody=body, MessageAttributes=attributes)
    return queue_url


def main(arguments: list[str]) -> int:
    import boto3

    if len(arguments) > 1 or arguments[:1] in (["-h"], ["--help"]):
        print("usage: python -m examples.sqs_consumer [QUEUE_URL]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server, request by request
    ledger: list[str] = []
    path = "consumer-idempotency.sqlite3"
    with contextlib.ExitStack() as stack:
        if arguments:
            queue_url, sqs = arguments[0], boto3.client("sqs")
        else:  # a fresh clone: moto's SQS on 127.0.0.1, started and stopped here
            from moto.server import ThreadedMotoServer

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            stack.callback(server.stop)
            host, port = server.get_host_and_port()
            sqs = boto3.client(
                "sqs",
                endpoint_url=f"http://{host}:{port}",
                region_name="us-east-1",
                aws_access_key_id="local",
                aws_secret_access_key="local",
            )
            queue_url = local_queue(sqs)
            path = f"{stack.enter_context(tempfile.TemporaryDirectory())}/{path}"  # a new queue
        # One SQLite file serves every consumer process on this machine; DynamoDBStore(table)
        # serves consumers on many machines.
        store = stack.enter_context(SQLiteStore(path))
        consume(queue_url, sqs, store, ledger, wait_time_seconds=1, stop_when_empty=True)
    print(f"recorded {len(ledger)} payments")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
