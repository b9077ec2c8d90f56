"""The README's state machine (examples/step_functions_complete.asl.json) finishes a deferred
key without a Lambda: run as real Amazon States Language by moto's ASL interpreter, its
``dynamodb:updateItem`` task writes to moto's DynamoDB and to Amazon's DynamoDB Local.

The items are made by hand in the stored format the package reads, so this proves the
definition against that format: the final response lands in ``response_json``, ``expires_at``
and ``ttl`` take the token's value, and the condition refuses a second completion, a token
of another owner and a key that no longer exists. The DynamoDB Local cases (ids
``dynamodb-local``) run under scripts/dynamodb-local.sh and are reported as skipped otherwise.
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from moto.core.config import default_user_config

from tests.conftest import REGION
from tests.support.faultproxy import FaultProxy
from tests.support.step_functions import (
    DEFINITION_FILE,
    ExecutionFailed,
    dynamodb_endpoint,
    run_state_machine,
    sfn_endpoint,
    step_functions_server,
    with_table,
)

__all__ = ["dynamodb_endpoint", "sfn_endpoint"]  # fixtures, imported for these tests

TASK = "CompleteIdempotencyKey"
OWNER = "0123456789abcdef01234567-1f"
OTHER_OWNER = "fedcba9876543210fedcba98-2a"
DEFERRED_AT = 1_700_000_000
EXPIRES_AT = 1_700_086_400  # the deferral's expiry, carried by the token
CONDITION_FAILED = "DynamoDB.ConditionalCheckFailedException"
# The interim answer stored with a deferred key: the 202 its request got.
INTERIM = {"status": 202, "headers": [["content-type", "application/json"]], "json": {"id": 7}}
RESULT: dict[str, Any] = {"order": 7, "state": "shipped", "note": "café ☕", "lines": [1, 2.5]}


@pytest.fixture
def dynamodb(dynamodb_endpoint: str) -> Iterator[Any]:
    client = boto3.client("dynamodb", endpoint_url=dynamodb_endpoint, region_name=REGION)
    yield client
    client.close()


@pytest.fixture
def table(dynamodb: Any) -> str:
    """A fresh table keyed by ``pk`` (a string), as the package's ``create_table`` makes it."""
    name = f"sfn-{uuid.uuid4().hex[:12]}"
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
    )
    return name


def load_definition(table: str) -> dict[str, Any]:
    """The example definition as the README shows it, with only its table name replaced."""
    return with_table(json.loads(DEFINITION_FILE.read_text()), table)


def deferral_token(pk: str, owner: str = OWNER, expires_at: int = EXPIRES_AT) -> str:
    return f"{pk}.{owner}.{expires_at}"


def new_pk() -> str:
    """A key hash as the package stores it: 64 hex characters."""
    return uuid.uuid4().hex + uuid.uuid4().hex


def put_deferred(dynamodb: Any, table: str, pk: str) -> dict[str, Any]:
    """A deferred key in the stored format, with its interim 202; the item as written."""
    item = {
        "pk": {"S": pk},
        "status": {"S": "deferred"},
        "owner": {"S": OWNER},
        "fingerprint": {"S": "f" * 64},
        "expires_at": {"N": str(DEFERRED_AT + 3600)},
        "ttl": {"N": str(DEFERRED_AT + 3600)},
        "lock_expires_at": {"N": str(DEFERRED_AT + 30)},
        "response_json": {"S": json.dumps(INTERIM)},
    }
    dynamodb.put_item(TableName=table, Item=item)
    return item


