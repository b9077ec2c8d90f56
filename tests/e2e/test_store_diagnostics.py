"""Every store failure says why: a cause on the error and the event, and a log line naming
the operation, the cause and the key hash, readable with default logging; the 503 body is
the generic outage problem (retry with the same key, ``Retry-After``) for an outage, and the
misconfiguration problem (not retryable, no ``Retry-After``) for a misconfiguration.

Each cause is produced for real, through a real request to a served middleware (uvicorn with
``AsyncDynamoDBStore``, waitress with ``DynamoDBStore``) or an ``idempotent`` call: moto
without the table, no credentials and no region in the environment, a closed port, the
fault proxy throttling, failing and hanging, an endpoint rejecting credentials or access, a
client bound to a closed event loop, an SQLite file locked, corrupt or impossible to open.
The classification of the error codes no test server sends is checked on botocore's own
exception classes at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore import exceptions as boto

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyEvent,
    SQLiteStore,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.engine import decisions, problems, refusals
from idempotency_middleware.errors import CAUSES, MISCONFIGURED_CAUSES
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.dynamodb import errors as ddb
from idempotency_middleware.stores.sqlite.errors import unavailable as sqlite_unavailable
from tests.conftest import REGION
from tests.support.diag_aws import RejectingEndpoint, aws_environment, use_environment
from tests.support.faultproxy import Adapter, FaultProxy, Served, serve_workload
from tests.support.ports import free_port
from tests.support.servers import HOST

# The one 503 body every outage gets, whatever its cause.
GENERIC_503 = refusals.problem_for(decisions.STORE_UNAVAILABLE).body()


def expected_503(cause: str) -> bytes:
    """The body of the 503 a claim failing for ``cause`` answers."""
    if cause in MISCONFIGURED_CAUSES:
        return problems.store_misconfigured().body()
    return GENERIC_503


ONE_FAST_ATTEMPT: dict[str, Any] = {"max_attempts": 1, "connect_timeout": 1, "read_timeout": 1}


@contextlib.contextmanager
def served(
    adapter: Adapter, table: str, *, endpoint: str | None, **store_kwargs: Any
) -> Iterator[Served]:
    """The workload behind the adapter's middleware on a DynamoDB store (no warm-up request:
    the store is meant to fail)."""
    arguments: dict[str, Any] = {"endpoint_url": endpoint, **store_kwargs}
    if adapter == "asgi":
        async_store = AsyncDynamoDBStore(table, **arguments)
        with serve_workload(
            "asgi", async_store, on_shutdown=async_store.aclose, warm_up=False
        ) as running:
            yield running
    else:
        with (
            DynamoDBStore(table, **arguments) as sync_store,
            serve_workload("wsgi", sync_store, warm_up=False) as running,
        ):
            yield running


def assert_diagnosed(
    running: Served, caplog: pytest.LogCaptureFixture, cause: str, phrase: str
) -> logging.LogRecord:
    """POST one new key: 503 with the cause's body (and Retry-After only for an outage), the
    handler not run, one store_error event with ``cause``, and a log line naming the claim,
    ``phrase`` and the key hash."""
    key = f"diag-{cause}-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.ERROR, logger="idempotency_middleware"):
        response = running.post("/ok", key)
    assert response.status_code == 503
    assert response.content == expected_503(cause)
    assert ("retry-after" in response.headers) is (cause not in MISCONFIGURED_CAUSES)
    assert running.workload.runs("/ok") == 0
    [event] = running.events.of("store_error")
    assert event.cause == cause
    [record] = [r for r in caplog.records if getattr(r, "idempotency_event", "") == "store_error"]
    hashed = storage_key("POST", "/ok", None, key)
    message = record.getMessage()
    assert message.startswith(f"idempotency store failed: claim: {phrase}"), message
    assert message.endswith(f"(key {hashed}; POST /ok)"), message
    assert record.__dict__["idempotency_cause"] == cause
    assert record.__dict__["idempotency_key_hash"] == hashed
    return record


# --- DynamoDB, through the middlewares ---------------------------------------------------------


def test_a_missing_table_is_named(
    moto_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = f"missing-{uuid.uuid4().hex[:8]}"
    with served("asgi", table, endpoint=moto_endpoint, region_name=REGION) as running:
        assert_diagnosed(running, caplog, "no_table", f"no such table '{table}'")


def test_missing_credentials_are_named(
    moto_endpoint: str,
    dynamodb_table: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    use_environment(monkeypatch, aws_environment(tmp_path, credentials=False))
    with served("wsgi", dynamodb_table, endpoint=moto_endpoint, region_name=REGION) as running:
        assert_diagnosed(running, caplog, "no_credentials", "no AWS credentials found")


def test_a_missing_region_is_named(
    moto_endpoint: str,
    dynamodb_table: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    use_environment(monkeypatch, aws_environment(tmp_path, region=None))
    with served("asgi", dynamodb_table, endpoint=moto_endpoint) as running:
        assert_diagnosed(running, caplog, "no_region", "no AWS region configured")


def test_an_unreachable_endpoint_is_named(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://{HOST}:{free_port()}"
    with served("wsgi", "idempotency", endpoint=endpoint, region_name=REGION) as running:
        record = assert_diagnosed(running, caplog, "unreachable", "unreachable: cannot connect")
    assert endpoint in record.getMessage()


@pytest.mark.parametrize(
    ("mode", "cause", "phrase"),
    [
        ("throttle", "throttled", "throttled (ThrottlingException: Rate exceeded)"),
        ("error", "server_error", "server error (InternalServerError"),
        ("hang", "timed_out", "timed out waiting for an answer from http://127.0.0.1:"),
    ],
)
def test_throttling_server_errors_and_timeouts_are_named(
    moto_endpoint: str,
    dynamodb_table: str,
    fault_proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
    mode: Any,
    cause: str,
    phrase: str,
) -> None:
    fault_proxy.set(mode)
    with served(
        "asgi", dynamodb_table, endpoint=fault_proxy.url, region_name=REGION, **ONE_FAST_ATTEMPT
    ) as running:
        assert_diagnosed(running, caplog, cause, phrase)


@pytest.mark.parametrize(
    ("error_type", "cause", "phrase"),
    [
        ("UnrecognizedClientException", "bad_credentials", "AWS credentials rejected"),
        ("AccessDeniedException", "access_denied", "access denied (AccessDeniedException"),
    ],
)
def test_rejected_credentials_and_denied_access_are_named(
    caplog: pytest.LogCaptureFixture, error_type: str, cause: str, phrase: str
) -> None:
    with (
        RejectingEndpoint(error_type, "rejected by the test endpoint") as endpoint,
        served("wsgi", "idempotency", endpoint=endpoint.url, region_name=REGION) as running,
    ):
        assert_diagnosed(running, caplog, cause, phrase)


class LoopPinnedStore(AsyncDynamoDBStore):
    """The store as it was before it followed the running loop: the first loop's client,
    for good (as a wrapper caching ``await store.client()`` would keep it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        clients = self._transport.clients
        made = clients.get
        pinned: list[Any] = []

        async def first_loops() -> Any:
            if not pinned:
                pinned.append(await made())
            return pinned[0]

        clients.get = first_loops  # type: ignore[method-assign]


def test_a_client_bound_to_a_closed_event_loop_is_named(
    moto_endpoint: str, dynamodb_table: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = LoopPinnedStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION)
    # A loop closed without asyncio.run's shutdown: nothing closed the client on it.
    loop = asyncio.new_event_loop()
    loop.run_until_complete(store.aget("warm"))
    loop.close()
    with serve_workload("asgi", store, warm_up=False) as running:
        record = assert_diagnosed(running, caplog, "loop_closed", "event loop is closed")
    assert record.__dict__["idempotency_operation"] == "claim"
    asyncio.run(store.aclose())  # releases the closed loop's client


def test_fail_open_names_the_cause_too(
    moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    table = f"missing-{uuid.uuid4().hex[:8]}"
    with (
        DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store,
        serve_workload("wsgi", store, warm_up=False, on_store_error="run") as running,
        caplog.at_level(logging.ERROR, logger="idempotency_middleware"),
    ):
        response = running.post("/ok", "fail-open-diag")
    assert response.status_code == 201
    [event] = running.events.of("fail_open")
    assert (event.cause, event.operation) == ("no_table", "claim")
    [record] = [r for r in caplog.records if getattr(r, "idempotency_event", "") == "fail_open"]
    hashed = storage_key("POST", "/ok", None, "fail-open-diag")
    assert record.getMessage() == (
        f"idempotency store failed on claim: no such table '{table}'; the store is "
        "misconfigured, not retryable; fix: create it: store.create_table(), or "
        f"`idempotency-middleware create-table --table {table} --region {REGION} "
        f"--endpoint-url {moto_endpoint}`; handler run WITHOUT idempotency protection "
        f"(key {hashed}; POST /ok)"
    )


# --- SQLite, through idempotent calls -----------------------------------------------------------


def call_failing(store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> StoreUnavailableError:
    """One ``idempotent`` call on ``store``, which fails; the store's error (the one the
    call raised is made from it), after checking the log line and the event."""
    events: list[IdempotencyEvent] = []

    @idempotent(store=store, key="key", name="diag.work", on_event=events.append)
    def work(key: str) -> str:
        raise AssertionError("must not run")

    with (
        caplog.at_level(logging.ERROR, logger="idempotency_middleware"),
        pytest.raises(StoreUnavailableError) as raised,
    ):
        work(key=f"k-{time.time_ns()}")
    store_error = raised.value.__cause__
    assert isinstance(store_error, StoreUnavailableError)
    # What the caller catches says why, as the store did.
    assert (raised.value.cause, raised.value.reason) == (store_error.cause, store_error.reason)
    assert raised.value.misconfigured == store_error.misconfigured
    assert store_error.reason in str(raised.value)
    [event] = [event for event in events if event.kind == "store_error"]
    assert event.cause == store_error.cause
    [record] = [r for r in caplog.records if getattr(r, "idempotency_event", "") == "store_error"]
    misconfigured = (
        f"; the store is misconfigured, not retryable; fix: {store_error.fix}"
        if store_error.misconfigured
        else ""
    )
    assert record.getMessage() == (
        f"idempotency store failed: claim: {store_error.reason}{misconfigured} "
        f"(key {event.key_hash}; CALL diag.work)"
    )
    return store_error


def test_a_locked_sqlite_file_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "locked.sqlite3"
    with SQLiteStore(path, busy_timeout_seconds=0) as store:
        store.create_table()
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as blocker:
            blocker.execute("BEGIN EXCLUSIVE")
            error = call_failing(store, caplog)
    assert (error.cause, error.misconfigured) == ("busy", False)
    assert error.reason.startswith(f"database '{path}' is locked by another writer")


def test_a_file_that_is_not_a_database_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"not a database " * 512)
    with SQLiteStore(path) as store:
        error = call_failing(store, caplog)
    assert (error.cause, error.misconfigured) == ("io_error", False)
    assert error.reason == f"database '{path}' cannot be read or written (file is not a database)"


def test_a_database_that_cannot_be_opened_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "no-such-directory" / "idempotency.sqlite3"
    with SQLiteStore(path) as store:
        error = call_failing(store, caplog)
    assert (error.cause, error.misconfigured) == ("cannot_open", True)
    assert error.reason.startswith(f"cannot open database file '{path}'")


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        ("database is locked", "busy"),
        ("database table is locked", "busy"),
        ("attempt to write a readonly database", "access_denied"),
        ("disk I/O error", "io_error"),
        ("database disk image is malformed", "io_error"),
        ("unable to open database file", "cannot_open"),
        ("no such function: nonsense", "unknown"),
    ],
)
def test_sqlite_errors_without_a_code_are_classified_by_their_message(
    message: str, cause: str
) -> None:
    # Python 3.10's sqlite3 errors carry no sqlite_errorcode; these, made here, have none.
    error = sqlite3.OperationalError(message)
    assert sqlite_unavailable("claim", error, "/x.sqlite3").cause == cause


