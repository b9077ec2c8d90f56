"""Step Functions end to end when the work does not finish: a workflow that fails, times out
or is aborted, on moto's Step Functions (running the examples' Amazon States Language, see
tests/support/step_functions.py) and DynamoDB servers, with the real API
(tests/support/step_functions_apps.py:
FastAPI with ``astart_execution``, Flask with ``start_execution``) and a retrying client whose
answer is checked after every step.

- A failure inside the work is caught by the example's ``Catch``: it releases the key
  (examples/step_functions_complete.asl.json), so the retry runs again and starts the next
  execution, or stores a failure response (examples/step_functions_failure_response.asl.json)
  that retries get.
- A time-out or an abort runs no state: until its status change is handled, retries get the
  202. The event, made in the shape AWS documents, goes through EventBridge on moto with the
  DynamoDB page's rule to an SQS queue, and from there to the example Lambda function
  (examples/step_functions_status_change.py), or to ``handle_execution_status_change`` with
  a failure response. A repeated event, and an event whose key moved on, change nothing.

The timed-out workflow has ``TimeoutSeconds: 1``, the shortest Step Functions accepts: moto's
interpreter times an execution out with a real timer (a thread join), so that test waits
about a second for the server; nothing in it sleeps to cross a deadline of the package's.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from examples import step_functions_status_change as example
from idempotency_middleware import DynamoDBStore
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.handler.deferred import new_token
from idempotency_middleware.step_functions import TOKEN_FIELD, UNFINISHED
from idempotency_middleware.stores.protocol import ClaimRequest, Completion
from idempotency_middleware.stores.records import StoredResponse
from tests.conftest import REGION
from tests.support.step_functions import (
    DEFINITION_FILE,
    FAILURE_RESPONSE_FILE,
    ExecutionFailed,
    dynamodb_tasks_on,
    run_state_machine,
    sfn_endpoint,
    with_table,
)
from tests.support.step_functions_apps import (
    JobsAPI,
    api_flavour,
    assert_accepted,
    assert_final,
    jobs_api,
    key_hash,
    name_of,
    new_job,
)
from tests.support.step_functions_harness import (
    ROOT,
    WORK_CAUSE,
    WORK_ERROR,
    EventBus,
    Workflows,
    rule_pattern,
    status_change_event,
)

__all__ = ["api_flavour", "sfn_endpoint"]  # fixtures, imported for these tests

SHIPPED = "shipped"
# What the failure-response example stores when the work fails.
WORK_FAILED = {
    "type": "about:blank",
    "title": "The work failed",
    "status": 500,
    "error": WORK_ERROR,
}
TIMED_OUT = (
    504,
    [(b"content-type", b"application/problem+json")],
    b'{"title":"The work timed out","status":504}',
)


@pytest.fixture
def workflows(sfn_endpoint: str, moto_endpoint: str, dynamodb_table: str) -> Iterator[Workflows]:
    port = urlsplit(moto_endpoint).port
    assert port is not None
    with dynamodb_tasks_on(port):
        workflows = Workflows(sfn_endpoint, moto_endpoint, dynamodb_table)
        try:
            yield workflows
        finally:
            workflows.close()


@pytest.fixture
def api(
    api_flavour: str, sfn_endpoint: str, moto_endpoint: str, dynamodb_table: str
) -> Iterator[JobsAPI]:
    with jobs_api(api_flavour, sfn_endpoint, moto_endpoint, dynamodb_table) as served:
        yield served


@pytest.fixture
def lambda_function(
    monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, dynamodb_table: str, workflows: Workflows
) -> Iterator[Any]:
    """The example Lambda function, its store on the test's table."""
    store = DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION)
    monkeypatch.setattr(example, "store", store)
    monkeypatch.setattr(example, "stepfunctions", workflows.sfn)
    yield example.handler
    store.close()


