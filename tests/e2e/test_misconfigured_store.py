"""A misconfigured store is answered as one, and its fix names what was missing.

The fix a store gives (``StoreUnavailableError.fix``, the failed check's message, the log
line) names the store's own table, region and endpoint: the command it hints, run as it is
written, creates the table that store reads (moto's DynamoDB, the session's PostgreSQL).
A request on a misconfigured store is a 503 that says it is not retryable, with no
``Retry-After``; an outage keeps ``Retry-After`` and "retry with the same key". A function
raises a ``StoreUnavailableError`` that says the same, its ``cause`` the misconfiguration's.
Real servers: uvicorn behind httpx, moto's server, the PostgreSQL test server.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    SQLiteStore,
    StoreUnavailableError,
    idempotent,
)
from tests.conftest import REGION
from tests.support.diag_aws import aws_environment
from tests.support.faultproxy import serve_workload
from tests.support.ports import free_port

MISCONFIGURED_TYPE = "urn:idempotency-middleware:problem:store-misconfigured"
UNAVAILABLE_TYPE = "urn:idempotency-middleware:problem:store-unavailable"


def failed_check(store: Any) -> StoreUnavailableError:
    with pytest.raises(StoreUnavailableError) as raised:
        store.check()
    return raised.value


def hinted_command(fix: str) -> list[str]:
    """The ``idempotency-middleware ...`` command between the backticks of ``fix``."""
    [command] = re.findall(r"`(idempotency-middleware [^`]*)`", fix)
    return shlex.split(command)


def run_hinted(command: list[str], environment: dict[str, str]) -> None:
    """Run the hinted command as the operator would (the installed script is this module)."""
    assert command[0] == "idempotency-middleware"
    result = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", *command[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- the hinted command makes the store's table ---------------------------------------------


def test_the_hinted_dynamodb_command_creates_the_table_the_store_reads(
    moto_endpoint: str, tmp_path: Path
) -> None:
    table = f"idempotency-typo-{uuid.uuid4().hex[:8]}"
    with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        error = failed_check(store)
        assert error.cause == "no_table"
        command = hinted_command(error.fix)
        assert command == [
            "idempotency-middleware",
            "create-table",
            "--table",
            table,
            "--region",
            REGION,
            "--endpoint-url",
            moto_endpoint,
        ]
        # (Another region in the operator's shell: the command still names the store's.)
        run_hinted(command, aws_environment(tmp_path, region="eu-west-3"))
        store.check()  # the table the store wanted now exists


def test_a_claim_on_a_missing_table_raises_the_same_fix_as_the_check(moto_endpoint: str) -> None:
    table = f"idempotency-typo-{uuid.uuid4().hex[:8]}"
    with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        checked = failed_check(store)

        @idempotent(store=store, key="k", name="hints.charge")
        def charge(k: str) -> str:
            raise AssertionError("must not run")

        with pytest.raises(StoreUnavailableError) as raised:
            charge(k="order-1")
    assert raised.value.fix == checked.fix
    assert f"`idempotency-middleware create-table --table {table} " in raised.value.fix


@pytest.mark.servers  # the session PostgreSQL server
def test_the_hinted_postgres_command_creates_the_table_the_store_reads(
    request: pytest.FixtureRequest,
) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from idempotency_middleware import PostgresStore
    from tests.support.db_stores import location

    dsn = location(request, "postgres")
    table = f"idempotency_typo_{uuid.uuid4().hex[:8]}"
    with PostgresStore(dsn, table=table) as store:
        error = failed_check(store)
        assert error.cause == "no_table"
        command = hinted_command(error.fix)
        assert command[:3] == ["idempotency-middleware", "create-table", "--postgres"]
        assert command[4:] == ["--table", table]
        assert "password" not in command[3]
        # The password is the operator's to give (PGPASSWORD, ~/.pgpass), never printed.
        password = str(conninfo_to_dict(dsn).get("password") or "")
        environment = {**os.environ, **({"PGPASSWORD": password} if password else {})}
        run_hinted(command, environment)
        store.check()


def test_a_missing_sqlite_directory_is_named_in_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "no-such-directory" / "idempotency.sqlite3"
    with SQLiteStore(path) as store:
        error = failed_check(store)
        assert error.fix == (
            f"create the directory {str(path.parent)!r}, or fix the path {str(path)!r}"
        )
        path.parent.mkdir()
        store.check()


# --- HTTP: a misconfiguration is not retryable; an outage is ------------------------------------


def test_a_misconfigured_store_answers_a_503_that_is_not_retryable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "no-such-directory" / "idempotency.sqlite3")
    with serve_workload("asgi", store, warm_up=False) as running:
        response = running.post("/ok", "misconfigured-1")
    store.close()
    assert response.status_code == 503
    assert "retry-after" not in response.headers
    problem = orjson.loads(response.content)
    assert problem["type"] == MISCONFIGURED_TYPE
    assert problem["title"] == "Idempotency store misconfigured"
    assert problem["detail"].startswith(
        "The idempotency store is misconfigured, so the request was not processed. This is "
        "not retryable"
    )
    assert "idempotency.sqlite3" not in problem["detail"]  # (the log's to say, not the client's)
    assert "fix:" in problem["detail"]
    assert "Retry with the same key" not in problem["detail"]
    assert running.workload.runs("/ok") == 0


def test_an_unreachable_store_answers_a_503_to_retry_with_the_same_key() -> None:
    store = AsyncDynamoDBStore(
        "idempotency",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name=REGION,
        max_attempts=1,
    )
    with serve_workload("asgi", store, warm_up=False, on_shutdown=store.aclose) as running:
        response = running.post("/ok", "outage-1")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    problem = orjson.loads(response.content)
    assert problem["type"] == UNAVAILABLE_TYPE
    assert "Retry with the same key" in problem["detail"]


# --- functions: the exception says which ------------------------------------------------------


def test_a_function_on_a_misconfigured_store_raises_an_error_saying_it_is_not_retryable(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-directory"
    with SQLiteStore(missing / "idempotency.sqlite3") as store:

        @idempotent(store=store, key="k", name="misconfigured.work")
        def work(k: str) -> str:
            raise AssertionError("must not run")

        with pytest.raises(StoreUnavailableError) as raised:
            work(k="job-1")
    error = raised.value
    assert error.cause == "cannot_open" and error.misconfigured
    assert error.retry_after is None
    assert error.fix.startswith(f"create the directory {str(missing)!r}")
    assert str(error).startswith(
        "idempotent function misconfigured.work: the idempotency store is misconfigured ("
    )
    assert f"not retryable: it fails the same way until fixed; fix: {error.fix}" in str(error)


def test_a_function_on_an_unreachable_store_raises_an_error_saying_retry() -> None:
    with DynamoDBStore(
        "idempotency",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name=REGION,
        max_attempts=1,
    ) as store:

        @idempotent(store=store, key="k", name="outage.work")
        def work(k: str) -> str:
            raise AssertionError("must not run")

        with pytest.raises(StoreUnavailableError) as raised:
            work(k="job-1")
    error = raised.value
    assert error.cause == "unreachable" and not error.misconfigured
    assert error.fix == ""
    assert str(error).endswith("so the function did not run; retry with the same key")
