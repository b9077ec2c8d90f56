"""``start_execution`` and ``handle_execution_status_change``: what they refuse, what they
ignore, and the cases the end-to-end tests (tests/e2e/test_step_functions_failures.py,
tests/e2e/test_step_functions_orphans.py) do not reach. On moto's Step Functions (a state
machine that only waits, so no task reaches a table), with a ``MemoryStore`` behind the
real ASGI middleware (FastAPI's TestClient).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from examples.step_functions_status_change import status_change
from idempotency_middleware import IdempotencyMiddleware, MemoryStore
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.handler.deferred import hand_deferral_to, new_token
from idempotency_middleware.step_functions import (
    TOKEN_FIELD,
    ExecutionConflictError,
    StartedExecution,
    handle_execution_status_change,
    start_execution,
)
from idempotency_middleware.stores.protocol import ClaimRequest, Completion
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.workflows import executions
from idempotency_middleware.workflows.executions import execution_arn
from tests.conftest import REGION
from tests.support.step_functions import ROLE_ARN, sfn_endpoint
from tests.support.step_functions_apps import KEY_HEADER, PATH, key_hash, name_of

__all__ = ["sfn_endpoint"]  # a fixture, imported for these tests

WAITING = {"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "End": True}}}
JOB = {"job_id": "j-1", "order": 7}


@pytest.fixture
def sfn(sfn_endpoint: str) -> Iterator[Any]:
    client = boto3.client("stepfunctions", endpoint_url=sfn_endpoint, region_name=REGION)
    yield client
    client.close()


@pytest.fixture
def machine(sfn: Any) -> Iterator[str]:
    """A state machine whose executions wait an hour; stopped after the test."""
    arn: str = sfn.create_state_machine(
        name=f"waits-{uuid.uuid4().hex[:12]}", definition=json.dumps(WAITING), roleArn=ROLE_ARN
    )["stateMachineArn"]
    yield arn
    for running in sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING")["executions"]:
        sfn.stop_execution(executionArn=running["executionArn"])


class Request:
    """One covered request whose handler does ``action``: what it returned or raised, the
    answer, and the store."""

    def __init__(self, action: Callable[[], Any], key: str = "k-1") -> None:
        self.store = MemoryStore()
        self.outcome: list[Any] = []
        app = FastAPI()

        @app.post(PATH)
        def submit() -> dict[str, str]:
            try:
                self.outcome.append(action())
            except Exception as error:
                self.outcome.append(error)
                raise
            return {"state": "accepted"}

        wrapped = IdempotencyMiddleware(app, store=self.store)
        with TestClient(wrapped, raise_server_exceptions=False) as client:
            self.answer = client.post(PATH, json=JOB, headers={KEY_HEADER: key})
        self.key = key

    @property
    def result(self) -> Any:
        [result] = self.outcome
        return result

    def record(self) -> Any:
        return self.store.get(key_hash(self.key))


def start(sfn: Any, machine: str, job: Any = JOB) -> Callable[[], StartedExecution]:
    return lambda: start_execution(sfn, machine, job)


# --- start_execution ---------------------------------------------------------------------


def test_start_execution_outside_a_request_is_a_lookup_error(sfn: Any, machine: str) -> None:
    with pytest.raises(LookupError, match="defer_completion"):
        start_execution(sfn, machine, JOB)
    assert sfn.list_executions(stateMachineArn=machine)["executions"] == []


def test_an_execution_is_named_from_the_key_and_carries_the_deferral_token(
    sfn: Any, machine: str
) -> None:
    request = Request(start(sfn, machine))

    started = request.result
    assert started == StartedExecution(
        execution_arn(machine, name_of("k-1", 0)), name_of("k-1", 0), started.token, False
    )
    assert started.name == f"{key_hash('k-1')}-0" and len(started.name) <= 80
    execution_input = json.loads(
        sfn.describe_execution(executionArn=started.execution_arn)["input"]
    )
    assert execution_input == {**JOB, TOKEN_FIELD: started.token}
    record = request.record()
    assert (request.answer.status_code, record.status) == (200, Status.DEFERRED)
    assert started.token.split(".")[1] == record.owner


BAD_INPUTS = [
    pytest.param([1, 2], TypeError, id="a list"),
    pytest.param("job", TypeError, id="a string"),
    pytest.param({"when": {1, 2}}, TypeError, id="not JSON"),
    pytest.param({TOKEN_FIELD: "mine"}, ValueError, id="with a token"),
]


@pytest.mark.parametrize(("job", "error"), BAD_INPUTS)
def test_an_input_that_is_not_a_json_object_without_a_token_is_refused_before_deferring(
    sfn: Any, machine: str, job: Any, error: type[Exception]
) -> None:
    request = Request(start(sfn, machine, job))

    assert isinstance(request.result, error)
    assert request.answer.status_code == 500
    assert request.record() is None  # nothing deferred, the key released
    assert sfn.list_executions(stateMachineArn=machine)["executions"] == []


def test_an_arn_of_something_other_than_a_state_machine_is_a_value_error(sfn: Any) -> None:
    activity = "arn:aws:states:us-east-1:123456789012:activity:jobs"

    request = Request(start(sfn, activity))

    assert isinstance(request.result, ValueError)
    assert "state machine ARN" in str(request.result)
    assert request.record() is None


def test_a_second_start_in_the_same_request_gets_the_same_execution(sfn: Any, machine: str) -> None:
    request = Request(
        lambda: (start_execution(sfn, machine, JOB), start_execution(sfn, machine, JOB))
    )

    first, second = request.result
    assert first == second
    assert len(sfn.list_executions(stateMachineArn=machine)["executions"]) == 1


def test_a_second_start_in_the_same_request_with_another_input_is_a_conflict(
    sfn: Any, machine: str
) -> None:
    other = {**JOB, "order": 8}
    request = Request(
        lambda: (start_execution(sfn, machine, JOB), start_execution(sfn, machine, other))
    )

    assert isinstance(request.result, ExecutionConflictError)
    assert len(sfn.list_executions(stateMachineArn=machine)["executions"]) == 1


def test_a_second_start_after_the_first_execution_ended_gets_that_execution(
    sfn: Any, machine: str
) -> None:
    def start_stop_start() -> tuple[StartedExecution, StartedExecution]:
        first = start_execution(sfn, machine, JOB)
        sfn.stop_execution(executionArn=first.execution_arn)
        return first, start_execution(sfn, machine, JOB)

    first, second = Request(start_stop_start).result

    assert first == second
    assert len(sfn.list_executions(stateMachineArn=machine)["executions"]) == 1


def test_a_running_execution_of_the_key_without_a_deferral_is_a_conflict(
    sfn: Any, machine: str
) -> None:
    for number, execution_input in enumerate(["[1]", json.dumps(JOB)]):
        sfn.start_execution(
            stateMachineArn=machine, name=name_of(f"k-{number}", 0), input=execution_input
        )

        request = Request(start(sfn, machine), key=f"k-{number}")

        assert isinstance(request.result, ExecutionConflictError)
        assert request.record() is None


def test_handing_the_deferral_to_a_token_of_another_key_is_a_value_error() -> None:
    other = new_token(key_hash("another key"), new_owner(), time.time() + 60)

    request = Request(lambda: hand_deferral_to(other))

    assert isinstance(request.result, ValueError)
    assert "another key" in str(request.result)
    assert request.record() is None


def test_any_other_client_error_fails_the_request_and_releases_its_key(sfn: Any) -> None:
    missing = "arn:aws:states:us-east-1:123456789012:stateMachine:no-such-machine"

    request = Request(start(sfn, missing))

    assert type(request.result).__name__ == "StateMachineDoesNotExist"
    assert request.answer.status_code == 500
    assert request.record() is None


def test_a_running_execution_of_an_expired_deferral_of_the_key_is_a_conflict(
    sfn: Any, machine: str
) -> None:
    # The key's earlier life ended (expired) while its execution still runs.
    expired = new_token(key_hash("k-1"), new_owner(), time.time() - 60)
    sfn.start_execution(
        stateMachineArn=machine,
        name=name_of("k-1", 0),
        input=json.dumps({**JOB, TOKEN_FIELD: expired}),
    )

    request = Request(start(sfn, machine))

    assert isinstance(request.result, ExecutionConflictError)
    assert "expired" in str(request.result)
    assert request.record() is None


def test_an_ended_execution_moves_the_name_on_and_too_many_is_a_conflict(
    sfn: Any, machine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for number in (0, 1):
        ended = sfn.start_execution(
            stateMachineArn=machine, name=name_of("k-1", number), input=json.dumps(JOB)
        )["executionArn"]
        sfn.stop_execution(executionArn=ended)
    third = Request(start(sfn, machine)).result
    assert third.name == name_of("k-1", 2)
    sfn.stop_execution(executionArn=third.execution_arn)
    monkeypatch.setattr(executions, "MAX_EXECUTIONS", 3)

    request = Request(start(sfn, machine))

    assert isinstance(request.result, ExecutionConflictError)
    assert "3 executions" in str(request.result)
    assert request.record() is None


# --- handle_execution_status_change ---------------------------------------------------------


def deferred_key(store: MemoryStore) -> str:
    """A key deferred in ``store``, as a request that started an execution leaves it; the
    token its execution carries."""
    now = time.time()
    claim = ClaimRequest(key_hash(uuid.uuid4().hex), "fp", new_owner(), now, 30.0)
    store.claim(claim)
    interim = StoredResponse(202, [], b"accepted")
    assert store.complete(
        Completion(claim.key_hash, claim.owner, now, 3600.0, interim, deferred=True)
    )
    return new_token(claim.key_hash, claim.owner, now + 3600.0)


def event_of(status: str, execution_input: object) -> dict[str, Any]:
    event = status_change(status, {})
    event["detail"]["input"] = execution_input
    return event


@pytest.mark.parametrize("status", ["RUNNING", "SUCCEEDED", "PENDING_REDRIVE"])
def test_a_status_that_does_not_leave_the_key_unfinished_is_ignored(status: str) -> None:
    store = MemoryStore()
    token = deferred_key(store)
    before = store.get(token[:64])

    outcome = handle_execution_status_change(
        event_of(status, json.dumps({TOKEN_FIELD: token})), store=store
    )

    assert outcome == "ignored"
    assert store.get(token[:64]) == before


@pytest.mark.parametrize(
    "execution_input", ["{}", '{"job": 1}', "[1]", '"text"', "not json", None, 7]
)
def test_an_input_without_a_token_is_ignored(execution_input: object) -> None:
    event = event_of("FAILED", execution_input)
    if execution_input is None:
        del event["detail"]["inputDetails"]  # no input, and no sign that it was left out

    assert handle_execution_status_change(event, store=MemoryStore()) == "ignored"


def test_a_malformed_token_is_a_value_error() -> None:
    event = event_of("FAILED", json.dumps({TOKEN_FIELD: "not-a-token"}))
    with pytest.raises(ValueError, match="token"):
        handle_execution_status_change(event, store=MemoryStore())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"detail-type": "Step Functions State Machine Status Change"}, id="kind"),
        pytest.param({"source": "aws.lambda"}, id="source"),
        pytest.param({"detail": None}, id="no detail"),
    ],
)
def test_an_event_of_another_kind_is_a_value_error(change: dict[str, Any]) -> None:
    event = {**event_of("FAILED", "{}"), **change}
    with pytest.raises(ValueError, match="event"):
        handle_execution_status_change(event, store=MemoryStore())


def test_an_event_that_is_not_a_mapping_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="event"):
        handle_execution_status_change("FAILED", store=MemoryStore())  # type: ignore[arg-type]


def test_a_store_without_deferral_operations_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="release_deferred"):
        handle_execution_status_change(event_of("FAILED", "{}"), store=object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        pytest.param((504, []), TypeError, id="two parts"),
        pytest.param([504, [], b""], TypeError, id="a list"),
        pytest.param((99, [], b""), ValueError, id="not a status"),
        pytest.param((504, [("a", "b")], b""), TypeError, id="str headers"),
    ],
)
def test_a_malformed_failure_response_is_refused_and_changes_nothing(
    failure: Any, error: type[Exception]
) -> None:
    store = MemoryStore()
    token = deferred_key(store)
    before = store.get(token[:64])

    with pytest.raises(error):
        handle_execution_status_change(
            event_of("TIMED_OUT", json.dumps({TOKEN_FIELD: token})), store=store, failure=failure
        )

    assert store.get(token[:64]) == before


def test_an_input_the_event_leaves_out_is_read_from_the_execution(sfn: Any, machine: str) -> None:
    store = MemoryStore()
    token = deferred_key(store)
    started = sfn.start_execution(
        stateMachineArn=machine, name="large", input=json.dumps({TOKEN_FIELD: token, "big": "…"})
    )
    sfn.stop_execution(executionArn=started["executionArn"])
    event = event_of("ABORTED", None)
    event["detail"]["inputDetails"] = {"included": False}
    event["detail"]["executionArn"] = started["executionArn"]

    with pytest.raises(ValueError, match="stepfunctions="):
        handle_execution_status_change(event, store=store)
    assert handle_execution_status_change(event, store=store, stepfunctions=sfn) == "released"
    assert store.get(token[:64]) is None


def test_a_key_is_released_or_completed_with_the_failure_response() -> None:
    store = MemoryStore()
    released, completed = deferred_key(store), deferred_key(store)
    failure = (502, [(b"content-type", b"text/plain")], b"the work failed")

    assert (
        handle_execution_status_change(
            event_of("FAILED", json.dumps({TOKEN_FIELD: released})), store=store
        )
        == "released"
    )
    assert (
        handle_execution_status_change(
            event_of("FAILED", json.dumps({TOKEN_FIELD: completed})), store=store, failure=failure
        )
        == "completed"
    )

    assert store.get(released[:64]) is None
    record = store.get(completed[:64])
    assert record is not None
    assert (record.status, record.response) == (
        Status.COMPLETED,
        StoredResponse(502, [(b"content-type", b"text/plain")], b"the work failed"),
    )