def shipped(job: dict[str, Any]) -> dict[str, Any]:
    """The final response's body once the job's work shipped it."""
    return {"job_id": job["job_id"], "state": SHIPPED}


# --- a failure the workflow catches ------------------------------------------------------


def test_a_failed_work_releases_its_key_and_the_retry_starts_the_next_execution(
    api: JobsAPI, workflows: Workflows
) -> None:
    api.jobs.machine = machine = workflows.machine()
    key, job = "job-failing", new_job()

    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=False)
    workflows.wait_for_runs(job["job_id"], 1)
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=True)

    workflows.open_gate(job["job_id"], "fail")
    first = workflows.wait_for_end(workflows.arn_of(machine, name_of(key, 0)))

    # The execution still fails, with the work's own error; its Catch released the key.
    assert (first["status"], first["error"], first["cause"]) == ("FAILED", WORK_ERROR, WORK_CAUSE)
    assert api.store.get(key_hash(key)) is None
    workflows.close_gate(job["job_id"])
    assert_accepted(api.post(key, job), key, run=2, execution=1, replayed=False)
    workflows.wait_for_runs(job["job_id"], 2)
    assert_accepted(api.post(key, job), key, run=2, execution=1, replayed=True)

    workflows.open_gate(job["job_id"], "ship")
    second = workflows.wait_for_end(workflows.arn_of(machine, name_of(key, 1)))

    assert second["status"] == "SUCCEEDED"
    assert_final(api.post(key, job), 200, shipped(job))
    assert workflows.executions(machine) == [name_of(key, 0), name_of(key, 1)]
    assert (api.jobs.runs, workflows.runs(job["job_id"])) == (2, 2)


def test_a_failed_work_stores_the_failure_response_that_retries_then_get(
    api: JobsAPI, workflows: Workflows
) -> None:
    api.jobs.machine = machine = workflows.machine(FAILURE_RESPONSE_FILE)
    key, job = "job-failing-answered", new_job()
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=False)
    workflows.wait_for_runs(job["job_id"], 1)
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=True)

    workflows.open_gate(job["job_id"], "fail")
    ended = workflows.wait_for_end(workflows.arn_of(machine, name_of(key, 0)))

    assert (ended["status"], ended["error"]) == ("FAILED", WORK_ERROR)
    for _ in range(2):
        answer = api.post(key, job)
        assert_final(answer, 500, WORK_FAILED)
        assert answer.headers["content-type"] == "application/problem+json"
    assert (api.jobs.runs, workflows.runs(job["job_id"])) == (1, 1)
    assert workflows.executions(machine) == [name_of(key, 0)]


# --- an end no state sees: aborted, timed out ---------------------------------------------


def test_an_aborted_workflow_keeps_its_202_until_its_status_change_releases_the_key(
    api: JobsAPI, workflows: Workflows, moto_endpoint: str, lambda_function: Any
) -> None:
    api.jobs.machine = machine = workflows.machine()
    bus = EventBus(moto_endpoint, machine)
    key, job = "job-aborted", new_job()
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=False)
    workflows.wait_for_runs(job["job_id"], 1)
    arn = workflows.arn_of(machine, name_of(key, 0))

    workflows.sfn.stop_execution(executionArn=arn, error="Operator", cause="stopped by hand")
    assert workflows.wait_for_end(arn)["status"] == "ABORTED"

    # No state ran: the key is still deferred, and retries get the 202.
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=True)
    [delivered] = bus.deliver(status_change_event(workflows, arn))
    assert delivered["detail"]["status"] == "ABORTED"
    assert lambda_function(delivered, None) == {"outcome": "released"}
    assert_accepted(api.post(key, job), key, run=2, execution=1, replayed=False)
    assert_accepted(api.post(key, job), key, run=2, execution=1, replayed=True)
    bus.close()


