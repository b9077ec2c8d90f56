"""The README's exactly-once and long-running examples, run as a user runs them:
``examples/exactly_once_orders.py`` and ``examples/long_running_work.py`` under uvicorn
(lifespan on), each in its own process, unmodified, configured by the environment alone.

Each runs against moto's DynamoDB server and against Amazon's DynamoDB Local (ids naming
``dynamodb-local``; ``scripts/dynamodb-local.sh`` runs those, a normal run skips them). The
tables are made by the examples' own lifespans, under names unique to the test; the test
looks into them with boto3 to check what was, and was not, written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from tests.support.servers import HOST, UVICORN_LISTENING, server_process

REGION = "eu-west-1"  # what the examples default to (no AWS_REGION below)
START_TIMEOUT_SECONDS = 30.0  # a cold aioboto3 import and three create_table on a loaded host
STOP_TIMEOUT_SECONDS = 15.0
REPORT_SECONDS = 8.0  # how long the long-running example's work takes (a wide margin: the
# interim checks must happen before it ends, on a loaded machine too)
# The failing report raises once its work is over; nothing is checked while it runs, so it
# only needs to outlast the 202 being stored (milliseconds), not a round of interim checks.
FAILING_REPORT_SECONDS = 1.0
FINAL_TIMEOUT_SECONDS = 30.0  # how long a test polls for the final response
POLL_SECONDS = 0.2
KEY = "Idempotency-Key"
UNCLEAN = ("Unclosed client session", "Unclosed connector", "Traceback")


@pytest.fixture(params=["dynamodb", "dynamodb-local"])
def endpoint(request: pytest.FixtureRequest) -> str:
    """moto's server, or DynamoDB Local (skipped without scripts/dynamodb-local.sh)."""
    name = "moto_endpoint" if request.param == "dynamodb" else "dynamodb_local_endpoint"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def tables() -> dict[str, str]:
    """Table names of this test only (moto and DynamoDB Local live for the whole run)."""
    suffix = uuid.uuid4().hex[:12]
    return {
        "IDEMPOTENCY_TABLE": f"idem-{suffix}",
        "ORDERS_TABLE": f"orders-{suffix}",
        "INVENTORY_TABLE": f"inventory-{suffix}",
    }


