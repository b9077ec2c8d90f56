"""A Lambda handler for SQS batches that processes each record once, with partial failures.

Lambda hands a batch of SQS records to ``handler``; records it reports in
``batchItemFailures`` are redelivered, the others deleted (the event source mapping needs
``FunctionResponseTypes: ["ReportBatchItemFailures"]``). A redelivered or duplicate record
whose key already completed replays the stored result; one whose duplicate is still running
elsewhere (``KeyInProgressError``) is reported as failed, so SQS retries it later.

The store is built once per container, at import, from the function's environment:

    IDEMPOTENCY_TABLE=idempotency DYNAMODB_ENDPOINT_URL=http://127.0.0.1:8000 \\
        python -m examples.lambda_batch
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from idempotency_middleware import DynamoDBStore, idempotent

logger = logging.getLogger(__name__)

store = DynamoDBStore(
    os.environ.get("IDEMPOTENCY_TABLE", "idempotency"),
    endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL"),  # unset in Lambda: the real one
)

# Stands in for the side effect (an email, a charge, a row in another system).
sent_emails: list[str] = []


def record_key(record: dict[str, Any]) -> str:
    """The producer's ``IdempotencyKey`` attribute (a retried send is a new message with a
    new messageId), else the messageId (the same message delivered again)."""
    attribute = record["messageAttributes"].get("IdempotencyKey")
    return str(attribute["stringValue"]) if attribute else str(record["messageId"])


@idempotent(store=store, key=record_key, payload=lambda record: record["body"])
def send_welcome_email(record: dict[str, Any]) -> str:
    address = json.loads(record["body"])["email"]  # a malformed body raises: not kept
    sent_emails.append(address)
    return f"sent to {address}"


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures: list[dict[str, str]] = []
    for record in event["Records"]:
        try:
            send_welcome_email(record)
        except Exception:  # KeyInProgressError too: a duplicate still running elsewhere
            logger.exception("record %s failed; SQS will retry it", record["messageId"])
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}


def local_dynamodb() -> Any:
    """moto's DynamoDB on 127.0.0.1 for the run, through the AWS SDK's own variables (read
    when the store first connects); the server, to stop at the end."""
    from moto.server import ThreadedMotoServer

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
    records = [  # two sends of one signup (a producer retry), and a malformed message
        {"messageId": "m-1", "body": '{"email": "ada@example.com"}', "messageAttributes": key},
        {"messageId": "m-2", "body": '{"email": "ada@example.com"}', "messageAttributes": key},
        {"messageId": "m-3", "body": "not json", "messageAttributes": {}},
    ]
    print(handler({"Records": records}, None))  # m-3 failed; one email sent
    print(handler({"Records": records}, None))  # Lambda's retry: m-3 again, no new email
    print(sent_emails)
    store.close()
    if server is not None:
        server.stop()
