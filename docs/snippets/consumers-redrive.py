"""The consumers page's redrive steps in code, on moto's SQS (127.0.0.1): the dead letters'
keys read without taking the messages out of the dead-letter queue, and the move back to the
source queue by hand, where SQS's move task is not to be had (moto has none).
tests/e2e/test_sqs_dead_letters.py runs these same functions through the page's steps."""

import json
import os

import boto3
from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
sqs = boto3.client(
    "sqs",
    endpoint_url=f"http://{host}:{port}",
    region_name="us-east-1",
    aws_access_key_id="local",
    aws_secret_access_key="local",
)
DEAD_LETTER_QUEUE_URL = sqs.create_queue(QueueName="payments-dead-letters")["QueueUrl"]
arn = sqs.get_queue_attributes(QueueUrl=DEAD_LETTER_QUEUE_URL, AttributeNames=["QueueArn"])
policy = {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": "5"}
QUEUE_URL = sqs.create_queue(
    QueueName="payments", Attributes={"RedrivePolicy": json.dumps(policy)}
)["QueueUrl"]
for body, key in [("pay 20 to bob", "payment-2"), ("pay 35 to carol", "payment-3")]:
    attributes = {"IdempotencyKey": {"DataType": "String", "StringValue": key}}
    sqs.send_message(QueueUrl=DEAD_LETTER_QUEUE_URL, MessageBody=body, MessageAttributes=attributes)
# Where the reader's deployment says (the sections read these, as a deployed job would).
os.environ.update(DEAD_LETTER_QUEUE_URL=DEAD_LETTER_QUEUE_URL, QUEUE_URL=QUEUE_URL)
os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_DEFAULT_REGION="us-east-1")
os.environ.update(AWS_ACCESS_KEY_ID="local", AWS_SECRET_ACCESS_KEY="local")


# --8<-- [start:keys]
import os
from pathlib import Path

import boto3


def payment_key(message: dict) -> str:
    """The consumer's `key`: the producer's IdempotencyKey attribute, else the MessageId."""
    attribute = message["MessageAttributes"].get("IdempotencyKey")
    return attribute["StringValue"] if attribute else message["MessageId"]


def dead_letter_keys(sqs, dead_letter_queue_url: str, key) -> list[str]:
    """What the consumer's `key` returns for each message of the dead-letter queue. Each is
    hidden for a minute as it is read, so the next receive gets the others, then all are made
    visible again: the queue keeps every message."""
    keys, receipts = [], []
    while messages := sqs.receive_message(
        QueueUrl=dead_letter_queue_url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=1,  # long polling asks every SQS server: none is missed
        VisibilityTimeout=60,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    ).get("Messages"):
        keys += [key(message) for message in messages]
        receipts += [message["ReceiptHandle"] for message in messages]
    for start in range(0, len(receipts), 10):
        entries = [
            {"Id": str(number), "ReceiptHandle": receipt, "VisibilityTimeout": 0}
            for number, receipt in enumerate(receipts[start : start + 10])
        ]
        sqs.change_message_visibility_batch(QueueUrl=dead_letter_queue_url, Entries=entries)
    return keys


sqs = boto3.client("sqs")
keys = dead_letter_keys(sqs, os.environ["DEAD_LETTER_QUEUE_URL"], payment_key)
Path("dead-letter-keys.txt").write_text("".join(f"{key}\n" for key in keys))
# --8<-- [end:keys]

assert sorted(Path("dead-letter-keys.txt").read_text().split()) == ["payment-2", "payment-3"]


# --8<-- [start:move]
import os

import boto3


def move_back(sqs, dead_letter_queue_url: str, queue_url: str) -> int:
    """SQS's move task by hand: each dead letter sent back to the queue with its body and
    message attributes (its group to a FIFO queue), then deleted; how many were moved."""
    fifo = queue_url.endswith(".fifo")
    moved = 0
    while messages := sqs.receive_message(
        QueueUrl=dead_letter_queue_url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=1,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    ).get("Messages"):
        for message in messages:
            copy = {"MessageBody": message["Body"]}
            if message.get("MessageAttributes"):
                copy["MessageAttributes"] = message["MessageAttributes"]
            if fifo:
                copy["MessageGroupId"] = message["Attributes"]["MessageGroupId"]
                copy["MessageDeduplicationId"] = message["MessageId"]
            sqs.send_message(QueueUrl=queue_url, **copy)
            sqs.delete_message(
                QueueUrl=dead_letter_queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
            moved += 1
    return moved


sqs = boto3.client("sqs")
print("moved", move_back(sqs, os.environ["DEAD_LETTER_QUEUE_URL"], os.environ["QUEUE_URL"]))
# --8<-- [end:move]

back = sqs.receive_message(
    QueueUrl=QUEUE_URL, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
)
assert sorted(payment_key(message) for message in back["Messages"]) == ["payment-2", "payment-3"]
assert "Messages" not in sqs.receive_message(QueueUrl=DEAD_LETTER_QUEUE_URL)
sqs.close()
server.stop()