@pytest.fixture
def example_env(endpoint: str, tables: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """This process's environment with every AWS_ variable replaced by a local-only set."""
    (tmp_path / "aws-config").write_text("")
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(
        tables,
        AWS_ENDPOINT_URL_DYNAMODB=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-config"),
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        REPORT_SECONDS=str(REPORT_SECONDS),
    )
    return env


@pytest.fixture
def dynamodb(endpoint: str) -> Iterator[Any]:
    """A boto3 resource on the same endpoint, to look into the tables."""
    resource = boto3.resource("dynamodb", endpoint_url=endpoint, region_name=REGION)
    try:
        yield resource
    finally:
        resource.meta.client.close()


@contextlib.contextmanager
def serving(
    module: str, env: dict[str, str], log: Path, *, unclean: tuple[str, ...] = UNCLEAN
) -> Iterator[httpx.Client]:
    """``uvicorn examples.<module>:app`` until the block ends, then Ctrl-C: exit 0, and
    none of ``unclean`` (unclosed clients, tracebacks) in its output."""
    command = [
        *(sys.executable, "-m", "uvicorn", f"examples.{module}:app"),
        *("--host", HOST, "--port", "0", "--lifespan", "on"),
    ]
    with (
        server_process(
            command, env=env, log=log, listening=UVICORN_LISTENING, timeout=START_TIMEOUT_SECONDS
        ) as (process, url),
        httpx.Client(base_url=url, timeout=15, trust_env=False) as client,
    ):
        yield client
        process.send_signal(signal.SIGINT)
        assert process.wait(STOP_TIMEOUT_SECONDS) == 0, log.read_text()
    output = log.read_text()
    assert "Application shutdown complete." in output
    for text in unclean:
        assert text not in output, output


def scan(dynamodb: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = dynamodb.Table(table).scan(ConsistentRead=True)["Items"]
    return items


def stock(dynamodb: Any, table: str, sku: str) -> Decimal:
    item = dynamodb.Table(table).get_item(Key={"sku": sku}, ConsistentRead=True)["Item"]
    value: Decimal = item["stock"]
    return value


def test_orders_commit_with_their_response_once_and_a_stock_conflict_writes_nothing(
    example_env: dict[str, str], tables: dict[str, str], dynamodb: Any, tmp_path: Path
) -> None:
    orders, inventory = tables["ORDERS_TABLE"], tables["INVENTORY_TABLE"]
    idempotency = tables["IDEMPOTENCY_TABLE"]
    key, short_key = str(uuid.uuid4()), str(uuid.uuid4())
    with serving("exactly_once_orders", example_env, tmp_path / "uvicorn.log") as client:
        assert client.put("/inventory/book", json={"stock": 5}).status_code == 200
        order = {"sku": "book", "quantity": 2}
        first = client.post("/orders", json=order, headers={KEY: key})
        retry = client.post("/orders", json=order, headers={KEY: key})
        unkeyed = client.post("/orders", json=order)
        after_first = (scan(dynamodb, orders), stock(dynamodb, inventory, "book"))

        too_many = {"sku": "book", "quantity": 4}  # 3 left
        conflict = client.post("/orders", json=too_many, headers={KEY: short_key})
        after_conflict = (scan(dynamodb, orders), stock(dynamodb, inventory, "book"))
        records_after_conflict = scan(dynamodb, idempotency)

        # The conflict released its key: once restocked, the same request runs and commits.
        assert client.put("/inventory/book", json={"stock": 10}).status_code == 200
        second = client.post("/orders", json=too_many, headers={KEY: short_key})
        final = (scan(dynamodb, orders), stock(dynamodb, inventory, "book"))

    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    assert retry.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content  # the same order_id: the handler ran once
    assert unkeyed.status_code == 400
    assert unkeyed.json()["type"].endswith(":missing-key")
    order_id = first.json()["order_id"]
    assert after_first == (
        [{"order_id": order_id, "sku": "book", "quantity": Decimal(2)}],
        Decimal(3),
    )

    assert conflict.status_code == 409, conflict.text
    assert conflict.headers["content-type"] == "application/problem+json"
    problem = conflict.json()
    assert problem["type"].endswith(":transaction-conflict")
    assert (problem["position"], problem["reason"]) == (1, "ConditionalCheckFailed")
    assert after_conflict == after_first  # neither the order nor the decrement landed
    assert [record["status"] for record in records_after_conflict] == ["completed"]

    assert second.status_code == 201, second.text
    assert "idempotent-replayed" not in second.headers
    assert sorted(item["order_id"] for item in final[0]) == sorted(
        [order_id, second.json()["order_id"]]
    )
    assert final[1] == Decimal(6)


def post_until_changed(client: httpx.Client, body: dict[str, str], key: str) -> httpx.Response:
    """Retry the POST, as a client polls, until its answer is no longer the replayed
    interim 202 (or the time is up)."""
    deadline = time.monotonic() + FINAL_TIMEOUT_SECONDS
    while True:
        response = client.post("/reports", json=body, headers={KEY: key})
        interim = response.status_code == 202 and "idempotent-replayed" in response.headers
        if not interim or time.monotonic() > deadline:
            return response
        time.sleep(POLL_SECONDS)


def test_long_running_work_answers_202_replays_it_then_replays_the_final_200(
    example_env: dict[str, str], tmp_path: Path
) -> None:
    key = str(uuid.uuid4())
    body = {"month": "2026-02"}
    with serving("long_running_work", example_env, tmp_path / "uvicorn.log") as client:
        accepted = client.post("/reports", json=body, headers={KEY: key})
        interim = client.post("/reports", json=body, headers={KEY: key})
        running = client.get(accepted.headers["location"])
        final = post_until_changed(client, body, key)
        replayed = client.post("/reports", json=body, headers={KEY: key})
        done = client.get(accepted.headers["location"])

    assert accepted.status_code == 202, accepted.text
    assert "idempotent-replayed" not in accepted.headers
    report_id = accepted.json()["report_id"]
    assert accepted.headers["location"] == f"/reports/{report_id}"
    # Sent within REPORT_SECONDS of the first: the work still runs, the 202 is replayed.
    assert interim.status_code == 202
    assert interim.headers["idempotent-replayed"] == "true"
    assert interim.content == accepted.content
    assert interim.headers["location"] == accepted.headers["location"]
    assert running.json() == {"status": "running"}

    assert final.status_code == 200, final.text
    assert final.headers["idempotent-replayed"] == "true"
    assert final.headers["content-type"] == "application/json"
    assert final.json() == {"month": "2026-02", "days": 28}
    assert replayed.status_code == 200 and replayed.content == final.content
    assert done.json() == {"status": "done", "report": {"month": "2026-02", "days": 28}}


def test_long_running_work_that_fails_releases_its_key_and_a_retry_runs_again(
    example_env: dict[str, str], tmp_path: Path
) -> None:
    key = str(uuid.uuid4())
    body = {"month": "2026-13"}  # the worker's report raises on it
    log = tmp_path / "uvicorn.log"
    example_env["REPORT_SECONDS"] = str(FAILING_REPORT_SECONDS)
    # The worker logs the failed report with its traceback; nothing else may be unclean.
    with serving("long_running_work", example_env, log, unclean=UNCLEAN[:2]) as client:
        accepted = client.post("/reports", json=body, headers={KEY: key})
        rerun = post_until_changed(client, body, key)
        failed = client.get(accepted.headers["location"])

    assert accepted.status_code == 202, accepted.text
    # Released by arelease_deferred: the retry ran the handler again (a new report, not a
    # replay), where a key left deferred would have replayed the first 202 until its TTL.
    assert rerun.status_code == 202, rerun.text
    assert "idempotent-replayed" not in rerun.headers
    assert rerun.json()["report_id"] != accepted.json()["report_id"]
    assert failed.json() == {"status": "failed"}
    output = log.read_text()
    assert f"report {accepted.json()['report_id']} failed" in output
    assert "IllegalMonthError" in output
