"""The consumers page's SQS worker, on moto's SQS (127.0.0.1), stopped by a SIGTERM.

Four payments are sent, one of them twice (a producer's retry, a new MessageId); the worker
records three, deletes all four, and stops after the batch in hand when SIGTERM arrives.
"""

import os
import threading
import time
from signal import SIGTERM

import boto3
from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
# The worker's default client is boto3.client("sqs"): point it at moto, never at AWS.
os.environ.update(
    AWS_ENDPOINT_URL=f"http://{host}:{port}",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_ACCESS_KEY_ID="local",
    AWS_SECRET_ACCESS_KEY="local",
)
sqs = boto3.client("sqs")
QUEUE_URL = os.environ["QUEUE_URL"] = sqs.create_queue(QueueName="payments")["QueueUrl"]
for body, key in [
    ("pay 10 to alice", "payment-1"),
    ("pay 10 to alice", "payment-1"),
    ("pay 20 to bob", "payment-2"),
    ("pay 30 to carol", "payment-3"),
]:
    attributes = {"IdempotencyKey": {"DataType": "String", "StringValue": key}}
    sqs.send_message(QueueUrl=QUEUE_URL, MessageBody=body, MessageAttributes=attributes)


def terminate_once_a_payment_is_made() -> None:
    """What a deployment does to stop the worker: SIGTERM (here once it is busy)."""
    while not globals().get("payments"):
        time.sleep(0.01)
    os.kill(os.getpid(), SIGTERM)


threading.Thread(target=terminate_once_a_payment_is_made, daemon=True).start()

# --8<-- [start:show]
import os
import signal
import threading

from idempotency_middleware import IdempotentConsumer, SQLiteStore, SQSWorker

QUEUE_URL = os.environ["QUEUE_URL"]  # boto3's settings, AWS_ENDPOINT_URL_SQS for a local SQS
payments: list[str] = []  # the side effect: a payment, an email, a row


def record_payment(message: dict) -> int:
    payments.append(message["Body"])
    return len(payments)


def payment_key(message: dict) -> str:
    """The producer's key, the same on every send of one payment; else the MessageId."""
    attribute = message.get("MessageAttributes", {}).get("IdempotencyKey")
    return attribute["StringValue"] if attribute else message["MessageId"]


consumer = IdempotentConsumer(
    record_payment,
    store=SQLiteStore("payments-idempotency.sqlite3"),
    key=payment_key,
    name="payments.record",
    lock_timeout_seconds=25,  # plus 1 s of clock skew margin: within the 30 s visibility
    max_attempts=5,  # at most the queue's maxReceiveCount
    on_exhausted=lambda message, error: print("giving up on", message["MessageId"], error),
)
worker = SQSWorker(consumer, QUEUE_URL)  # boto3.client("sqs"), long polling (20 s)

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())  # finish the batch, then stop
worker.run(stop)
worker.close()
# --8<-- [end:show]

assert sorted(payments) == ["pay 10 to alice", "pay 20 to bob", "pay 30 to carol"], payments
left = sqs.get_queue_attributes(
    QueueUrl=QUEUE_URL,
    AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
)["Attributes"]
assert left == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
sqs.close()
server.stop()
