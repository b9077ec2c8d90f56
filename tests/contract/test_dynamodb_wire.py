"""The lean DynamoDB transport (stores/dynamodb/wire*.py) against botocore itself: the same
signature, the same requests on the wire, the same answers and the same failures, retries,
refreshed credentials and kept-alive connections; on moto, through the fault proxy.

The contract suite (test_store_contract.py) runs every store behaviour on it too (its
DynamoDB kinds use the stores' default transport; its ``dynamodb-sdk`` kinds the SDK's).
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import http.server
import ssl
import subprocess
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aioboto3
import boto3
import botocore.session
import orjson
import pytest
from aiobotocore.credentials import AioRefreshableCredentials
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, RefreshableCredentials
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore
from idempotency_middleware.stores import (
    Claimed,
    ClaimRequest,
    Completion,
    Held,
    StoreUnavailable,
)
from idempotency_middleware.stores.dynamodb import requests as ddb
from idempotency_middleware.stores.dynamodb import wire
from idempotency_middleware.stores.dynamodb.config import (
    ClientSettings,
    Transport,
    WireConfig,
    resolve,
)
from idempotency_middleware.stores.dynamodb.requests import TableLayout
from idempotency_middleware.stores.dynamodb.wire_async import AsyncWireClient
from idempotency_middleware.stores.dynamodb.wire_retry import RetryPolicy
from idempotency_middleware.stores.dynamodb.wire_sync import SyncWireClient
from idempotency_middleware.stores.records import StoredResponse
from tests.conftest import REGION
from tests.support.faultproxy import REPLICATED_WRITE_CONFLICT, FaultProxy
from tests.support.ports import free_port

# --- SigV4, byte for byte ------------------------------------------------------------------

FIXED = datetime.datetime(2026, 11, 25, 15, 4, 5, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize(
    ("url", "token"),
    [
        ("https://dynamodb.eu-west-1.amazonaws.com", None),
        ("https://dynamodb.eu-west-1.amazonaws.com", "session-token/with+odd=chars"),
        ("http://127.0.0.1:8000", None),
        ("https://dynamodb.us-east-1.amazonaws.com:8443/prefix", "t"),
    ],
)
def test_the_signature_is_the_one_botocore_computes(
    url: str, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = b'{"TableName":"t","Key":{"pk":{"S":"k"}}}'
    target = wire.TARGET_PREFIX + "GetItem"
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    request = AWSRequest(
        "POST", url, data=body, headers={"X-Amz-Target": target, "Content-Type": wire.CONTENT_TYPE}
    )
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: FIXED.replace(tzinfo=None))
    SigV4Auth(credentials, "dynamodb", "eu-west-1").add_auth(request)
    frozen = wire.Frozen(credentials.access_key, credentials.secret_key, token)
    ours = wire.Signer(wire.Endpoint.parse(url), "eu-west-1").headers(
        target, body, frozen, FIXED.timestamp()
    )
    assert ours["Authorization"] == request.headers["Authorization"]
    assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
    assert ours.get("X-Amz-Security-Token") == request.headers.get("X-Amz-Security-Token")


def test_the_signing_key_is_derived_once_per_day_and_secret() -> None:
    signer = wire.Signer(wire.Endpoint.parse("http://127.0.0.1:1"), REGION)
    first = signer.headers("T", b"{}", wire.Frozen("a", "secret-1", None), FIXED.timestamp())
    key = signer._key
    signer.headers("T", b"{}", wire.Frozen("a", "secret-1", None), FIXED.timestamp() + 60)
    assert signer._key is key
    second = signer.headers("T", b"{}", wire.Frozen("a", "secret-2", None), FIXED.timestamp())
    assert signer._key is not key and first["Authorization"] != second["Authorization"]


def test_the_modeled_error_members_are_those_of_botocores_service_model() -> None:
    model = botocore.session.Session().get_service_model("dynamodb")
    shapes = {
        shape.name: tuple(shape.members)
        for operation in wire.OPERATIONS.values()
        for shape in model.operation_model(operation).error_shapes
    }
    assert shapes == wire.MODELED_ERROR_MEMBERS


# --- the same requests and answers as the SDK ---------------------------------------------


def _new_table(endpoint: str) -> str:
    name = f"wire-{uuid.uuid4().hex[:10]}"
    with DynamoDBStore(name, endpoint_url=endpoint, region_name=REGION) as store:
        store.create_table()
    return name


@pytest.fixture(scope="module")
def table(moto_endpoint: str) -> str:
    return _new_table(moto_endpoint)


def _config(endpoint: str, **overrides: Any) -> WireConfig:
    settings = ClientSettings(endpoint, REGION, **overrides)
    config = resolve(settings, botocore.session.Session())
    assert config is not None
    return config


def lean(endpoint: str, credentials: Any = None, **overrides: Any) -> SyncWireClient:
    session = botocore.session.Session()
    return SyncWireClient(_config(endpoint, **overrides), credentials or session.get_credentials())


def sdk(endpoint: str) -> Any:
    return boto3.session.Session().client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        config=ClientSettings(endpoint, REGION).botocore_config(),
    )


def request_path_calls(table: str, key: str) -> list[tuple[str, dict[str, Any]]]:
    """One of each call the stores make on ``key``, blobs included, built by the stores' own
    builders; run in order on an empty key, every outcome kind comes up once."""
    layout = TableLayout(table)
    owner = uuid.uuid4().hex
    now = time.time()
    claim = ClaimRequest(key, "fp", owner, now, 30.0)
    response = StoredResponse(201, [(b"content-type", b"application/json")], b"\x00\xff{}")
    plan = ddb.plan_completion(layout, Completion(key, owner, now, 60.0, response), None)
    business = {"Put": {"TableName": table, "Item": {"pk": {"S": f"order-{key}"}}}}
    writes = Completion(key, owner, now, 60.0, response, writes=(business,))
    transaction = ddb.transaction_request(
        ddb.plan_completion(layout, writes, None), writes.writes, owner
    )
    return [
        ("put_item", ddb.claim_request(layout, claim)),
        ("update_item", plan.request),
        ("get_item", ddb.get_request(layout, key)),
        ("put_item", ddb.claim_request(layout, claim)),  # a failed condition, with ALL_OLD
        ("delete_item", ddb.release_request(layout, key, owner)),  # a failed condition
        ("delete_item", ddb.delete_request(layout, key)),
        ("put_item", ddb.claim_request(layout, claim)),
        ("transact_write_items", transaction),
        ("transact_write_items", transaction),  # cancelled: the reasons, with the item
        ("get_item", ddb.get_request(layout, "absent-" + key)),
    ]


def outcomes(client: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each call's result or ``error.response``, without what differs per attempt."""
    answers: list[Any] = []
    for method, params in calls:
        try:
            result = getattr(client, method)(**params)
        except ClientError as error:
            answer = dict(error.response)
        else:
            answer = dict(result)
        metadata = answer.pop("ResponseMetadata")
        answers.append((answer, metadata["HTTPStatusCode"], metadata["RetryAttempts"]))
    return answers


