"""Run real Amazon States Language against a DynamoDB endpoint on 127.0.0.1.

moto ships LocalStack's ASL interpreter (``moto.stepfunctions.parser``). Its Step Functions
only *execute* a state machine when moto's user config says
``{"stepfunctions": {"execute_state_machine": true}}``; otherwise an execution "succeeds"
without running a state. ``step_functions_server()`` starts a moto server on 127.0.0.1 with
that switch on, and ``run_state_machine()`` creates a state machine there, runs one
execution to its end and returns the output, or raises ``ExecutionFailed`` with the
execution's error and cause.

Two pieces of moto state are process-wide, which is why both are scoped here:

- The switch lives in ``moto.core.config.default_user_config``, shared by every moto server
  of the process (the session's DynamoDB server of tests/conftest.py included) and read on
  every Step Functions request to pick one of two backends (the interpreter's or the static
  one). It only concerns Step Functions; nothing else in moto reads it. The server context
  puts the previous value back on exit, so no other test sees executing state machines.
- The interpreter's service tasks (``arn:aws:states:::dynamodb:updateItem``) call
  ``http://localhost:{MOTO_PORT}``, reading the environment variable at each call, from the
  execution's worker thread in this process. ``run_state_machine`` points ``MOTO_PORT`` at the
  DynamoDB endpoint under test (moto's, DynamoDB Local, or a fault proxy) for exactly one
  execution and restores it afterwards; runs are serialized because the variable is shared.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from moto.core.config import default_user_config
from moto.server import ThreadedMotoServer

from tests.support.in_process import refuse_in_an_in_process_run
from tests.support.servers import HOST

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The README's state machine, as a user copies it, and its variant that stores a failure
# response when the work fails (instead of releasing the key).
DEFINITION_FILE = EXAMPLES / "step_functions_complete.asl.json"
FAILURE_RESPONSE_FILE = EXAMPLES / "step_functions_failure_response.asl.json"
EXAMPLE_TABLE = "idempotency"

REGION = "us-east-1"
# moto checks neither the role nor its account; the ARN only has to be well-formed.
ROLE_ARN = "arn:aws:iam::123456789012:role/step-functions-test"
DEFAULT_TIMEOUT = 30.0  # seconds for one execution to end
_POLL_INTERVAL = 0.02  # seconds between describe_execution calls
_INTERPRETER = {"execute_state_machine": True}

# One execution at a time: MOTO_PORT is one variable for the whole process.
_RUN_LOCK = threading.Lock()


class ExecutionFailed(Exception):
    """An execution ended in a status other than SUCCEEDED."""

    def __init__(self, status: str, error: str | None, cause: str | None) -> None:
        super().__init__(f"execution {status}: error={error!r} cause={cause!r}")
        self.status = status
        self.error = error
        self.cause = cause


def _set_stepfunctions_config(endpoint: str, config: Mapping[str, Any]) -> None:
    """Set moto's Step Functions config through the server's own API, as with any moto server."""
    answer = httpx.post(
        f"{endpoint}/moto-api/config", json={"stepfunctions": dict(config)}, timeout=10
    )
    answer.raise_for_status()


@contextlib.contextmanager
def step_functions_server() -> Iterator[str]:
    """A moto server on 127.0.0.1 whose Step Functions run the ASL interpreter; its URL.

    On exit the server stops and moto's Step Functions config is what it was before.
    """
    # GET /moto-api/config does not report the stepfunctions section: read it in-process.
    previous = copy.deepcopy(default_user_config.get("stepfunctions", {}))
    refuse_in_an_in_process_run("A moto server")
    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        _set_stepfunctions_config(endpoint, _INTERPRETER)
        yield endpoint
    finally:
        try:
            _set_stepfunctions_config(endpoint, previous)
        finally:
            server.stop()
            # Whatever happened to the request above, the process leaves with the old value.
            default_user_config["stepfunctions"] = previous


def with_table(definition: Mapping[str, Any], table: str) -> dict[str, Any]:
    """A copy of ``definition`` whose tasks write to ``table`` instead of the example's."""
    changed: dict[str, Any] = copy.deepcopy(dict(definition))

    def tasks(states: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for state in states.values():
            yield state
            for branch in state.get("Branches", []):
                yield from tasks(branch["States"])

    for state in tasks(changed["States"]):
        parameters = state.get("Parameters", {})
        if "TableName" in parameters:
            assert parameters["TableName"] == EXAMPLE_TABLE, parameters["TableName"]
            parameters["TableName"] = table
    return changed


@contextlib.contextmanager
def dynamodb_tasks_on(port: int) -> Iterator[None]:
    """The interpreter's DynamoDB tasks go to ``http://localhost:{port}`` for the block:
    executions started in it may run on after it (stop them before it ends)."""
    with _RUN_LOCK, _moto_port(port):
        yield


@contextlib.contextmanager
def _moto_port(port: int) -> Iterator[None]:
    """``MOTO_PORT`` set to ``port`` for the block, then restored (or removed) again."""
    previous = os.environ.get("MOTO_PORT")
    os.environ["MOTO_PORT"] = str(port)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MOTO_PORT", None)
        else:
            os.environ["MOTO_PORT"] = previous


def _failure_from_history(client: Any, execution_arn: str) -> tuple[str | None, str | None]:
    """Error and cause of the last failure event, for an execution whose describe has none."""
    events = client.get_execution_history(executionArn=execution_arn)["events"]
    for event in reversed(events):
        for name, details in event.items():
            if name.endswith("EventDetails") and isinstance(details, dict) and "error" in details:
                return details.get("error"), details.get("cause")
    return None, None


def run_state_machine(
    sfn_endpoint: str,
    definition: Mapping[str, Any],
    execution_input: Mapping[str, Any],
    *,
    dynamodb_port: int,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Create ``definition`` on ``sfn_endpoint``, run it once on ``execution_input``, return
    its output.

    The execution's DynamoDB tasks go to ``http://localhost:{dynamodb_port}``. Raises
    ``ExecutionFailed`` (status, error, cause) when the execution does not succeed, and
    ``TimeoutError`` when it is still running after ``timeout`` seconds. The state machine
    is deleted afterwards.
    """
    client = boto3.client("stepfunctions", endpoint_url=sfn_endpoint, region_name=REGION)
    try:
        machine_arn = client.create_state_machine(
            name=f"sm-{uuid.uuid4().hex[:12]}",
            definition=json.dumps(definition),
            roleArn=ROLE_ARN,
        )["stateMachineArn"]
        try:
            with _RUN_LOCK, _moto_port(dynamodb_port):
                execution_arn = client.start_execution(
                    stateMachineArn=machine_arn,
                    # moto names an unnamed execution "None", so a second one would clash.
                    name=f"run-{uuid.uuid4().hex[:12]}",
                    input=json.dumps(execution_input),
                )["executionArn"]
                described = _wait_for_end(client, execution_arn, timeout)
            if described["status"] != "SUCCEEDED":
                error, cause = described.get("error"), described.get("cause")
                if error is None and cause is None:
                    error, cause = _failure_from_history(client, execution_arn)
                raise ExecutionFailed(described["status"], error, cause)
            output = json.loads(described["output"])
            if not isinstance(output, dict):
                raise TypeError(f"the execution's output is not a JSON object: {output!r}")
            return output
        finally:
            client.delete_state_machine(stateMachineArn=machine_arn)
    finally:
        client.close()


def _wait_for_end(client: Any, execution_arn: str, timeout: float) -> dict[str, Any]:
    """``describe_execution`` once the execution has left RUNNING."""
    deadline = time.monotonic() + timeout
    while True:
        described: dict[str, Any] = client.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        if time.monotonic() >= deadline:
            # Stopped, so that it enters no further state once MOTO_PORT is restored (a call
            # already under way finishes where it was going).
            client.stop_execution(executionArn=execution_arn, error="TestTimeout")
            raise TimeoutError(f"{execution_arn} still RUNNING after {timeout}s")
        time.sleep(_POLL_INTERVAL)


@pytest.fixture(scope="module")
def sfn_endpoint() -> Iterator[str]:
    """A moto Step Functions server running the ASL interpreter, for this module only."""
    with step_functions_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["moto", "dynamodb-local"])
def dynamodb_endpoint(request: pytest.FixtureRequest) -> str:
    """A DynamoDB on 127.0.0.1: moto's server, or DynamoDB Local under its script."""
    fixture = "dynamodb_local_endpoint" if request.param == "dynamodb-local" else "moto_endpoint"
    endpoint: str = request.getfixturevalue(fixture)
    return endpoint
