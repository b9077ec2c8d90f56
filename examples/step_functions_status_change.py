"""The Lambda function behind an EventBridge rule on "Step Functions Execution Status
Change": an execution that failed outside its ``Catch``, timed out or was aborted runs no
state that could finish its deferred key, so this function releases the key with the
deferral token in the execution's input. A retry of the request then runs its handler
again (and starts a new execution) instead of getting the 202 replayed until the key
expires.

The rule sends this state machine's FAILED, TIMED_OUT and ABORTED events here (the
Long-running work page gives it in CloudFormation and Terraform, and the function's IAM).
The store and client are built once per container, at import, from the function's
environment: IDEMPOTENCY_TABLE, and DYNAMODB_ENDPOINT_URL for a local DynamoDB.

    python -m examples.step_functions_status_change     (a local run, on moto)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import boto3

from idempotency_middleware import DynamoDBStore
from idempotency_middleware.step_functions import handle_execution_status_change

store = DynamoDBStore(
    os.environ.get("IDEMPOTENCY_TABLE", "idempotency"),
    endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL"),  # unset in Lambda: the real one
)
# Reads the input of an execution whose event left it out (too large for an event). Lambda
# sets AWS_REGION; the default is for the local run.
stepfunctions = boto3.client("stepfunctions", region_name=os.environ.get("AWS_REGION", "us-east-1"))


def handler(event: dict[str, Any], context: Any) -> dict[str, str]:
    outcome = handle_execution_status_change(event, store=store, stepfunctions=stepfunctions)
    # "released": retries run again; "stale": the key had moved on (a repeated event, a key
    # completed, taken over or expired); "ignored": not one of this package's executions.
    detail = event["detail"]
    print(json.dumps({"execution": detail["executionArn"], "outcome": outcome}))
    return {"outcome": outcome}


def status_change(status: str, execution_input: dict[str, Any]) -> dict[str, Any]:
    """A "Step Functions Execution Status Change" event as EventBridge delivers it."""
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:jobs"
    execution = "arn:aws:states:us-east-1:123456789012:execution:jobs:job-1-0"
    now = int(time.time() * 1000)
    return {
        "version": "0",
        "id": "315c1398-40ff-a850-213b-158f73e60175",
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": "123456789012",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": "us-east-1",
        "resources": [execution],
        "detail": {
            "executionArn": execution,
            "stateMachineArn": machine,
            "name": "job-1-0",
            "status": status,
            "startDate": now - 60_000,
            "stopDate": now,
            "input": json.dumps(execution_input),
            "inputDetails": {"included": True},
            "output": None,
            "outputDetails": None,
        },
    }


def local_dynamodb() -> Any:
    """moto's DynamoDB on 127.0.0.1 for the run; the server, to stop at the end."""
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
    from flask import Flask

    from idempotency_middleware import IdempotencyWSGIMiddleware, defer_completion

    server = None if os.environ.get("DYNAMODB_ENDPOINT_URL") else local_dynamodb()
    store.create_table()
    # The API that handed a job to the workflow (start_execution() in production): its 202
    # is the key's interim response, its token in the execution's input.
    tokens: list[str] = []
    api = Flask(__name__)

    @api.post("/jobs")
    def submit() -> tuple[dict[str, str], int]:
        tokens.append(defer_completion())
        return {"job": str(len(tokens)), "state": "accepted"}, 202

    api.wsgi_app = IdempotencyWSGIMiddleware(api.wsgi_app, store=store)  # type: ignore[method-assign]
    client = api.test_client()
    headers = {"Idempotency-Key": "job-1"}
    print(client.post("/jobs", headers=headers).json)  # job 1, accepted
    print(client.post("/jobs", headers=headers).json)  # job 1 again: the 202 replayed
    # The execution was aborted: EventBridge delivers its status change.
    event = status_change("ABORTED", {"idempotency_token": tokens[0], "job": 1})
    print(handler(event, None))  # released
    print(handler(event, None))  # stale: a repeated event changes nothing
    print(client.post("/jobs", headers=headers).json)  # job 2: the retry ran again
    store.close()
    if server is not None:
        server.stop()