def test_a_timed_out_workflow_gets_the_failure_response_its_status_change_stores(
    api: JobsAPI, workflows: Workflows, moto_endpoint: str
) -> None:
    from idempotency_middleware.step_functions import handle_execution_status_change

    api.jobs.machine = machine = workflows.machine(timeout=1)
    bus = EventBus(moto_endpoint, machine)
    key, job = "job-timed-out", new_job()
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=False)
    arn = workflows.arn_of(machine, name_of(key, 0))

    assert workflows.wait_for_end(arn)["status"] == "TIMED_OUT"  # moto's 1 s timer

    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=True)
    [delivered] = bus.deliver(status_change_event(workflows, arn))
    outcome = handle_execution_status_change(delivered, store=api.store, failure=TIMED_OUT)
    assert outcome == "completed"
    for _ in range(2):
        answer = api.post(key, job)
        assert_final(answer, 504, {"title": "The work timed out", "status": 504})
    assert (api.jobs.runs, workflows.executions(machine)) == (1, [name_of(key, 0)])
    bus.close()


# --- events that change nothing ------------------------------------------------------------


def test_a_repeated_status_change_changes_nothing_even_once_the_key_moved_on(
    api: JobsAPI, workflows: Workflows, moto_endpoint: str, lambda_function: Any
) -> None:
    api.jobs.machine = machine = workflows.machine()
    bus = EventBus(moto_endpoint, machine)
    key, job = "job-repeated-event", new_job()
    api.post(key, job)
    workflows.wait_for_runs(job["job_id"], 1)
    arn = workflows.arn_of(machine, name_of(key, 0))
    workflows.sfn.stop_execution(executionArn=arn)
    workflows.wait_for_end(arn)
    [event] = bus.deliver(status_change_event(workflows, arn))
    assert lambda_function(event, None) == {"outcome": "released"}

    # Delivered again (EventBridge delivers at least once): the key is gone.
    assert lambda_function(event, None) == {"outcome": "stale"}
    assert api.store.get(key_hash(key)) is None
    # And again once a retry deferred the key anew: it is another owner's.
    assert_accepted(api.post(key, job), key, run=2, execution=1, replayed=False)
    before = api.store.get(key_hash(key))
    assert lambda_function(event, None) == {"outcome": "stale"}
    assert api.store.get(key_hash(key)) == before
    assert_accepted(api.post(key, job), key, run=2, execution=1, replayed=True)
    bus.close()


def test_the_rule_delivers_only_the_statuses_that_leave_a_key_unfinished(
    api: JobsAPI, workflows: Workflows, moto_endpoint: str
) -> None:
    api.jobs.machine = machine = workflows.machine()
    bus = EventBus(moto_endpoint, machine)
    key, job = "job-shipped", new_job()
    api.post(key, job)
    workflows.wait_for_runs(job["job_id"], 1)
    arn = workflows.arn_of(machine, name_of(key, 0))
    running = status_change_event(workflows, arn)
    workflows.open_gate(job["job_id"], "ship")
    assert workflows.wait_for_end(arn)["status"] == "SUCCEEDED"
    succeeded = status_change_event(workflows, arn)

    assert bus.deliver(running) == []
    assert bus.deliver(succeeded) == []
    for status in ("FAILED", "TIMED_OUT", "ABORTED"):
        [delivered] = bus.deliver(with_detail(succeeded, status=status))
        assert delivered["detail"]["status"] == status
    elsewhere = with_detail(succeeded, status="FAILED", stateMachineArn=f"{machine}-other")
    assert bus.deliver(elsewhere) == []
    bus.close()


def with_detail(event: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**event, "detail": {**event["detail"], **changes}}


# --- the definitions' failure branch, and the rule's two templates ----------------------------


