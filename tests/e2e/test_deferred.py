"""Deferred completion: ``defer_completion()``, ``complete_deferred`` and ``release_deferred``.

What a store guarantees (claim a key, store its interim response as deferred, then finish
it by token) is part of the store contract, tests/contract/test_store_contract.py, on every store
kind. Here:

- the token: its alphabet, and that it carries neither the client's key nor the scope value;
- HTTP: both middlewares on real servers (uvicorn, waitress), a handler that defers and
  hands its token to the test, which finishes the work as a worker would;
- ``records.decode_response_document``, the reader of a response written by a Step Functions
  state, and what a retry gets when such a response cannot be read (410, never a 500).

The DynamoDB Local cases (ids containing ``dynamodb-local``) are reported as skipped unless
``scripts/dynamodb-local.sh`` runs them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import aioboto3
import boto3
import httpx
import orjson
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response
from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyEvent,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    SQLiteStore,
    defer_completion,
    idempotent,
    scope_by_tenant_header,
)
from idempotency_middleware.handler.deferred import parse_token
from idempotency_middleware.stores.dynamodb import MAX_ITEM_RESPONSE_BYTES
from idempotency_middleware.stores.protocol import (
    Claimed,
)
from idempotency_middleware.stores.records import (
    Status,
    StoredResponse,
    decode_response_document,
)
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION, table_creator
from tests.contract.test_store_contract import claim_for, interim_completion, token_for
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi, serve_wsgi

T = TypeVar("T")

LOCK = 30.0
TTL = 3600.0
KEY_HEADER = "Idempotency-Key"
TOKEN_ALPHABET = re.compile(r"[A-Za-z0-9_.~-]+")


def answer(value: object) -> bool:
    """A store's answer, which must be a real ``bool`` (``is True`` / ``is False`` below)."""
    assert isinstance(value, bool), value
    return value


@pytest.fixture(scope="module")
def sessions() -> tuple[Any, Any]:
    """boto3 and aioboto3 sessions for the module, so service models load once."""
    return boto3.session.Session(region_name=REGION), aioboto3.Session(region_name=REGION)


def make_table(endpoint: str) -> str:
    name = f"deferred-{uuid.uuid4().hex[:12]}"
    with table_creator(name, endpoint) as creator:
        creator.create_table()
    return name


@pytest.fixture(scope="module")
def moto_table(moto_endpoint: str) -> str:
    """One table on moto for the module: every test uses its own random keys."""
    return make_table(moto_endpoint)


@pytest.fixture(scope="module")
def local_table(dynamodb_local_endpoint: str) -> str:
    """``moto_table`` on DynamoDB Local."""
    return make_table(dynamodb_local_endpoint)


class Target(NamedTuple):
    endpoint: str
    table: str


def dynamodb_target(request: pytest.FixtureRequest, local: bool) -> Target:
    if local:
        return Target(
            request.getfixturevalue("dynamodb_local_endpoint"),
            request.getfixturevalue("local_table"),
        )
    return Target(request.getfixturevalue("moto_endpoint"), request.getfixturevalue("moto_table"))


# --- the token ----------------------------------------------------------------------------

CLIENT_KEY = "Client-Key-7f3a9c2e-VERY-SECRET-0001"
TENANT = "tenant-ACME-Corporation-4242"


def base64_decodings(text: str) -> Iterator[bytes]:
    """Every substring of ``text`` decoded as URL-safe and as standard base64."""
    for start in range(len(text)):
        for end in range(start + 2, len(text) + 1):
            piece = text[start:end]
            padded = piece + "=" * (-len(piece) % 4)
            with contextlib.suppress(binascii.Error, ValueError):
                yield base64.urlsafe_b64decode(padded)
            with contextlib.suppress(binascii.Error, ValueError):
                yield base64.b64decode(padded, validate=True)


def test_the_secrecy_check_would_find_an_encoded_key() -> None:
    # The check below can fail: a key hidden in base64 anywhere in a token is found.
    encoded = base64.urlsafe_b64encode(CLIENT_KEY.encode()).decode().rstrip("=")
    assert any(CLIENT_KEY.encode() in d for d in base64_decodings(f"x.{encoded}.1"))