# --- the classification of what no test server sends -------------------------------------------


def client_error(code: str, status: int = 400, **error: str) -> boto.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "from AWS", **error},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return boto.ClientError(response, "PutItem")


def test_a_runtime_error_that_is_not_about_event_loops_is_raised_as_itself() -> None:
    # A bug is not an outage: it must not become a 503 with a key left claimed.
    bug = RuntimeError("something else")
    with pytest.raises(RuntimeError) as raised:
        ddb.translate_error("put_item", bug, "orders")
    assert raised.value is bug


@pytest.mark.parametrize(
    ("error", "cause", "reason"),
    [
        (boto.NoRegionError(), "no_region", "no AWS region configured"),
        (boto.NoCredentialsError(), "no_credentials", "no AWS credentials found"),
        (
            boto.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
            "no_credentials",
            "no usable AWS credentials: Partial credentials found in env, missing: "
            "AWS_SECRET_ACCESS_KEY",
        ),
        (
            boto.ProfileNotFound(profile="prod"),
            "no_credentials",
            "no usable AWS credentials: The config profile (prod) could not be found",
        ),
        (
            boto.CredentialRetrievalError(provider="sso", error_msg="token expired"),
            "no_credentials",
            "no AWS credentials found: Error when retrieving credentials from sso: token expired",
        ),
        (
            boto.EndpointConnectionError(endpoint_url="http://db:8000"),
            "unreachable",
            "unreachable: cannot connect to http://db:8000",
        ),
        (
            boto.ConnectTimeoutError(endpoint_url="http://db:8000"),
            "unreachable",
            "unreachable: connecting to http://db:8000 timed out",
        ),
        (
            boto.ReadTimeoutError(endpoint_url="http://db:8000"),
            "timed_out",
            "timed out waiting for an answer from http://db:8000",
        ),
        (
            ConnectionRefusedError("refused"),
            "unreachable",
            "unreachable: cannot connect to the endpoint",
        ),
        (TimeoutError(), "timed_out", "timed out waiting for an answer from the endpoint"),
        (
            boto.HTTPClientError(error=RuntimeError("Event loop is closed")),
            "loop_closed",
            "event loop is closed: the client was made on a loop that ended",
        ),
        (
            RuntimeError("Event loop is closed"),
            "loop_closed",
            "event loop is closed: the client was made on a loop that ended",
        ),
        (
            RuntimeError("<asyncio.locks.Lock object> is bound to a different event loop"),
            "loop_closed",
            "the client belongs to another event loop "
            "(<asyncio.locks.Lock object> is bound to a different event loop)",
        ),
        (
            boto.HTTPClientError(error=ValueError("odd")),
            "unknown",
            "An HTTP Client raised an unhandled exception: odd",
        ),
        (
            client_error("ResourceNotFoundException"),
            "no_table",
            "no such table 'orders'",
        ),
        (
            client_error("NoSuchBucket", BucketName="overflow"),
            "no_bucket",
            "no such S3 bucket 'overflow'",
        ),
        (
            client_error("UnrecognizedClientException"),
            "bad_credentials",
            "AWS credentials rejected (UnrecognizedClientException: from AWS)",
        ),
        (
            client_error("InvalidSignatureException"),
            "bad_credentials",
            "AWS credentials rejected (InvalidSignatureException: from AWS)",
        ),
        (
            client_error("AccessDeniedException"),
            "access_denied",
            "access denied (AccessDeniedException: from AWS)",
        ),
        (
            client_error("ThrottlingException"),
            "throttled",
            "throttled (ThrottlingException: from AWS)",
        ),
        (
            client_error("ProvisionedThroughputExceededException"),
            "throttled",
            "throttled (ProvisionedThroughputExceededException: from AWS)",
        ),
        (
            client_error("RequestLimitExceeded"),
            "throttled",
            "throttled (RequestLimitExceeded: from AWS)",
        ),
        (
            client_error("InternalServerError", 500),
            "server_error",
            "server error (InternalServerError: from AWS)",
        ),
        (
            client_error("SomethingNew", 503),
            "server_error",
            "server error (SomethingNew: from AWS)",
        ),
        (
            client_error("ValidationException"),
            "unknown",
            "request failed (ValidationException: from AWS)",
        ),
    ],
)
def test_each_botocore_failure_has_its_cause(error: BaseException, cause: str, reason: str) -> None:
    translated = ddb.translate_error("put_item", error, "orders")
    assert isinstance(translated, StoreUnavailableError)
    assert (translated.cause, translated.reason) == (cause, reason)
    assert translated.code == ddb.error_code(error)
    assert repr(error) in str(translated)