def definition_in(file: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(file.read_text())
    return document


@pytest.mark.parametrize(
    ("file", "first"),
    [(DEFINITION_FILE, "ReleaseIdempotencyKey"), (FAILURE_RESPONSE_FILE, "ShapeFailure")],
)
def test_the_work_is_one_parallel_state_whose_catch_finishes_the_key(
    file: Path, first: str
) -> None:
    definition = definition_in(file)
    work = definition["States"][definition["StartAt"]]
    assert work["Type"] == "Parallel" and len(work["Branches"]) == 1
    [catch] = work["Catch"]
    assert (catch["ErrorEquals"], catch["Next"]) == (["States.ALL"], first)
    assert catch["ResultPath"] == "$.error"  # the input, and its token, kept
    # Both end in the work's own error, whether the key was finished or had moved on.
    failed = definition["States"]["WorkFailed"]
    assert (failed["Type"], failed["ErrorPath"]) == ("Fail", "$.error.Error")


def test_the_two_definitions_differ_only_in_what_a_failure_does() -> None:
    releasing, answering = definition_in(DEFINITION_FILE), definition_in(FAILURE_RESPONSE_FILE)
    shared = {"ShapeResponse", "CompleteIdempotencyKey", "WorkFailed"}
    assert {name: releasing["States"][name] for name in shared} == {
        name: answering["States"][name] for name in shared
    }
    store = answering["States"]["StoreFailureResponse"]
    complete = releasing["States"]["CompleteIdempotencyKey"]
    assert store["Parameters"] == complete["Parameters"]
    release = releasing["States"]["ReleaseIdempotencyKey"]
    assert release["Resource"] == "arn:aws:states:::dynamodb:deleteItem"
    assert (
        release["Parameters"]["ConditionExpression"]
        == complete["Parameters"]["ConditionExpression"]
    )
    assert release["Parameters"]["Key"] == complete["Parameters"]["Key"]


def failing(table: str, file: Path = DEFINITION_FILE) -> dict[str, Any]:
    """The example on ``table`` whose work fails at once."""
    definition = with_table(definition_in(file), table)
    fail = {"Type": "Fail", "Error": WORK_ERROR, "Cause": WORK_CAUSE}
    definition["States"]["Work"]["Branches"] = [{"StartAt": "Fail", "States": {"Fail": fail}}]
    return definition


def test_the_release_is_fenced_by_the_token_owner(
    sfn_endpoint: str, moto_endpoint: str, dynamodb_table: str
) -> None:
    port = urlsplit(moto_endpoint).port
    assert port is not None
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        now = time.time()
        claim = ClaimRequest(key_hash(uuid.uuid4().hex), "fp", new_owner(), now, 30.0)
        store.claim(claim)
        interim = StoredResponse(202, [], b"accepted")
        store.complete(Completion(claim.key_hash, claim.owner, now, 3600.0, interim, deferred=True))
        before = store.get(claim.key_hash)
        stranger = new_token(claim.key_hash, new_owner(), now + 3600.0)
        mine = new_token(claim.key_hash, claim.owner, now + 3600.0)

        for token in (stranger, mine):
            with pytest.raises(ExecutionFailed) as failed:
                run_state_machine(
                    sfn_endpoint, failing(dynamodb_table), {TOKEN_FIELD: token}, dynamodb_port=port
                )
            assert (failed.value.error, failed.value.cause) == (WORK_ERROR, WORK_CAUSE)
            if token == stranger:
                assert store.get(claim.key_hash) == before  # another owner's key: kept

        assert store.get(claim.key_hash) is None


def test_the_terraform_rule_has_the_cloudformation_rule_pattern() -> None:
    pattern = rule_pattern("arn")
    terraform = (ROOT / "docs" / "snippets" / "stores-dynamodb-5.tf").read_text()
    assert f"source        = {json.dumps(pattern['source'])}" in terraform
    assert f'"detail-type" = {json.dumps(pattern["detail-type"])}' in terraform
    statuses = json.dumps(pattern["detail"]["status"])
    assert f"status          = {statuses}" in terraform
    assert "stateMachineArn = [aws_sfn_state_machine.jobs.arn]" in terraform
    assert set(pattern["detail"]["status"]) == UNFINISHED
