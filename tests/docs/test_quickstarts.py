"""The DynamoDB quick starts (the site's Getting started), run as a user runs them:
``examples/fastapi_quickstart.py``
under uvicorn (lifespan on) and ``examples/flask_quickstart.py`` under waitress, each in its
own process, unmodified.

They are pointed at moto's DynamoDB server (tests/conftest.py) by the environment alone, as
a user points the AWS SDK at a local DynamoDB: ``AWS_ENDPOINT_URL_DYNAMODB`` (honoured by
botocore since 1.31), dummy credentials, empty AWS config files, no instance metadata. The
region is the one the quick starts name (no ``AWS_REGION``), so the table is created where
the code says. Each test checks: the table is created (TTL on), a POST with a key runs once
and its retry is the replay, the records are in DynamoDB, and the server stops cleanly on
Ctrl-C (exit 0, nothing on stderr about unclosed clients, no traceback). The page's
create-table snippet (docs/snippets/create_table.py, which the page includes) runs the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from idempotency_middleware import DynamoDBStore
from tests.support.servers import HOST, UVICORN_LISTENING, WAITRESS_LISTENING, server_process

REPO_ROOT = Path(__file__).resolve().parents[2]
TABLE = "idempotency"  # what both quick starts name
REGION = "eu-west-1"
HEADER = "Idempotency-Key"
START_TIMEOUT_SECONDS = 30.0  # a cold aioboto3 import and create_table on a loaded machine
STOP_TIMEOUT_SECONDS = 15.0
ORDER = {"item": "book", "quantity": 2}
# What a leaked aiohttp client prints (aiohttp's own words), and any Python traceback.
UNCLEAN = ("Unclosed client session", "Unclosed connector", "Traceback")


@pytest.fixture
def quickstart_env(moto_endpoint: str, tmp_path: Path) -> dict[str, str]:
    """This process's environment with every AWS_ variable replaced by a local-only set."""
    config = tmp_path / "aws-config"
    credentials = tmp_path / "aws-credentials"
    config.write_text("")
    credentials.write_text("")
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL_DYNAMODB=moto_endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=str(config),
        AWS_SHARED_CREDENTIALS_FILE=str(credentials),
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONFAULTHANDLER="1",  # a server that does not stop dumps its stacks (serving)
    )
    return env


@pytest.fixture
def dynamodb(moto_endpoint: str) -> Iterator[Any]:
    """A boto3 client on moto in the quick starts' region, with no ``idempotency`` table
    yet: the quick start under test has to create it."""
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    try:
        with contextlib.suppress(client.exceptions.ResourceNotFoundException):
            client.delete_table(TableName=TABLE)
        yield client
    finally:
        client.close()