def forget_key(endpoint: str, table: str, key: str) -> None:
    client = sdk(endpoint)
    for pk in (key, f"order-{key}"):
        client.delete_item(TableName=table, Key={"pk": {"S": pk}})


@pytest.fixture(params=["moto", "dynamodb-local"])
def server(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A DynamoDB endpoint and a fresh table on it: moto, and Amazon's DynamoDB Local
    (skipped unless ``IDEMPOTENCY_DYNAMODB_LOCAL_URL`` is set: scripts/dynamodb-local.sh)."""
    fixture = "moto_endpoint" if request.param == "moto" else "dynamodb_local_endpoint"
    endpoint: str = request.getfixturevalue(fixture)
    return endpoint, _new_table(endpoint)


def test_the_lean_client_sends_what_boto3_sends_and_answers_what_it_answers(
    server: tuple[str, str],
) -> None:
    endpoint, table = server
    key = uuid.uuid4().hex
    calls = request_path_calls(table, key)
    with FaultProxy(endpoint) as proxy:
        theirs = outcomes(sdk(proxy.url), calls)
        by_sdk = proxy.seen()
        proxy.forget()
        forget_key(endpoint, table, key)
        ours = outcomes(lean(proxy.url), calls)
        by_lean = proxy.seen()
    assert [seen.operation for seen in by_lean] == [seen.operation for seen in by_sdk]
    for mine, boto3s in zip(by_lean, by_sdk, strict=True):
        assert orjson.loads(mine.body) == orjson.loads(boto3s.body)
    assert ours == theirs
    assert any(
        isinstance(answer[0].get("Item", {}).get("response", {}).get("B"), bytes) for answer in ours
    )


def test_an_async_lean_client_answers_what_the_sync_one_answers(
    server: tuple[str, str],
) -> None:
    endpoint, table = server
    key = uuid.uuid4().hex
    calls = request_path_calls(table, key)
    sync_answers = outcomes(lean(endpoint), calls)
    forget_key(endpoint, table, key)

    async def run() -> list[Any]:
        async with await async_lean(endpoint) as client:
            return await async_outcomes(client, calls)

    assert asyncio.run(run()) == sync_answers


async def async_lean(endpoint: str, credentials: Any = None, **overrides: Any) -> AsyncWireClient:
    if credentials is None:
        from aiobotocore.session import AioSession

        credentials = await AioSession().get_credentials()
    return AsyncWireClient(_config(endpoint, **overrides), credentials)


async def async_outcomes(client: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    answers: list[Any] = []
    for method, params in calls:
        try:
            result = await getattr(client, method)(**params)
        except ClientError as error:
            answer = dict(error.response)
        else:
            answer = dict(result)
        metadata = answer.pop("ResponseMetadata")
        answers.append((answer, metadata["HTTPStatusCode"], metadata["RetryAttempts"]))
    return answers


def test_backoff_is_jittered_exponential_capped_and_bounded_by_the_quota() -> None:
    policy = RetryPolicy(max_attempts=10, random=lambda: 1.0)
    throttled = wire.Answer(400, {}, b'{"__type":"x#ThrottlingException","message":"slow"}')
    delays = [policy.after_answer(attempt, throttled)[0] for attempt in range(1, 8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    # Retryable (a cost), but the tenth try was the last: no delay, MaxAttemptsReached.
    assert policy.after_answer(10, throttled) == (None, 5)
    refused = wire.Answer(400, {}, b'{"__type":"x#ValidationException","message":"no"}')
    assert policy.after_answer(1, refused) == (None, 0)
    assert policy.after_exception(1, ValueError("a bug, not the network")) == (None, 0)
    timeout = ReadTimeoutError(endpoint_url="http://x")
    assert policy.after_exception(1, timeout)[1] == 10  # a timeout costs twice the quota
    policy.quota.available = 4
    assert policy.after_answer(1, throttled)[0] is None  # quota spent: no retry
    policy.succeeded(0)
    assert policy.quota.available == 5


def test_a_checksum_mismatch_is_retried_as_botocore_retries_it() -> None:
    policy = RetryPolicy(max_attempts=2, random=lambda: 0.5)
    body = b'{"Item":{}}'
    assert policy.after_answer(1, wire.Answer(200, {"x-amz-crc32": "1"}, body))[0] == 0.5
    good = str(zlib.crc32(body))
    assert policy.after_answer(1, wire.Answer(200, {"x-amz-crc32": good}, body)) == (None, 0)


# --- faults: retried as botocore retries them, raised as botocore raises them -------------

FAST: dict[str, Any] = {"connect_timeout": 0.5, "read_timeout": 0.5}


def get(table: str) -> dict[str, Any]:
    return ddb.get_request(TableLayout(table), "some-key")


class Flavour:
    """Runs a call on a sync or an async lean client (a fresh loop per client)."""

    def __init__(self, is_async: bool, endpoint: str, **overrides: Any) -> None:
        self.is_async = is_async
        self.loop = asyncio.new_event_loop()
        self.client: Any = (
            self.loop.run_until_complete(async_lean(endpoint, **overrides))
            if is_async
            else lean(endpoint, **overrides)
        )
        # No jitter: retries at once (the backoff itself is tested on the policy alone).
        self.client._retry.random = lambda: 0.0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        if self.is_async:
            result: dict[str, Any] = self.loop.run_until_complete(
                getattr(self.client, method)(**params)
            )
            return result
        result = getattr(self.client, method)(**params)
        return result

    def close(self) -> None:
        self.client.close()
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Callable[..., Flavour]:
    made: list[Flavour] = []

    def make(endpoint: str, **overrides: Any) -> Flavour:
        made.append(Flavour(request.param == "async", endpoint, **overrides))
        return made[-1]

    def close_all() -> None:
        for each in made:
            each.close()

    request.addfinalizer(close_all)
    return make


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as started:
        yield started


def test_a_throttled_call_is_retried_once_and_then_succeeds(
    proxy: FaultProxy, table: str, flavour: Callable[..., Flavour]
) -> None:
    client = flavour(proxy.url)
    proxy.set("throttle", count=1)
    result = client.call("get_item", **get(table))
    assert result["ResponseMetadata"]["RetryAttempts"] == 1
    assert [seen.fault for seen in proxy.seen()] == ["throttle", "pass"]


@pytest.mark.parametrize(
    ("mode", "options", "code"),
    [
        ("throttle", {}, "ThrottlingException"),
        ("error", {}, "InternalServerError"),
        ("error", {"error_status": 503, "error_code": "ServiceUnavailable"}, "ServiceUnavailable"),
        ("error", {"error_status": 409, "error_code": REPLICATED_WRITE_CONFLICT}, None),
    ],
)
def test_retryable_answers_are_tried_max_attempts_times_then_raised_as_client_errors(
    proxy: FaultProxy,
    table: str,
    flavour: Callable[..., Flavour],
    mode: Any,
    options: dict[str, Any],
    code: str | None,
) -> None:
    client = flavour(proxy.url, max_attempts=3)
    proxy.set(mode, **options)
    with pytest.raises(ClientError) as raised:
        client.call("get_item", **get(table))
    assert raised.value.response["Error"]["Code"] == (code or REPLICATED_WRITE_CONFLICT)
    assert raised.value.response["ResponseMetadata"]["MaxAttemptsReached"] is True
    assert len(proxy.seen()) == 3


def test_a_refused_request_is_not_retried(
    proxy: FaultProxy, table: str, flavour: Callable[..., Flavour]
) -> None:
    client = flavour(proxy.url, max_attempts=3)
    proxy.set("error", error_status=400, error_code="ValidationException")
    with pytest.raises(ClientError) as raised:
        client.call("get_item", **get(table))
    assert raised.value.response["Error"]["Code"] == "ValidationException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert len(proxy.seen()) == 1


def test_a_hanging_server_times_out_on_every_attempt(
    proxy: FaultProxy, table: str, flavour: Callable[..., Flavour]
) -> None:
    client = flavour(proxy.url, **FAST)
    proxy.set("hang")
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        client.call("get_item", **get(table))
    assert len(proxy.seen()) == 2
    assert time.monotonic() - started < 0.5 * 2 + 1.0 + 1.0  # two timeouts, one backoff


@pytest.mark.parametrize("mode", ["cut", "swallow", "refuse"])
def test_a_connection_cut_mid_answer_is_retried_on_a_new_connection(
    proxy: FaultProxy, table: str, flavour: Callable[..., Flavour], mode: Any
) -> None:
    client = flavour(proxy.url, **FAST)
    client.call("get_item", **get(table))  # a kept-alive connection in the pool
    proxy.forget()
    proxy.set(mode, count=1)
    result = client.call("get_item", **get(table))
    assert result["ResponseMetadata"]["RetryAttempts"] == 1


@pytest.mark.parametrize("mode", ["cut", "refuse"])
def test_a_connection_cut_on_every_attempt_raises_connection_closed(
    proxy: FaultProxy, table: str, flavour: Callable[..., Flavour], mode: Any
) -> None:
    client = flavour(proxy.url, **FAST)
    proxy.set(mode)
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        client.call("get_item", **get(table))


def test_nothing_listening_raises_endpoint_connection_error(
    table: str, flavour: Callable[..., Flavour]
) -> None:
    client = flavour(f"http://127.0.0.1:{free_port()}", **FAST)
    with pytest.raises(EndpointConnectionError):
        client.call("get_item", **get(table))


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 64  # the default backlog (5) would refuse concurrent connections


class KeepAliveServer:
    """A local HTTP/1.1 server that keeps connections alive (moto's closes each one) and
    answers every request ``{}``, recording each request's client port and target."""

    def __init__(self, close_after_answer: bool = False) -> None:
        seen = self.seen = []  # type: list[tuple[int, str]]

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append((self.client_address[1], self.headers["X-Amz-Target"]))
                self.send_response(200)
                self.send_header("Content-Type", wire.CONTENT_TYPE)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                # As a server closing idle connections does: no "Connection: close" said.
                self.close_connection = close_after_answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def connections(self) -> int:
        return len({port for port, _ in self.seen})


@pytest.fixture
def keep_alive() -> Iterator[KeepAliveServer]:
    server = KeepAliveServer()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


def test_calls_reuse_one_kept_alive_connection(
    keep_alive: KeepAliveServer, table: str, flavour: Callable[..., Flavour]
) -> None:
    client = flavour(keep_alive.url)
    for method in ("put_item", "update_item", "delete_item", "get_item", "transact_write_items"):
        assert client.call(method)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert keep_alive.connections() == 1
    assert [target for _, target in keep_alive.seen] == [
        wire.TARGET_PREFIX + name for name in wire.OPERATIONS.values()
    ]


class FramedAnswers(http.server.BaseHTTPRequestHandler):
    """Answers a GetItem with a blob, chunked (``/chunked`` target suffix aside, by the
    table name) or with no length at all, the body running to the connection's end."""

    protocol_version = "HTTP/1.1"
    body = b'{"Item":{"pk":{"S":"k"},"blob":{"B":"AAE="}}}'

    def do_POST(self) -> None:
        request = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", wire.CONTENT_TYPE)
        if request["TableName"] == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(self.body) // 2
            for part in (self.body[:half], self.body[half:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.end_headers()
            self.wfile.write(self.body)
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("framing", ["chunked", "to-the-end"])
def test_answers_chunked_or_without_a_length_are_read_whole(
    flavour: Callable[..., Flavour], framing: str
) -> None:
    server = Server(("127.0.0.1", 0), FramedAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = flavour(f"http://127.0.0.1:{server.server_address[1]}")
        for _ in range(2):
            item = client.call("get_item", TableName=framing)["Item"]
            assert item == {"pk": {"S": "k"}, "blob": {"B": b"\x00\x01"}}
    finally:
        server.shutdown()
        server.server_close()


def test_a_connection_the_server_closed_while_idle_is_not_reused(
    flavour: Callable[..., Flavour],
) -> None:
    server = KeepAliveServer(close_after_answer=True)
    try:
        client = flavour(server.url)
        for _ in range(3):
            client.call("get_item", TableName="t")
            time.sleep(0.05)  # the server's FIN arrives while the connection is idle
    finally:
        server.server.shutdown()
        server.server.server_close()
    assert server.connections() == 3 and len(server.seen) == 3  # no request sent twice


def test_concurrent_calls_each_take_a_connection_and_the_pool_keeps_them(
    keep_alive: KeepAliveServer,
) -> None:
    async def run() -> int:
        async with await async_lean(keep_alive.url) as client:
            await asyncio.gather(*(client.get_item(TableName="t") for _ in range(8)))
            idle = len(client._idle)
            await asyncio.gather(*(client.get_item(TableName="t") for _ in range(8)))
            return idle

    assert asyncio.run(run()) == 8
    assert keep_alive.connections() == 8


def test_the_sync_pool_serves_threads_at_once_and_keeps_at_most_its_size(
    keep_alive: KeepAliveServer,
) -> None:
    client = lean(keep_alive.url, max_pool_connections=3)
    start = threading.Barrier(6, timeout=60)

    def call() -> None:
        start.wait(5)
        client.get_item(TableName="t")

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(keep_alive.seen) == 6
    assert len(client._idle) <= 3
    client.close()
    assert len(client._idle) == 0


# --- credentials: botocore's chain, refreshed when they expire ----------------------------


def _expiring(access_key: str, seconds: float) -> dict[str, str]:
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return {
        "access_key": access_key,
        "secret_key": "secret",
        "token": "token",
        "expiry_time": expiry.isoformat(),
    }


def test_expired_credentials_are_refreshed_before_a_request(proxy: FaultProxy, table: str) -> None:
    refreshes: list[str] = []

    def refresh() -> dict[str, str]:
        refreshes.append("refreshed")
        return _expiring(f"KEY{len(refreshes)}", 3600)

    credentials = RefreshableCredentials.create_from_metadata(
        _expiring("KEY0", -10), refresh, "test"
    )
    client = lean(proxy.url, credentials)
    signed: list[str] = []
    client.meta.events.register(
        "before-send.dynamodb", lambda request, **_: signed.append(request.headers["Authorization"])
    )
    client.get_item(**get(table))
    client.get_item(**get(table))
    assert refreshes == ["refreshed"]
    assert all("Credential=KEY1/" in header for header in signed)


def test_expired_credentials_are_refreshed_on_the_async_client(
    proxy: FaultProxy, table: str
) -> None:
    refreshes: list[str] = []

    async def refresh() -> dict[str, str]:
        refreshes.append("refreshed")
        return _expiring(f"KEY{len(refreshes)}", 3600)

    async def run() -> list[str]:
        credentials = AioRefreshableCredentials.create_from_metadata(
            _expiring("KEY0", -10), refresh, "test"
        )
        signed: list[str] = []
        async with await async_lean(proxy.url, credentials) as client:
            client.meta.events.register(
                "before-send.dynamodb",
                lambda request, **_: signed.append(request.headers["Authorization"]),
            )
            await client.get_item(**get(table))
            await client.get_item(**get(table))
        return signed

    signed = asyncio.run(run())
    assert refreshes == ["refreshed"]
    assert all("Credential=KEY1/" in header for header in signed)


def test_no_credentials_raise_what_botocore_raises(moto_endpoint: str, table: str) -> None:
    from botocore.exceptions import NoCredentialsError

    client = SyncWireClient(_config(moto_endpoint), None)
    with pytest.raises(NoCredentialsError):
        client.get_item(**get(table))


# --- the stores: which transport, and the same failures either way ------------------------


def test_stores_use_the_lean_transport_unless_given_a_session_or_told_otherwise(
    moto_endpoint: str, table: str
) -> None:
    assert isinstance(DynamoDBStore(table, endpoint_url=moto_endpoint).client, SyncWireClient)
    session = boto3.session.Session(region_name=REGION)
    for store in (
        DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION, session=session),
        DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION, transport="sdk"),
        DynamoDBStore(
            table, endpoint_url=moto_endpoint, region_name=REGION, client_kwargs={"verify": False}
        ),
    ):
        assert not isinstance(store.client, SyncWireClient)
        store.close()

    async def async_client() -> Any:
        async with AsyncDynamoDBStore(
            table, endpoint_url=moto_endpoint, region_name=REGION
        ) as store:
            return await store.client()

    assert isinstance(asyncio.run(async_client()), AsyncWireClient)


def test_a_lean_transport_that_cannot_honour_the_options_is_refused() -> None:
    with pytest.raises(ValueError, match="session or client_kwargs"):
        DynamoDBStore("t", transport="lean", session=boto3.session.Session())
    with pytest.raises(ValueError, match="transport must be one of"):
        AsyncDynamoDBStore("t", transport="botocore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="session or client_kwargs"):
        AsyncDynamoDBStore("t", transport="lean", session=aioboto3.Session())


def test_a_proxy_keeps_the_store_on_the_sdk(
    moto_endpoint: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    store = DynamoDBStore(
        table, endpoint_url="https://dynamodb.example.invalid", region_name=REGION
    )
    assert not isinstance(store.client, SyncWireClient)
    store.close()


FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("throttle", {}),
    ("error", {}),
    ("error", {"error_status": 400, "error_code": "AccessDeniedException"}),
    ("error", {"error_status": 400, "error_code": "ResourceNotFoundException"}),
    ("error", {"error_status": 400, "error_code": "UnrecognizedClientException"}),
    ("error", {"error_status": 409, "error_code": REPLICATED_WRITE_CONFLICT}),
    ("hang", {}),
    ("cut", {}),
    ("refuse", {}),
]


@pytest.mark.parametrize(("mode", "options"), FAULTS, ids=lambda value: str(value))
def test_a_store_failure_is_classified_as_on_the_sdk(
    proxy: FaultProxy, table: str, mode: Any, options: dict[str, Any]
) -> None:
    def failure(transport: Transport) -> tuple[str, str, str, str]:
        with DynamoDBStore(
            table, endpoint_url=proxy.url, region_name=REGION, transport=transport, **FAST
        ) as store:
            store.client  # noqa: B018 - made before the fault
            proxy.set(mode, **options)
            try:
                with pytest.raises(StoreUnavailable) as raised:
                    store.claim(ClaimRequest(uuid.uuid4().hex, "fp", "owner", time.time(), 5))
            finally:
                proxy.set("pass")
        error = raised.value
        # The stores read the code, never the class: boto3 raises ClientError's modeled
        # subclasses (ThrottlingException ...); a reset races the connect, so either side
        # may see it as EndpointConnectionError or ConnectionClosedError (both unreachable).
        answered = isinstance(error.__cause__, ClientError)
        return error.cause, error.code, error.reason, "answered" if answered else "no answer"

    assert failure("lean") == failure("sdk")


def test_a_failed_claim_condition_returns_the_holder_as_on_the_sdk(
    moto_endpoint: str, table: str
) -> None:
    key = uuid.uuid4().hex
    now = time.time()
    holders = []
    transports: tuple[Transport, ...] = ("lean", "sdk")
    for transport in transports:
        with DynamoDBStore(
            table, endpoint_url=moto_endpoint, region_name=REGION, transport=transport
        ) as store:
            store.claim(ClaimRequest(key, "fp", "first", now, 30))
            holders.append(store.claim(ClaimRequest(key, "fp", "second", now, 30)))
            store.delete(key)
    assert holders[0] == holders[1]


def test_the_lean_client_stands_in_for_the_sdk_client_beyond_its_five_calls(
    moto_endpoint: str, table: str
) -> None:
    with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        calls: list[str] = []
        store.client.meta.events.register(
            "before-call.dynamodb", lambda model, **_: calls.append(model.name)
        )
        assert store.client.describe_table(TableName=table)["Table"]["TableName"] == table
        store.get("absent")
        assert calls == ["DescribeTable", "GetItem"]

    async def run() -> str:
        async with AsyncDynamoDBStore(table, endpoint_url=moto_endpoint) as store:
            client = await store.client()
            described = await client.describe_table(TableName=table)
            return str(described["Table"]["TableName"])

    assert asyncio.run(run()) == table


def test_a_client_whose_loop_closed_closes_without_raising_and_refuses_other_loops(
    keep_alive: KeepAliveServer,
) -> None:
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(async_lean(keep_alive.url))
    loop.run_until_complete(client.get_item(TableName="t"))
    assert len(client._idle) == 1
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        asyncio.run(client.get_item(TableName="t"))
    with warnings.catch_warnings():
        # asyncio cannot close a transport of a closed loop; the collector releases it.
        warnings.simplefilter("ignore", ResourceWarning)
        client.close()
        assert client._idle == []
        gc.collect()


def test_a_success_status_with_a_body_that_is_not_json_is_a_parser_error() -> None:
    from botocore.parsers import ResponseParserError

    with pytest.raises(ResponseParserError):
        wire.parse_success(wire.Answer(200, {}, b"<html>proxy</html>"), 1)
    assert (
        wire.parse_success(wire.Answer(200, {}, b""), 1)["ResponseMetadata"]["RetryAttempts"] == 0
    )


# --- resolution: botocore's, once per store -------------------------------------------------


def test_the_endpoint_and_region_are_botocores(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ClientSettings(None, "eu-west-1")
    config = resolve(settings, botocore.session.Session())
    assert config is not None
    assert config.endpoint.url == "https://dynamodb.eu-west-1.amazonaws.com"
    assert config.endpoint.host_header == "dynamodb.eu-west-1.amazonaws.com"
    assert config.ssl_context is not None and config.ssl_context.verify_mode == ssl.CERT_REQUIRED
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8123")
    configured = resolve(settings, botocore.session.Session())
    assert configured is not None and configured.endpoint.url == "http://127.0.0.1:8123"
    assert configured.ssl_context is None
    assert (configured.connect_timeout, configured.read_timeout, configured.max_attempts) == (
        settings.connect_timeout,
        settings.read_timeout,
        settings.max_attempts,
    )


def test_no_region_raises_what_botocore_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import NoRegionError

    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(NoRegionError):
        resolve(ClientSettings("http://127.0.0.1:1", None), botocore.session.Session())


# --- TLS: verified, with botocore's CA bundle or the configured one -----------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A keep-alive HTTPS server on 127.0.0.1 with a self-signed certificate for
    ``localhost``; its URL and the certificate (the CA bundle that trusts it)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server = KeepAliveServer()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
    try:
        yield f"https://localhost:{server.server.server_address[1]}", cert
    finally:
        server.server.shutdown()
        server.server.server_close()


def test_tls_is_verified_against_botocores_ca_bundle(
    tls_server: tuple[str, Path], flavour: Callable[..., Flavour]
) -> None:
    from botocore.exceptions import SSLError

    url, _ = tls_server
    client = flavour(url, **FAST)
    with pytest.raises(SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        client.call("get_item", TableName="t")


def test_tls_trusts_the_configured_ca_bundle(
    tls_server: tuple[str, Path], flavour: Callable[..., Flavour], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = tls_server
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    client = flavour(url, **FAST)
    for _ in range(2):
        assert client.call("get_item", TableName="t")["ResponseMetadata"]["HTTPStatusCode"] == 200


# --- a declined condition, as the stores take it -------------------------------------------


def _holder(table: str, key: str) -> dict[str, Any]:
    return {
        "pk": {"S": key},
        "response": {"B": b"\x00stored\xff"},
        "parts": {"L": [{"B": b"one"}, {"S": "two"}, {"M": {"deep": {"B": b"three"}}}]},
        "blobs": {"BS": [b"four"]},
    }


def test_a_declined_condition_answers_the_item_the_client_error_carries(
    moto_endpoint: str, table: str, flavour: Callable[..., Flavour]
) -> None:
    client = flavour(moto_endpoint)
    key = uuid.uuid4().hex
    client.call("put_item", TableName=table, Item=_holder(table, key))
    claim = {
        "TableName": table,
        "Item": {"pk": {"S": key}},
        "ConditionExpression": "attribute_not_exists(pk)",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    with pytest.raises(ClientError) as raised:
        client.call("put_item", **claim)
    seen: list[str] = []
    client.client.meta.events.register(
        "before-send", lambda event_name, **_: seen.append(event_name)
    )

    def declining(params: dict[str, Any]) -> Any:
        answer = client.client.declining("put_item", params)
        return client.loop.run_until_complete(answer) if client.is_async else answer

    declined = declining(claim)
    assert type(declined) is wire.Declined
    assert declined.item == raised.value.response["Item"] == _holder(table, key)
    assert seen == ["before-send.dynamodb.PutItem"]  # sent as put_item is: its events too
    # Without ALL_OLD on failure the item is not known; a success answers as put_item does.
    del claim["ReturnValuesOnConditionCheckFailure"]
    assert declining(claim) == wire.Declined(None)
    claim["Item"] = {"pk": {"S": uuid.uuid4().hex}}
    assert declining(claim)["ResponseMetadata"]["HTTPStatusCode"] == 200
    # Any other failure is raised as put_item raises it.
    with pytest.raises(ClientError) as other:
        declining({**claim, "TableName": "no-such-table"})
    assert other.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_a_declined_condition_without_an_item_is_declined_without_one() -> None:
    assert wire.Declined.of({"Item": {}}) == wire.Declined(None)
    assert wire.Declined.of({"Item": "not an item"}) == wire.Declined(None)
    assert wire.Declined.of({}) == wire.Declined(None)
    item = {"response": {"B": "AP8="}, "pk": {"S": "k"}}
    assert wire.Declined.of({"Item": item}) == wire.Declined(
        {"response": {"B": b"\x00\xff"}, "pk": {"S": "k"}}
    )


def test_an_error_body_is_read_as_botocore_reads_it() -> None:
    def answer(status: int, body: bytes) -> wire.Answer:
        return wire.Answer(status, {}, body)

    typed = answer(400, b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException"}')
    assert wire.read_error(typed) == (
        "ThrottlingException",
        {"__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException"},
    )
    assert wire.read_error(answer(502, b"<html>bad gateway</html>")) == (
        "502",
        {"message": "<html>bad gateway</html>"},
    )
    assert wire.read_error(answer(400, b"[1]")) == ("400", {})
    assert wire.read_error(answer(500, b"")) == ("500", {})
    policy = RetryPolicy(3, random=lambda: 0.0)
    assert policy.after_answer(1, typed) == policy.after_answer(1, typed, "ThrottlingException")
    assert policy.after_answer(1, typed, "ValidationException") == (None, 0)


CCF = "ConditionalCheckFailedException"


@pytest.mark.parametrize("transport", ["lean", "sdk"])
def test_a_failed_claim_without_the_holder_reads_it_and_a_failed_release_is_false(
    proxy: FaultProxy, table: str, transport: Transport
) -> None:
    # A backend that ignores ReturnValuesOnConditionCheckFailure answers the failed claim
    # without the item: the store reads the holder. Any other failed condition (a release
    # that is no longer ours) answers False, the lean client's Declined raised into its flow.
    key, now = uuid.uuid4().hex, time.time()
    with DynamoDBStore(
        table, endpoint_url=proxy.url, region_name=REGION, transport=transport
    ) as store:
        store.claim(ClaimRequest(key, "fp", "first", now, 30))
        proxy.set("error", operations=["PutItem"], count=1, error_status=400, error_code=CCF)
        held = store.claim(ClaimRequest(key, "fp", "second", now, 30))
        assert [seen.operation for seen in proxy.seen()][-2:] == ["PutItem", "GetItem"]
        assert isinstance(held, Held) and held.record.owner == "first"
        assert store.release(key, "second") is False
        assert store.release(key, "first") is True


async def test_the_async_store_takes_a_failed_claim_and_release_as_the_sync_one(
    moto_endpoint: str, table: str
) -> None:
    key, now = uuid.uuid4().hex, time.time()
    async with AsyncDynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        assert isinstance(await store.client(), AsyncWireClient)
        assert await store.aclaim(ClaimRequest(key, "fp", "first", now, 30)) == Claimed()
        held = await store.aclaim(ClaimRequest(key, "fp", "second", now, 30))
        assert isinstance(held, Held) and held.record.owner == "first"
        assert await store.arelease(key, "second") is False
        assert await store.arelease(key, "first") is True