@pytest.mark.parametrize("adapter", ["asgi", "wsgi"])
def test_a_token_names_neither_the_client_key_nor_the_scope(
    request: pytest.FixtureRequest, adapter: str
) -> None:
    with contextlib.ExitStack() as stack:
        served = start_server(
            request, stack, adapter, "memory", scope=scope_by_tenant_header("X-Tenant-Id")
        )
        answer = served.client.post(
            "/jobs", json={"n": 1}, headers={KEY_HEADER: CLIENT_KEY, "X-Tenant-Id": TENANT}
        )
        assert answer.status_code == 202
        [token] = served.state.tokens

    assert TOKEN_ALPHABET.fullmatch(token), token
    key_hash, owner, expires_at = token.split(".")
    assert re.fullmatch(r"[0-9a-f]{64}", key_hash)
    assert re.fullmatch(r"[0-9a-f]{24}-[0-9a-f]+", owner)
    assert int(expires_at) == pytest.approx(time.time() + 86400, abs=120)  # the default TTL
    secrets = [CLIENT_KEY, TENANT, "t:" + TENANT]
    lowered = token.lower()
    for secret in secrets:
        assert secret.lower() not in lowered
    decoded = [*base64_decodings(token), bytes.fromhex(key_hash)]
    for secret in secrets:
        assert not [d for d in decoded if secret.encode() in d], secret


def test_defer_completion_outside_a_covered_request_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match=r"defer_completion\(\)"):
        defer_completion()


def test_defer_completion_inside_an_idempotent_function_is_a_lookup_error() -> None:
    store = MemoryStore()
    calls: list[str] = []

    @idempotent(store=store, key="key")
    def work(key: str) -> str:
        calls.append(key)
        return defer_completion()

    @idempotent(store=store, key="key")
    async def awork(key: str) -> str:
        calls.append(key)
        return defer_completion()

    with pytest.raises(LookupError, match="idempotent"):
        work(key="k-1")

    async def call_awork() -> str:
        return await awork(key="k-2")

    with pytest.raises(LookupError, match="idempotent"):
        asyncio.run(call_awork())
    # It raised, so nothing was kept: the key runs again.
    with pytest.raises(LookupError):
        work(key="k-1")
    assert calls == ["k-1", "k-2", "k-1"]
    assert len(store) == 0


# --- HTTP: both middlewares on real servers ----------------------------------------------


