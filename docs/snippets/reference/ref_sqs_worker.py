"""The API reference's example for SQSWorker, on moto's SQS (127.0.0.1)."""

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
queue_url = sqs.create_queue(QueueName="jobs")["QueueUrl"]

# --8<-- [start:SQSWorker]
from idempotency_middleware import IdempotentConsumer, MemoryStore, SQSWorker

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
