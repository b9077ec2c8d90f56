"""Shared fixtures: a real DynamoDB wire protocol (moto's server mode on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from idempotency_middleware import DynamoDBStore
from tests.support.core_only import CORE_ONLY, require_module
from tests.support.durations import (
    CpuTimer,
    load_durations,
    longest_files_first,
    recorder_from_environment,
)
from tests.support.in_process import mark_server_tests, refuse_in_an_in_process_run
from tests.support.sigint_guard import require_sigint_unchanged, sigint_state

if TYPE_CHECKING:
    from tests.support.faultproxy import FaultProxy
    from tests.support.servers import AWSSessions, Combo, Harness

# moto, the SDKs and the web frameworks are imported where a fixture needs them: a core-only
# run (tests/support/core_only.py) has none of them, and its tests use none of these fixtures.
HARNESS_COMBOS: tuple[Combo, ...] = ()
try:
    from tests.support.servers import ALL_COMBOS as HARNESS_COMBOS
except ModuleNotFoundError:
    if not CORE_ONLY:
        raise

# httpx parses the whole CA bundle for every client it makes; the tests' clients share one
# SSL context instead (tests/support/shared_ssl.py).
try:
    from tests.support.shared_ssl import share_default_ssl_context
except ModuleNotFoundError:
    if not CORE_ONLY:
        raise
else:
    share_default_ssl_context()

# moto accepts any credentials; botocore only needs some to sign requests. Never a real AWS.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for _variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(_variable, None)

REGION = "us-east-1"
# A test table's creation waits out a slow server: it is set-up, not the behaviour under test,
# and a module fixture's one read timed out (moto, a Python server, answering eight busy
# workers on two cores) errored every test of its module. Stores under test keep theirs.


def table_creator(name: str, endpoint: str) -> DynamoDBStore:
    """A store for creating the test table ``name`` at ``endpoint``, patient with the server."""
    return DynamoDBStore(
        name, endpoint_url=endpoint, region_name=REGION, connect_timeout=10.0, read_timeout=30.0
    )


# --- No test leaves SIGINT changed (tests/support/sigint_guard.py) ---------------------------
# What the test process had when it started: an inherited ignored SIGINT (a run started in
# the background by a shell without job control) is the baseline, not a failure.
SIGINT_AT_START = sigint_state()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say so (even under -q) when the run started with SIGINT ignored or blocked."""
    handler, blocked = SIGINT_AT_START
    if handler is not signal.default_int_handler or blocked:
        terminalreporter.write_line(
            f"SIGINT at start: handler {handler!r}, blocked {sorted(blocked)} (inherited from "
            "whatever started pytest; servers the tests stop with Ctrl-C must restore it, as "
            "test_quickstarts does)"
        )


@pytest.fixture(autouse=True)
def _sigint_left_alone() -> Iterator[None]:
    """Fails a test that leaves SIGINT's handler or the signal mask changed; before the
    test, one that finds them changed (by a fixture of a wider scope, or an import)."""
    require_sigint_unchanged(
        SIGINT_AT_START, "something before this test (a module or session fixture?)"
    )
    yield
    require_sigint_unchanged(SIGINT_AT_START, "this test or one of its fixtures")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a moto server on 127.0.0.1 (a free port), for the whole test session."""
    refuse_in_an_in_process_run("A moto server")
    moto_server = require_module("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def new_table(moto_endpoint: str, prefix: str = "idem") -> str:
    """Create a fresh idempotency table on moto through our own ``create_table``; its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    with table_creator(name, moto_endpoint) as store:
        store.create_table()
    return name


@pytest.fixture(autouse=True)
def _benchmark_sees_its_own_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """A benchmark collects garbage before each timed batch. Run by a test in a worker that
    holds every earlier test's objects, each collection walked them all (100 ms and more;
    most of a quick benchmark's CPU): they are frozen for the test, so it collects only the
    objects it made."""
    if not request.node.path.name.startswith(("test_benchmark", "test_load")):
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture
def fault_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    """A fault-injection proxy in front of moto (tests/support/faultproxy.py)."""
    from tests.support.faultproxy import FaultProxy

    with FaultProxy(moto_endpoint) as started:
        yield started


@pytest.fixture
def dynamodb_table(moto_endpoint: str) -> Iterator[str]:
    """A fresh idempotency table (created through our own ``create_table``); its name."""
    name = f"idem-{uuid.uuid4().hex[:12]}"
    with table_creator(name, moto_endpoint) as store:
        store.create_table()
    yield name


@pytest.fixture(scope="session")
def aws_sessions(moto_endpoint: str) -> Iterator[AWSSessions]:
    """A boto3 and an aioboto3 session for every store of the run, and a client on moto."""
    from tests.support.servers import AWSSessions

    boto3_session = require_module("boto3.session").Session(region_name=REGION)
    dynamodb = boto3_session.client("dynamodb", endpoint_url=moto_endpoint)
    try:
        aioboto3_session = require_module("aioboto3").Session(region_name=REGION)
        yield AWSSessions(boto3_session, aioboto3_session, dynamodb)
    finally:
        dynamodb.close()