class JobsState:
    """Shared by a test and its app: handler runs per endpoint, the tokens handed out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, int] = {}
        self.tokens: list[str] = []
        self.early_completions: list[bool] = []
        self.lookup_errors: list[str] = []

    def run(self, endpoint: str) -> int:
        with self._lock:
            self._runs[endpoint] = self._runs.get(endpoint, 0) + 1
            return self._runs[endpoint]

    def runs(self, endpoint: str) -> int:
        with self._lock:
            return self._runs.get(endpoint, 0)


FINAL_STATUS = 200
FINAL_HEADERS = [(b"content-type", b"application/json")]
FINAL = b'{"done":true}'


def accepted(run: int) -> bytes:
    return orjson.dumps({"job": run, "state": "accepted"})


def build_fastapi(state: JobsState, store: Any) -> FastAPI:
    app = FastAPI()

    def reply(body: bytes, status: int = 202) -> Response:
        return Response(body, status_code=status, media_type="application/json")

    @app.post("/jobs")
    async def jobs(request: Request) -> Response:
        await request.body()
        run = state.run("jobs")
        state.tokens.append(defer_completion())
        return reply(accepted(run))

    @app.post("/jobs-sync")
    def jobs_sync() -> Response:
        # A sync route runs in Starlette's thread pool, with the request's context copied.
        run = state.run("jobs-sync")
        state.tokens.append(defer_completion())
        return reply(accepted(run))

    @app.post("/fast")
    async def fast() -> Response:
        # The worker is so fast that it finishes before the interim response is stored.
        run = state.run("fast")
        token = defer_completion()
        state.tokens.append(token)
        done = await store.acomplete_deferred(token, FINAL_STATUS, FINAL_HEADERS, FINAL)
        state.early_completions.append(done)
        return reply(accepted(run))

    @app.post("/fast-then-fail")
    async def fast_then_fail() -> Response:
        # The worker finished the work, then the handler fails (an error after the hand-off).
        run = state.run("fast-then-fail")
        token = defer_completion()
        done = await store.acomplete_deferred(token, FINAL_STATUS, FINAL_HEADERS, FINAL)
        state.early_completions.append(done)
        return reply(accepted(run), 503)

    @app.post("/defer-then-fail")
    async def defer_then_fail() -> Response:
        run = state.run("defer-then-fail")
        state.tokens.append(defer_completion())
        return reply(accepted(run), 503)

    @app.post("/probe")
    async def probe() -> Response:
        try:
            defer_completion()
        except LookupError as error:
            state.lookup_errors.append(str(error))
        return reply(b"{}", 200)

    return app


def build_flask(state: JobsState, store: Any) -> Flask:
    app = Flask("deferred_jobs")

    def reply(body: bytes, status: int = 202) -> FlaskResponse:
        return FlaskResponse(body, status=status, content_type="application/json")

    @app.route("/jobs", methods=["POST"])
    def jobs() -> FlaskResponse:
        flask_request.get_data()
        run = state.run("jobs")
        state.tokens.append(defer_completion())
        return reply(accepted(run))

    @app.route("/fast", methods=["POST"])
    def fast() -> FlaskResponse:
        run = state.run("fast")
        token = defer_completion()
        state.tokens.append(token)
        state.early_completions.append(
            store.complete_deferred(token, FINAL_STATUS, FINAL_HEADERS, FINAL)
        )
        return reply(accepted(run))

    @app.route("/fast-then-fail", methods=["POST"])
    def fast_then_fail() -> FlaskResponse:
        run = state.run("fast-then-fail")
        token = defer_completion()
        state.early_completions.append(
            store.complete_deferred(token, FINAL_STATUS, FINAL_HEADERS, FINAL)
        )
        return reply(accepted(run), 503)

    @app.route("/defer-then-fail", methods=["POST"])
    def defer_then_fail() -> FlaskResponse:
        run = state.run("defer-then-fail")
        state.tokens.append(defer_completion())
        return reply(accepted(run), 503)

    @app.route("/probe", methods=["POST"])
    def probe() -> FlaskResponse:
        try:
            defer_completion()
        except LookupError as error:
            state.lookup_errors.append(str(error))
        return reply(b"{}", 200)

    return app


class Finisher(Protocol):
    """The worker that finishes deferred work, outside the server."""

    def complete(
        self, token: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> bool: ...

    def release(self, token: str) -> bool: ...


class SyncFinisher:
    """Finishes through a sync store, from the test's thread."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def complete(
        self, token: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> bool:
        return answer(self.store.complete_deferred(token, status, headers, body))

    def release(self, token: str) -> bool:
        return answer(self.store.release_deferred(token))