def run_python(arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python <arguments>`` from the repository root, to its end, output captured."""
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# ``python -m MODULE ARGS...`` with Ctrl-C (SIGINT) raising KeyboardInterrupt, as in a shell.
# A process inherits an ignored or blocked SIGINT, and Python then installs no handler of its
# own; waitress relies on Python's (uvicorn installs its own). No test leaves SIGINT changed
# (tests/conftest.py fails one that does), but the test process itself may start with it
# ignored: a shell without job control starts its background commands so (``make test &``
# in a script, ``sh -c 'pytest ... &'``), and a waitress started from there never stopped on
# Ctrl-C. That is the run's inheritance, not the tests' to undo, so the server gets it back.
WITH_CTRL_C = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "del sys.argv[0]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


@contextlib.contextmanager
def serving(
    command: list[str], listening: re.Pattern[str], env: dict[str, str], log: Path
) -> Iterator[str]:
    """Run ``command`` (a server binding port 0) until the block ends, then stop it with
    SIGINT (Ctrl-C) and require exit status 0. Its output goes to ``log``."""
    assert command[:2] == [sys.executable, "-m"], command
    launched = [sys.executable, "-c", WITH_CTRL_C, *command[2:]]
    with server_process(
        launched, env=env, log=log, listening=listening, timeout=START_TIMEOUT_SECONDS
    ) as (process, url):
        yield url
        process.send_signal(signal.SIGINT)
        try:
            status = process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            # Still running: SIGABRT makes faulthandler (PYTHONFAULTHANDLER, set in the
            # environment) write every thread's stack to the log, to say where it hangs.
            process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
            pytest.fail(f"still running {STOP_TIMEOUT_SECONDS} s after SIGINT:\n{log.read_text()}")
        assert status == 0, log.read_text()


def assert_table_ready(dynamodb: Any) -> None:
    table = dynamodb.describe_table(TableName=TABLE)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = dynamodb.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED"


def assert_runs_once_per_key(url: str, dynamodb: Any) -> None:
    """A POST with a key runs; its retry is the replay; another key runs again."""
    key = str(uuid.uuid4())
    with httpx.Client(base_url=url, timeout=15, trust_env=False) as client:
        first = client.post("/orders", json=ORDER, headers={"Idempotency-Key": key})
        retry = client.post("/orders", json=ORDER, headers={"Idempotency-Key": key})
        other = client.post("/orders", json=ORDER, headers={"Idempotency-Key": f"{key}-2"})

    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    assert first.json()["item"] == "book"
    assert retry.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content  # the same order_id: the handler ran once
    assert other.status_code == 201
    assert other.json()["order_id"] != first.json()["order_id"]
    items = dynamodb.scan(TableName=TABLE, ConsistentRead=True)["Items"]
    assert sorted(item["status"]["S"] for item in items) == ["completed", "completed"]


def assert_clean(log: Path) -> str:
    output = log.read_text()
    for text in UNCLEAN:
        assert text not in output, output
    return output


def test_the_fastapi_quick_start_creates_its_table_runs_once_per_key_and_stops_cleanly(
    quickstart_env: dict[str, str], dynamodb: Any, tmp_path: Path
) -> None:
    log = tmp_path / "uvicorn.log"
    command = [
        *(sys.executable, "-m", "uvicorn", "examples.fastapi_quickstart:app"),
        *("--host", HOST, "--port", "0", "--lifespan", "on"),
    ]
    with serving(command, UVICORN_LISTENING, quickstart_env, log) as url:
        assert_table_ready(dynamodb)  # by the lifespan, before the port opened
        assert_runs_once_per_key(url, dynamodb)

    output = assert_clean(log)
    assert "Application startup complete." in output
    assert "Application shutdown complete." in output
    assert "ERROR" not in output


def test_the_flask_quick_start_creates_its_table_by_command_runs_once_per_key_and_stops_cleanly(
    quickstart_env: dict[str, str], dynamodb: Any, tmp_path: Path
) -> None:
    created = run_python(
        ["-m", "flask", "--app", "examples.flask_quickstart", "create-table"], quickstart_env
    )
    assert created.returncode == 0, created.stdout + created.stderr
    assert created.stdout == "table idempotency is ready\n"
    for text in UNCLEAN:
        assert text not in created.stderr
    assert_table_ready(dynamodb)

    log = tmp_path / "waitress.log"
    command = [
        *(sys.executable, "-m", "waitress", f"--listen={HOST}:0"),
        "examples.flask_quickstart:app",
    ]
    with serving(command, WAITRESS_LISTENING, quickstart_env, log) as url:
        assert_runs_once_per_key(url, dynamodb)

    output = assert_clean(log)
    assert f"Serving on {url}" in output


def create_table_snippet() -> str:
    """The page's Python snippet that creates the table at deploy time."""
    return (REPO_ROOT / "docs" / "snippets" / "create_table.py").read_text()


def test_the_create_table_snippet_creates_the_table_and_closes_its_client(
    quickstart_env: dict[str, str], dynamodb: Any
) -> None:
    snippet = create_table_snippet()
    result = run_python(["-c", snippet], quickstart_env)
    assert result.returncode == 0, result.stdout + result.stderr
    for text in UNCLEAN:
        assert text not in result.stderr, result.stderr
    assert_table_ready(dynamodb)


def test_the_fastapi_opt_in_example_covers_its_routes_and_documents_them(
    quickstart_env: dict[str, str], dynamodb: Any, tmp_path: Path
) -> None:
    with DynamoDBStore(
        TABLE, endpoint_url=quickstart_env["AWS_ENDPOINT_URL_DYNAMODB"], region_name=REGION
    ) as store:
        store.create_table()
    log = tmp_path / "uvicorn.log"
    command = [
        *(sys.executable, "-m", "uvicorn", "examples.fastapi_routes:app"),
        *("--host", HOST, "--port", "0"),
    ]
    key = str(uuid.uuid4())
    with (
        serving(command, UVICORN_LISTENING, quickstart_env, log) as url,
        httpx.Client(base_url=url, timeout=15, trust_env=False) as client,
    ):
        payment = {"amount": 5}
        caller = {"X-Api-Key": "caller-1"}
        missing = client.post("/payments", json=payment, headers=caller)
        first = client.post("/payments", json=payment, headers={**caller, HEADER: key})
        retry = client.post("/payments", json=payment, headers={**caller, HEADER: key})
        # Another caller's key namespace: the same key runs anew.
        other = client.post("/payments", json=payment, headers={"X-Api-Key": "2", HEADER: key})
        keyed_put = client.put("/orders/7", headers={HEADER: f'"{key}"'})
        bare_put = client.put("/orders/7")
        schema = client.get("/openapi.json").json()

    assert missing.status_code == 400
    assert missing.json()["type"].endswith(":missing-key")
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    assert retry.headers["idempotent-replayed"] == "true" and retry.content == first.content
    assert other.json()["payment_id"] != first.json()["payment_id"]
    assert keyed_put.json() == {"order_id": 7, "idempotency_key": key}
    assert bare_put.json() == {"order_id": 7, "idempotency_key": None}

    def key_header(path: str, method: str) -> dict[str, Any]:
        operation = schema["paths"][path][method]
        [header] = [p for p in operation["parameters"] if p["name"] == HEADER]
        assert isinstance(header, dict)
        return header

    assert key_header("/payments", "post")["required"] is True
    assert key_header("/orders/{order_id}", "put")["required"] is False
    unprocessable = schema["paths"]["/payments"]["post"]["responses"]["422"]["content"]
    assert set(unprocessable) == {"application/json", "application/problem+json"}
    assert_clean(log)
