"""A Lambda handler for SQS batches that processes each record once, with partial failures.

Lambda hands a batch of SQS records to ``handler``; records it reports in
``batchItemFailures`` are redelivered, the others deleted (the event source mapping needs
``FunctionResponseTypes: ["ReportBatchItemFailures"]``). ``process_lambda_batch`` gives each
record a verdict: done or replayed (``ack``), to deliver again (``retry``: it failed, or its
duplicate is still running elsewhere), or given up after ``max_attempts`` deliveries
(``dead``: handed to ``on_exhausted``, not reported, so SQS deletes it).

The store is built once per container, at import, from the function's environment:

    IDEMPOTENCY_TABLE=idempotency DYNAMODB_ENDPOINT_URL=http://127.0.0.1:8000 \\
        python -m examples.lambda_batch
"""

from __future__ import annotations

# --8<-- [start:handler]
import json
import os
from typing import Any

from idempotency_middleware import DynamoDBStore, IdempotentConsumer, process_lambda_batch

store = DynamoDBStore(
    os.environ.get("IDEMPOTENCY_TABLE", "idempotency"),
    endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL"),  # unset in Lambda: the real one
)

# Stand in for the side effect (an email, a charge) and for a dead-letter table.
sent_emails: list[str] = []
given_up: list[str] = []


def record_key(record: dict[str, Any]) -> str:
    """The producer's ``IdempotencyKey`` attribute (a retried send is a new message with a
    new messageId), else the messageId (the same message delivered again)."""
    attribute = record["messageAttributes"].get("IdempotencyKey")
    return str(attribute["stringValue"]) if attribute else str(record["messageId"])


def send_welcome_email(record: dict[str, Any]) -> str:
    address = json.loads(record["body"])["email"]  # a malformed body raises: not kept
    sent_emails.append(address)
    return f"sent to {address}"


consumer = IdempotentConsumer(
    send_welcome_email,
    store=store,
    key=record_key,  # the payload is the record's body: a redelivery is the same work
    name="signups.welcome_email",
    max_attempts=3,  # the queue's maxReceiveCount, or fewer
    on_exhausted=lambda record, error: given_up.append(record["messageId"]),
)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_lambda_batch(consumer, event)


# --8<-- [end:handler]


def local_dynamodb() -> Any:
    """moto's DynamoDB on 127.0.0.1 for the run, through the AWS SDK's own variables (read
    when the store first connects); the server, to stop at the end."""
    import logging

    from moto.server import ThreadedMotoServer

    # Its HTTP server (werkzeug) logs every request to stderr unless told otherwise: the
    # run's output is the example's own lines.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://{host}:{port}"
    for name, value in [
        ("AWS_ACCESS_KEY_ID", "local"),
        ("AWS_SECRET_ACCESS_KEY", "local"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ]:
        os.environ.setdefault(name, value)
    return server


if __name__ == "__main__":
    server = None if os.environ.get("DYNAMODB_ENDPOINT_URL") else local_dynamodb()
    store.create_table()  # once, at deploy time (or `idempotency-middleware create-table`)
    key = {"IdempotencyKey": {"stringValue": "signup-42", "dataType": "String"}}

    def record(message_id: str, body: str, attributes: dict[str, Any]) -> dict[str, Any]:
        """An SQS record as Lambda delivers it, on its first delivery."""
        return {
            "messageId": message_id,
            "body": body,
            "messageAttributes": attributes,
            "attributes": {"ApproximateReceiveCount": "1"},
            "eventSource": "aws:sqs",
        }

    records = [  # two sends of one signup (a producer retry), and a malformed message
        record("m-1", '{"email": "ada@example.com"}', key),
        record("m-2", '{"email": "ada@example.com"}', key),
        record("m-3", "not json", {}),
    ]
    print(handler({"Records": records}, None))  # m-3 failed; one email sent
    print(handler({"Records": records}, None))  # Lambda's retry: m-3 again, no new email
    print(sent_emails)
    store.close()
    if server is not None:
        server.stop()