class AsyncFinisher:
    """Finishes through an async store, each call in an event loop of its own (a worker
    process would have its own). ``owned`` stores are opened for the call and closed."""

    def __init__(self, open_store: Callable[[], Any], *, owned: bool) -> None:
        self._open = open_store
        self._owned = owned

    def _call(self, method: str, *args: Any) -> bool:
        async def go() -> bool:
            store = self._open()
            try:
                return answer(await getattr(store, method)(*args))
            finally:
                if self._owned:
                    await store.aclose()

        return asyncio.run(go())

    def complete(
        self, token: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> bool:
        return self._call("acomplete_deferred", token, status, headers, body)

    def release(self, token: str) -> bool:
        return self._call("arelease_deferred", token)


@dataclass
class Served:
    client: httpx.Client
    state: JobsState
    finisher: Finisher
    events: list[IdempotencyEvent] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def post(self, path: str, key: str | None, payload: object = None) -> httpx.Response:
        headers = {} if key is None else {KEY_HEADER: key}
        return self.client.post(path, json=payload or {"sku": "A-1"}, headers=headers)


def start_server(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    adapter: str,
    kind: str,
    **options: Any,
) -> Served:
    """Serve the jobs app behind the ``adapter``'s middleware on a ``kind`` store."""
    state = JobsState()
    events: list[IdempotencyEvent] = []
    options.setdefault("on_event", events.append)
    store: Any
    finisher: Finisher
    on_shutdown = None
    if kind == "memory":
        store = MemoryStore()
        finisher = (
            SyncFinisher(store) if adapter == "wsgi" else AsyncFinisher(lambda: store, owned=False)
        )
    elif kind == "sqlite":
        tmp_path: Path = request.getfixturevalue("tmp_path")
        store = SQLiteStore(tmp_path / f"jobs-{uuid.uuid4().hex[:8]}.sqlite3")
        stack.callback(store.close)  # after the server stopped
        finisher = (
            SyncFinisher(store) if adapter == "wsgi" else AsyncFinisher(lambda: store, owned=False)
        )
    else:
        endpoint, table = dynamodb_target(request, local=kind == "dynamodb-local")
        boto3_session, aioboto3_session = request.getfixturevalue("sessions")
        if adapter == "wsgi":
            store = DynamoDBStore(
                table, endpoint_url=endpoint, region_name=REGION, session=boto3_session
            )
            stack.callback(store.close)
            # The worker is another process: its own store on the same table.
            worker = DynamoDBStore(
                table, endpoint_url=endpoint, region_name=REGION, session=boto3_session
            )
            stack.callback(worker.close)
            finisher = SyncFinisher(worker)
        else:
            store = AsyncDynamoDBStore(
                table, endpoint_url=endpoint, region_name=REGION, session=aioboto3_session
            )
            on_shutdown = store.aclose  # its client belongs to the server's loop
            finisher = AsyncFinisher(
                lambda: AsyncDynamoDBStore(
                    table, endpoint_url=endpoint, region_name=REGION, session=aioboto3_session
                ),
                owned=True,
            )
    if adapter == "asgi":
        app = IdempotencyMiddleware(build_fastapi(state, store), store=store, **options)
        url = stack.enter_context(serve_asgi(app, on_shutdown=on_shutdown))
    else:
        flask_app = build_flask(state, store)
        flask_app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
            flask_app.wsgi_app, store=store, **options
        )
        url = stack.enter_context(serve_wsgi(flask_app))
    client = httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False)
    stack.callback(client.close)
    return Served(client, state, finisher, events)


HTTP_COMBOS = [
    f"{adapter}-{kind}"
    for adapter in ("asgi", "wsgi")
    for kind in ("memory", "sqlite", "dynamodb", "dynamodb-local")
]


@pytest.fixture(params=HTTP_COMBOS)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    adapter, kind = str(request.param).split("-", 1)
    with contextlib.ExitStack() as stack:
        yield start_server(request, stack, adapter, kind)


def assert_replay(answer: httpx.Response, status: int, body: bytes) -> None:
    assert answer.status_code == status, answer.text
    assert answer.content == body
    assert answer.headers["idempotent-replayed"] == "true"
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["content-length"] == str(len(body))


def test_a_deferred_request_replays_its_202_then_the_final_response(served: Served) -> None:
    key = uuid.uuid4().hex
    first = served.post("/jobs", key)
    assert first.status_code == 202
    assert first.content == accepted(1)
    assert "idempotent-replayed" not in first.headers
    [token] = served.state.tokens
    deferred = [event for event in served.events if event.kind == "deferred"]
    assert [(event.status, event.key_hash) for event in deferred] == [
        (202, parse_token(token).key_hash)
    ]
    assert "completed" not in served.kinds()

    assert_replay(served.post("/jobs", key), 202, accepted(1))

    assert served.finisher.complete(token, 200, FINAL_HEADERS, FINAL) is True

    assert_replay(served.post("/jobs", key), 200, FINAL)
    assert_replay(served.post("/jobs", key), 200, FINAL)
    reused = served.post("/jobs", key, {"sku": "B-2"})
    assert reused.status_code == 422
    assert reused.headers["content-type"] == "application/problem+json"
    # The token is spent: neither a second completion nor a release changes the replay.
    assert served.finisher.complete(token, 201, FINAL_HEADERS, b'{"again":1}') is False
    assert served.finisher.release(token) is False
    assert_replay(served.post("/jobs", key), 200, FINAL)
    assert served.state.runs("jobs") == 1
    assert served.state.tokens == [token]


def test_a_retry_with_another_body_while_deferred_is_422(served: Served) -> None:
    key = uuid.uuid4().hex
    assert served.post("/jobs", key).status_code == 202
    assert served.post("/jobs", key, {"sku": "other"}).status_code == 422
    assert served.state.runs("jobs") == 1


