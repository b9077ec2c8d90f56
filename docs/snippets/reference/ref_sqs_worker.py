"""The API reference's example for SQSWorker, on moto's SQS (127.0.0.1)."""

import os

from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
# What the shown part's boto3.client("sqs") reads: moto's SQS, never AWS.
os.environ.update(
    AWS_ENDPOINT_URL_SQS=f"http://{host}:{port}",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_ACCESS_KEY_ID="local",
    AWS_SECRET_ACCESS_KEY="local",
)

# --8<-- [start:SQSWorker]
import boto3

from idempotency_middleware import IdempotentConsumer, MemoryStore, SQSWorker

sqs = boto3.client("sqs")  # the AWS SDK's settings; AWS_ENDPOINT_URL_SQS for a local SQS
queue_url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
consumer = IdempotentConsumer(
    lambda message: f"done {message['Body']}",
    store=MemoryStore(),
    key=lambda message: message["MessageId"],
    name="jobs.run",
)
sqs.send_message(QueueUrl=queue_url, MessageBody="j-1")
with SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=1) as worker:
    [outcome] = worker.run_once()  # received, run, deleted
    assert (outcome.action, outcome.result) == ("ack", "done j-1")
    assert worker.run_once() == []  # nothing left: an empty receive after 1 s
# --8<-- [end:SQSWorker]

sqs.close()
server.stop()