def get_item(dynamodb: Any, table: str, pk: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = dynamodb.get_item(
        TableName=table, Key={"pk": {"S": pk}}, ConsistentRead=True
    ).get("Item")
    return item


def complete(
    sfn_endpoint: str, dynamodb_endpoint: str, table: str, token: str, result: object = RESULT
) -> dict[str, Any]:
    """Run the example definition for ``token``; the execution's output."""
    port = urlsplit(dynamodb_endpoint).port
    assert port is not None
    return run_state_machine(
        sfn_endpoint,
        load_definition(table),
        {"idempotency_token": token, "result": result},
        dynamodb_port=port,
    )


def test_the_definition_is_json_with_a_dynamodb_update_item_task() -> None:
    definition = json.loads(DEFINITION_FILE.read_text())
    assert definition["StartAt"] == "Work"
    assert definition["States"]["Work"]["Next"] == "ShapeResponse"
    shape = definition["States"]["ShapeResponse"]
    assert (shape["Type"], shape["Next"]) == ("Pass", TASK)
    task = definition["States"][TASK]
    assert task["Type"] == "Task"
    assert task["Resource"] == "arn:aws:states:::dynamodb:updateItem"
    assert task["Parameters"]["TableName"] == "idempotency"
    assert task["ResultPath"] is None
    assert task["End"] is True
    # A refused condition is final: retrying it could never succeed.
    retried = {name for retrier in task["Retry"] for name in retrier["ErrorEquals"]}
    assert CONDITION_FAILED not in retried
    assert not retried & {"States.ALL", "States.TaskFailed"}


def test_the_server_runs_the_interpreter_and_then_restores_moto_config() -> None:
    # Process-wide moto state: the session's DynamoDB server shares it.
    before = copy.deepcopy(default_user_config["stepfunctions"])
    with step_functions_server():
        assert default_user_config["stepfunctions"] == {"execute_state_machine": True}
    assert default_user_config["stepfunctions"] == before


def test_the_task_completes_a_deferred_key(
    sfn_endpoint: str, dynamodb_endpoint: str, dynamodb: Any, table: str
) -> None:
    pk = new_pk()
    before = put_deferred(dynamodb, table, pk)
    moto_port = os.environ.get("MOTO_PORT")

    output = complete(sfn_endpoint, dynamodb_endpoint, table, deferral_token(pk))

    assert os.environ.get("MOTO_PORT") == moto_port  # pointed at DynamoDB for the run only
    expected = {"status": 200, "headers": {"content-type": "application/json"}, "json": RESULT}
    assert output["response"] == expected  # ResultPath null: the input passes through
    item = get_item(dynamodb, table, pk)
    assert item is not None
    assert item["status"] == {"S": "completed"}
    assert json.loads(item["response_json"]["S"]) == expected
    assert item["expires_at"] == {"N": str(EXPIRES_AT)}
    assert item["ttl"] == {"N": str(EXPIRES_AT)}
    # Nothing else moved: same owner, fingerprint and lease, no attribute added.
    untouched = {"pk", "owner", "fingerprint", "lock_expires_at"}
    assert {name: item[name] for name in untouched} == {name: before[name] for name in untouched}
    assert set(item) == set(before)


def test_a_second_completion_fails_the_execution_and_keeps_the_first_response(
    sfn_endpoint: str, dynamodb_endpoint: str, dynamodb: Any, table: str
) -> None:
    pk = new_pk()
    put_deferred(dynamodb, table, pk)
    complete(sfn_endpoint, dynamodb_endpoint, table, deferral_token(pk))
    first = get_item(dynamodb, table, pk)

    with pytest.raises(ExecutionFailed) as failed:
        complete(
            sfn_endpoint,
            dynamodb_endpoint,
            table,
            deferral_token(pk, expires_at=EXPIRES_AT + 60),
            result={"order": 7, "state": "cancelled"},
        )

    assert (failed.value.status, failed.value.error) == ("FAILED", CONDITION_FAILED)
    assert "conditional request failed" in (failed.value.cause or "")
    assert get_item(dynamodb, table, pk) == first


def test_a_token_of_another_owner_fails_and_leaves_the_key_unchanged(
    sfn_endpoint: str, dynamodb_endpoint: str, dynamodb: Any, table: str
) -> None:
    pk = new_pk()
    before = put_deferred(dynamodb, table, pk)

    with pytest.raises(ExecutionFailed) as failed:
        complete(sfn_endpoint, dynamodb_endpoint, table, deferral_token(pk, owner=OTHER_OWNER))

    assert (failed.value.status, failed.value.error) == ("FAILED", CONDITION_FAILED)
    assert get_item(dynamodb, table, pk) == before


def test_a_token_for_a_key_that_is_gone_creates_nothing(
    sfn_endpoint: str, dynamodb_endpoint: str, dynamodb: Any, table: str
) -> None:
    # The key expired (TTL deleted it) or was deleted before the workflow finished.
    pk = new_pk()

    with pytest.raises(ExecutionFailed) as failed:
        complete(sfn_endpoint, dynamodb_endpoint, table, deferral_token(pk))

    assert failed.value.error == CONDITION_FAILED
    assert get_item(dynamodb, table, pk) is None


def test_a_throttled_update_is_retried(
    sfn_endpoint: str, dynamodb_endpoint: str, dynamodb: Any, table: str
) -> None:
    pk = new_pk()
    put_deferred(dynamodb, table, pk)

    with FaultProxy(dynamodb_endpoint) as proxy:
        proxy.set("throttle", operations={"UpdateItem"}, count=1)
        complete(sfn_endpoint, proxy.url, table, deferral_token(pk))
        seen = [(request.operation, request.fault) for request in proxy.seen()]

    assert seen == [("UpdateItem", "throttle"), ("UpdateItem", "pass")]
    item = get_item(dynamodb, table, pk)
    assert item is not None and item["status"] == {"S": "completed"}