def test_a_released_deferral_runs_the_handler_again(served: Served) -> None:
    key = uuid.uuid4().hex
    assert served.post("/jobs", key).status_code == 202
    [first_token] = served.state.tokens

    assert served.finisher.release(first_token) is True

    again = served.post("/jobs", key)
    assert again.status_code == 202
    assert again.content == accepted(2)
    assert "idempotent-replayed" not in again.headers
    assert served.state.runs("jobs") == 2
    assert served.state.tokens[0] == first_token
    second_token = served.state.tokens[1]
    assert second_token != first_token
    assert served.kinds().count("deferred") == 2
    # The first deferral is over: its token finishes nothing of the second one's.
    assert served.finisher.complete(first_token, 200, FINAL_HEADERS, b'{"stale":1}') is False
    assert served.finisher.release(first_token) is False
    assert_replay(served.post("/jobs", key), 202, accepted(2))
    assert served.finisher.complete(second_token, 200, FINAL_HEADERS, FINAL) is True
    assert_replay(served.post("/jobs", key), 200, FINAL)
    assert served.state.runs("jobs") == 2


def test_work_finished_before_the_interim_response_was_stored(served: Served) -> None:
    key = uuid.uuid4().hex
    first = served.post("/fast", key)
    # The first request still gets the handler's own answer ...
    assert first.status_code == 202
    assert first.content == accepted(1)
    assert "idempotent-replayed" not in first.headers
    assert served.state.early_completions == [True]
    assert "deferred" in served.kinds()
    assert "lost" not in served.kinds()
    # ... and every retry the final response, which the interim one did not overwrite.
    assert_replay(served.post("/fast", key), 200, FINAL)
    assert served.state.runs("fast") == 1


def test_a_handler_failing_after_the_work_completed_keeps_the_final_response(
    served: Served,
) -> None:
    key = uuid.uuid4().hex
    assert served.post("/fast-then-fail", key).status_code == 503
    assert served.state.early_completions == [True]  # the work is done, and stored

    retry = served.post("/fast-then-fail", key)

    assert served.state.runs("fast-then-fail") == 1, "the handler ran again"
    assert_replay(retry, 200, FINAL)


def test_a_deferral_answered_with_5xx_is_released(served: Served) -> None:
    key = uuid.uuid4().hex
    assert served.post("/defer-then-fail", key).status_code == 503
    [token] = served.state.tokens
    assert "released" in served.kinds()
    assert "deferred" not in served.kinds()
    # Nothing was deferred: the token finishes nothing, and a retry runs the handler again.
    assert served.finisher.complete(token, 200, FINAL_HEADERS, FINAL) is False
    assert served.post("/defer-then-fail", key).status_code == 503
    assert served.state.runs("defer-then-fail") == 2


def test_defer_completion_in_a_request_without_a_key_is_a_lookup_error(served: Served) -> None:
    answer = served.post("/probe", None)
    assert answer.status_code == 200
    assert len(served.state.lookup_errors) == 1
    assert "Idempotency-Key" in served.state.lookup_errors[0]
    assert served.events == []


@pytest.mark.parametrize("adapter", ["asgi", "wsgi"])
def test_the_replay_cache_never_keeps_an_interim_response(
    request: pytest.FixtureRequest, adapter: str
) -> None:
    with contextlib.ExitStack() as stack:
        served = start_server(request, stack, adapter, "memory", replay_cache_size=16)
        key = uuid.uuid4().hex
        assert served.post("/jobs", key).status_code == 202
        assert_replay(served.post("/jobs", key), 202, accepted(1))
        assert served.finisher.complete(served.state.tokens[0], 200, FINAL_HEADERS, FINAL)
        assert_replay(served.post("/jobs", key), 200, FINAL)
        assert_replay(served.post("/jobs", key), 200, FINAL)  # now from the cache


def test_a_sync_fastapi_route_defers_from_the_thread_pool(request: pytest.FixtureRequest) -> None:
    with contextlib.ExitStack() as stack:
        served = start_server(request, stack, "asgi", "memory")
        key = uuid.uuid4().hex
        assert served.post("/jobs-sync", key).status_code == 202
        [token] = served.state.tokens
        assert_replay(served.post("/jobs-sync", key), 202, accepted(1))
        assert served.finisher.complete(token, 200, FINAL_HEADERS, FINAL) is True
        assert_replay(served.post("/jobs-sync", key), 200, FINAL)
        assert served.state.runs("jobs-sync") == 1