def test_the_table_or_bucket_is_described_when_unknown() -> None:
    assert ddb.classify(client_error("ResourceNotFoundException")) == (
        "no_table",
        "no such table (ResourceNotFoundException: from AWS)",
    )
    assert ddb.classify(client_error("NoSuchBucket")) == (
        "no_bucket",
        "no such S3 bucket (NoSuchBucket: from AWS)",
    )
    assert ddb.classify(boto.ClientError({"Error": {"Code": "Odd"}}, "PutItem")) == (
        "unknown",
        "request failed (Odd)",
    )


def test_a_lost_condition_is_not_a_store_failure() -> None:
    translated = ddb.translate_error("put_item", client_error("ConditionalCheckFailedException"))
    assert isinstance(translated, ddb.ConditionFailed)


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_misconfiguration_is_told_from_an_outage(cause: str) -> None:
    error = StoreUnavailableError("failed", cause=cause)
    expected = cause in {
        "no_table",
        "bad_schema",
        "no_bucket",
        "no_credentials",
        "bad_credentials",
        "no_region",
        "access_denied",
        "cannot_open",
        "loop_closed",
    }
    assert error.misconfigured is expected
    # With no phrase of its own, the cause's stands in (the message, for an unknown cause).
    assert error.reason == (CAUSES[cause] if cause != "unknown" else "failed")


def test_the_cause_survives_pickling_and_an_unknown_cause_is_unknown() -> None:
    error = StoreUnavailableError("x", code="Throttling", cause="throttled", reason="slow")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.cause, copy.code, copy.reason, copy.misconfigured) == (
        "throttled",
        "Throttling",
        "slow",
        False,
    )
    assert StoreUnavailableError("x", cause="made_up").cause == "unknown"
    assert StoreUnavailableError().reason == CAUSES["unknown"]