@pytest.fixture
def harness_table(moto_endpoint: str, aws_sessions: AWSSessions) -> str:
    """Like ``dynamodb_table`` (a fresh table made by our ``create_table``), on a shared session."""
    name = f"idem-{uuid.uuid4().hex[:12]}"
    with DynamoDBStore(
        name,
        endpoint_url=moto_endpoint,
        region_name=REGION,
        session=aws_sessions.boto3_session,
        connect_timeout=10.0,
        read_timeout=30.0,  # (as table_creator's)
    ) as store:
        store.create_table()
    return name


@pytest.fixture(params=HARNESS_COMBOS, ids=lambda combo: combo.id)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """One adapter/store combination (FastAPI or Flask, memory or DynamoDB store).

    Parametrized over every combination; a test narrows it with
    ``@pytest.mark.parametrize("harness", DYNAMODB_COMBOS, indirect=True, ids=...)``.
    Servers and clients it starts are stopped at the end of the test.
    """
    yield from open_harness(request, request.param)


def open_harness(request: pytest.FixtureRequest, combo: Combo) -> Iterator[Harness]:
    """The ``Harness`` of ``combo`` (moto, Redis and PostgreSQL from the session's servers)."""
    from tests.support.servers import Harness

    table_name: str | None = None
    endpoint: str | None = None
    aws: AWSSessions | None = None
    db_location: str | None = None
    if combo.store == "dynamodb":
        endpoint = request.getfixturevalue("moto_endpoint")
        table_name = request.getfixturevalue("harness_table")
        aws = request.getfixturevalue("aws_sessions")
    elif combo.store in ("redis", "postgres"):
        db_location = request.getfixturevalue(
            "redis_url" if combo.store == "redis" else "postgres_dsn"
        )
    with contextlib.ExitStack() as stack:
        yield Harness(
            combo,
            stack,
            table_name=table_name,
            dynamodb_endpoint=endpoint,
            region=REGION,
            aws=aws,
            db_location=db_location,
        )


# --- Longest files first on pytest-xdist's workers (tests/support/durations.py) ---------------
# make test runs the suite with --dist loadfile --no-loadscope-reorder: a file is one unit of
# work, handed out in collection order. xdist's own order (most tests first) left files with
# few but long tests (the chaos run, the load test) to the end, where one worker ran them
# alone for most of a minute. Here the files go longest first, by the seconds make durations
# recorded in tests/durations.json, so the workers end together.
RECORDER = recorder_from_environment(Path(__file__).resolve().parent.parent)


def pytest_configure(config: pytest.Config) -> None:
    """For make durations: the recorder in the controlling process, the CPU timer wherever
    tests run."""
    if RECORDER is None:
        return
    config.pluginmanager.register(CpuTimer(), "test-cpu-seconds")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(RECORDER, "file-durations")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests that need a server (make check leaves them out); on xdist's workers,
    orders the files longest first (the order within a file is kept)."""
    mark_server_tests(items)
    if "PYTEST_XDIST_WORKER" in os.environ:
        longest_files_first(items, load_durations())


# --- A second DynamoDB implementation: Amazon's DynamoDB Local ---------------------------
# scripts/dynamodb-local.sh starts DynamoDB Local inside a private network namespace and sets
# this variable; the contract suite then also runs its DynamoDB cases against it. Unset (the
# normal run), those cases are still generated, and reported as skipped with the reason.

DYNAMODB_LOCAL_URL_VARIABLE = "IDEMPOTENCY_DYNAMODB_LOCAL_URL"
DYNAMODB_LOCAL_URL: str | None = os.environ.get(DYNAMODB_LOCAL_URL_VARIABLE, "").strip() or None
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


@pytest.fixture(scope="session")
def dynamodb_local_endpoint() -> str:
    """URL of DynamoDB Local, checked once: on loopback only, and answering.

    A run that asked for DynamoDB Local fails here rather than passing without it.
    """
    from urllib.parse import urlsplit

    refuse_in_an_in_process_run("DynamoDB Local")
    if DYNAMODB_LOCAL_URL is None:
        pytest.skip(
            f"{DYNAMODB_LOCAL_URL_VARIABLE} is not set: scripts/dynamodb-local.sh runs these "
            "against Amazon DynamoDB Local"
        )
    Config = require_module("botocore.config").Config
    if urlsplit(DYNAMODB_LOCAL_URL).hostname not in _LOOPBACK_HOSTS:
        pytest.fail(f"{DYNAMODB_LOCAL_URL_VARIABLE} must point at loopback: {DYNAMODB_LOCAL_URL}")
    client = require_module("boto3").client(
        "dynamodb",
        endpoint_url=DYNAMODB_LOCAL_URL,
        region_name=REGION,
        config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}),
    )
    try:
        client.list_tables(Limit=1)
    except Exception as error:
        pytest.fail(f"DynamoDB Local at {DYNAMODB_LOCAL_URL} does not answer: {error!r}")
    finally:
        client.close()
    return DYNAMODB_LOCAL_URL


# --- Real Redis and PostgreSQL servers (tests/support/db_servers.py) ----------------------------
from tests.support.db_servers import postgres_dsn, redis_url  # noqa: E402

__all__ = ["postgres_dsn", "redis_url"]