def test_every_token_defer_completion_hands_out_is_accepted(
    request: pytest.FixtureRequest,
) -> None:
    with contextlib.ExitStack() as stack:
        served = start_server(request, stack, "asgi", "memory", ttl_seconds=10**15)
        assert served.post("/jobs", uuid.uuid4().hex).status_code == 202
        [token] = served.state.tokens
        assert served.finisher.complete(token, 200, FINAL_HEADERS, FINAL) is True


# --- a final response written by something else (Step Functions): response_json ----------


@pytest.mark.parametrize(
    "combo", ["asgi-dynamodb", "wsgi-dynamodb", "asgi-dynamodb-local", "wsgi-dynamodb-local"]
)
@pytest.mark.parametrize(
    "document",
    ['{"status": 200, "body": "ok"', '{"status": 700, "body": "ok"}', '["not", "an object"]'],
    ids=["not-json", "bad-status", "not-an-object"],
)
def test_an_unreadable_response_json_is_a_410_never_a_500(
    request: pytest.FixtureRequest, combo: str, document: str
) -> None:
    adapter, kind = combo.split("-", 1)
    endpoint, table = dynamodb_target(request, local=kind == "dynamodb-local")
    with contextlib.ExitStack() as stack:
        served = start_server(request, stack, adapter, kind)
        key = uuid.uuid4().hex
        assert served.post("/jobs", key).status_code == 202
        key_hash, owner, expires_at = served.state.tokens[0].split(".")
        # What a misconfigured workflow state might write.
        dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)
        stack.callback(dynamodb.close)
        dynamodb.update_item(
            TableName=table,
            Key={"pk": {"S": key_hash}},
            UpdateExpression="SET #status = :completed, #response = :response, #exp = :exp",
            ConditionExpression="#owner = :owner",
            ExpressionAttributeNames={
                "#status": "status",
                "#response": "response_json",
                "#exp": "expires_at",
                "#owner": "owner",
            },
            ExpressionAttributeValues={
                ":completed": {"S": "completed"},
                ":response": {"S": document},
                ":exp": {"N": expires_at},
                ":owner": {"S": owner},
            },
        )

        gone = served.post("/jobs", key)

        assert gone.status_code == 410, gone.text
        assert gone.headers["content-type"] == "application/problem+json"
        assert served.kinds()[-1] == "not_stored"
        with DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION) as reader:
            record = reader.get(key_hash)
        assert record is not None
        assert (record.status, record.response, record.response_not_stored) == (
            Status.COMPLETED,
            None,
            True,
        )
        assert served.state.runs("jobs") == 1


# --- records.decode_response_document ------------------------------------------------------


def test_a_document_with_headers_as_an_object() -> None:
    decoded = decode_response_document(
        '{"status": 201, "headers": {"Content-Type": "text/plain", "X-A": "1"}, "body": "hé"}'
    )
    assert decoded == StoredResponse(
        201, [(b"content-type", b"text/plain"), (b"x-a", b"1")], "hé".encode()
    )


def test_a_document_with_headers_as_a_list_keeps_order_and_repeats() -> None:
    decoded = decode_response_document(
        b'{"status": 200, "headers": [["X-B", "2"], ["x-a", "1"], ["X-B", "3"]], "body": ""}'
    )
    assert decoded.headers == [(b"x-b", b"2"), (b"x-a", b"1"), (b"x-b", b"3")]
    assert decoded.body == b""


def test_a_document_drops_the_headers_no_stored_response_keeps() -> None:
    decoded = decode_response_document(
        '{"status": 200, "headers": [["Set-Cookie", "s=1"], ["Connection", "close"], '
        '["Idempotent-Replayed", "true"], ["X-Kept", "yes"]]}'
    )
    assert decoded == StoredResponse(200, [(b"x-kept", b"yes")], b"")


def test_a_json_body_is_compact_and_gets_a_content_type_when_it_has_none() -> None:
    decoded = decode_response_document(
        '{"status": 200, "json": {"a": [1, 2.5, "caf\\u00e9"], "b": null}}'
    )
    assert decoded.body == '{"a":[1,2.5,"café"],"b":null}'.encode()
    assert decoded.headers == [(b"content-type", b"application/json")]


def test_a_json_body_keeps_a_content_type_it_has() -> None:
    decoded = decode_response_document(
        '{"status": 200, "headers": {"content-type": "application/vnd.x+json"}, "json": [1]}'
    )
    assert decoded.headers == [(b"content-type", b"application/vnd.x+json")]
    assert decoded.body == b"[1]"


def test_a_json_body_may_be_any_json_value() -> None:
    assert decode_response_document('{"status": 200, "json": null}').body == b"null"
    assert decode_response_document('{"status": 200, "json": "x"}').body == b'"x"'


def test_a_body_base64_is_decoded_to_its_bytes() -> None:
    raw = bytes(range(256))
    document = orjson.dumps({"status": 200, "body_base64": base64.b64encode(raw).decode()})
    assert decode_response_document(document) == StoredResponse(200, [], raw)


def test_a_document_without_a_body_has_an_empty_one() -> None:
    assert decode_response_document('{"status": 204}') == StoredResponse(204, [], b"")


@pytest.mark.parametrize(
    "document",
    [
        '{"status": 200, "body": "a", "json": 1}',
        '{"status": 200, "body": "a", "body_base64": "YQ=="}',
        '{"status": 200, "json": 1, "body_base64": "YQ=="}',
    ],
)
def test_two_bodies_are_a_value_error(document: str) -> None:
    with pytest.raises(ValueError, match="more than one body"):
        decode_response_document(document)


@pytest.mark.parametrize(
    "status", ["99", "600", "true", "false", '"200"', "200.0", "null", "[200]"]
)
def test_a_bad_status_is_a_value_error(status: str) -> None:
    with pytest.raises(ValueError, match="status"):
        decode_response_document(f'{{"status": {status}, "body": ""}}')


def test_a_missing_status_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="status"):
        decode_response_document('{"body": "x"}')


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ('{"status": 200} trailing', "not JSON"),
        ("[]", "JSON object"),
        ('"text"', "JSON object"),
        ('{"status": 200, "headers": "x-a: 1"}', "headers"),
        ('{"status": 200, "headers": [["x-a"]]}', "header"),
        ('{"status": 200, "headers": [["x-a", 1]]}', "header"),
        ('{"status": 200, "headers": {"x-a": ["1"]}}', "header"),
        ('{"status": 200, "headers": [["x-a", "\\u20ac"]]}', "Latin-1"),
        ('{"status": 200, "body": 5}', "body"),
        ('{"status": 200, "body": null}', "body"),
        ('{"status": 200, "body_base64": "not base64!"}', "base64"),
        ('{"status": 200, "body_base64": 7}', "base64"),
    ],
)
def test_a_malformed_document_is_a_value_error(document: str | bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_response_document(document)


def test_a_redelivered_final_response_in_s3_leaves_the_stored_one_in_place(
    moto_endpoint: str,
) -> None:
    """A final response over the item limit goes to S3; the same token completed again (a
    redelivered job) loses the race and deletes only its own object, so the first stays
    readable."""
    bucket = f"finals-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    s3.create_bucket(Bucket=bucket)
    clock = FakeClock(start=time.time())
    with DynamoDBStore(
        make_table(moto_endpoint),
        endpoint_url=moto_endpoint,
        region_name=REGION,
        s3_bucket=bucket,
        s3_endpoint_url=moto_endpoint,
        clock=clock,
    ) as store:
        claim = claim_for(clock.now())
        assert store.claim(claim) == Claimed(taken_over=False)
        assert store.complete(interim_completion(claim, clock.now())) is True
        first = os.urandom(MAX_ITEM_RESPONSE_BYTES + 1024)

        assert store.complete_deferred(token_for(claim), 200, (), first) is True
        assert store.complete_deferred(token_for(claim), 200, (), os.urandom(len(first))) is False

        record = store.get(claim.key_hash)
        assert record is not None and record.response is not None
        assert record.response.body == first
        assert len(s3.list_objects_v2(Bucket=bucket).get("Contents", [])) == 1
    s3.close()
