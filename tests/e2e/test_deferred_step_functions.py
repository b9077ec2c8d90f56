"""Deferred completion end to end with Step Functions: the real middleware defers a request,
the README's state machine (examples/step_functions_complete.asl.json, run as Amazon States
Language by moto's interpreter, see tests/support/step_functions.py) stores the work's result, and
retries get it replayed.

Both middlewares on real servers: FastAPI behind ``IdempotencyMiddleware`` with an
``AsyncDynamoDBStore`` on uvicorn, Flask behind ``IdempotencyWSGIMiddleware`` with a
``DynamoDBStore`` on waitress; each test on a table of its own, on moto's DynamoDB and on
Amazon's DynamoDB Local (ids ``dynamodb-local``, run by scripts/dynamodb-local.sh and
reported as skipped otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

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
    defer_completion,
)
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.handler.deferred import new_token, parse_token
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest, Completion, Held
from idempotency_middleware.stores.records import Status, StoredResponse
from tests.conftest import REGION
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi, serve_wsgi
from tests.support.step_functions import (
    DEFINITION_FILE,
    ExecutionFailed,
    dynamodb_endpoint,
    run_state_machine,
    sfn_endpoint,
    with_table,
)

__all__ = ["dynamodb_endpoint", "sfn_endpoint"]  # fixtures, imported for these tests

T = TypeVar("T")

TASK = "CompleteIdempotencyKey"
CONDITION_FAILED = "DynamoDB.ConditionalCheckFailedException"
KEY_HEADER = "Idempotency-Key"
RESULT: dict[str, Any] = {
    "order": 7,
    "state": "shipped",
    "note": "café ☕",
    "lines": [1, 2.5, {"sku": "A-1", "qty": 3}],
    "gift": False,
    "coupon": None,
}
# What the state machine's ShapeResponse state makes of the result.
RESPONSE_DOCUMENT = {"status": 200, "headers": {"content-type": "application/json"}, "json": RESULT}
# The result as retries get it: its compact JSON, UTF-8.
RESULT_BYTES = json.dumps(RESULT, separators=(",", ":"), ensure_ascii=False).encode()
TTL = 3600.0
LOCK = 30.0


def load_definition(table: str) -> dict[str, Any]:
    """The example definition as the README shows it, with only its table name replaced."""
    return with_table(json.loads(DEFINITION_FILE.read_text()), table)


@pytest.fixture
def table(dynamodb_endpoint: str) -> str:
    """A table of this test's own, made by the package's ``create_table``."""
    name = f"sfn-deferred-{uuid.uuid4().hex[:12]}"
    with DynamoDBStore(name, endpoint_url=dynamodb_endpoint, region_name=REGION) as creator:
        creator.create_table()
    return name


@dataclass(frozen=True)
class Workflow:
    """Runs the example state machine on ``table`` at ``dynamodb_endpoint``."""

    sfn_endpoint: str
    dynamodb_endpoint: str
    table: str

    def finish(self, token: str, result: object = RESULT) -> dict[str, Any]:
        """One execution for ``token``; its output (``ExecutionFailed`` if it failed)."""
        port = urlsplit(self.dynamodb_endpoint).port
        assert port is not None
        return run_state_machine(
            self.sfn_endpoint,
            load_definition(self.table),
            {"idempotency_token": token, "result": result},
            dynamodb_port=port,
        )


@pytest.fixture
def workflow(sfn_endpoint: str, dynamodb_endpoint: str, table: str) -> Workflow:
    return Workflow(sfn_endpoint, dynamodb_endpoint, table)


# --- the apps -------------------------------------------------------------------------------


class Jobs:
    """Shared by a test and its app: the tokens handed out, the handler's runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tokens: list[str] = []
        self.runs = 0
        self.events: list[IdempotencyEvent] = []

    def ran(self) -> int:
        with self._lock:
            self.runs += 1
            return self.runs


def accepted(run: int) -> bytes:
    return orjson.dumps({"job": run, "state": "accepted"})


def fastapi_app(jobs: Jobs, workflow: Workflow) -> FastAPI:
    app = FastAPI()

    @app.post("/jobs")
    async def submit(request: Request) -> Response:
        await request.body()
        run = jobs.ran()
        jobs.tokens.append(defer_completion())
        return Response(accepted(run), status_code=202, media_type="application/json")

    @app.post("/jobs-inline")
    async def submit_inline(request: Request) -> Response:
        # The workflow finishes while this request still runs (its key is in progress).
        run = jobs.ran()
        token = defer_completion()
        jobs.tokens.append(token)
        await asyncio.to_thread(workflow.finish, token)
        return Response(accepted(run), status_code=202, media_type="application/json")

    return app


def flask_app(jobs: Jobs, workflow: Workflow) -> Flask:
    app = Flask("deferred_step_functions")

    @app.route("/jobs", methods=["POST"])
    def submit() -> FlaskResponse:
        flask_request.get_data()
        run = jobs.ran()
        jobs.tokens.append(defer_completion())
        return FlaskResponse(accepted(run), status=202, content_type="application/json")

    @app.route("/jobs-inline", methods=["POST"])
    def submit_inline() -> FlaskResponse:
        run = jobs.ran()
        token = defer_completion()
        jobs.tokens.append(token)
        workflow.finish(token)
        return FlaskResponse(accepted(run), status=202, content_type="application/json")

    return app


@pytest.fixture(params=["fastapi", "flask"])
def server(
    request: pytest.FixtureRequest, workflow: Workflow
) -> Iterator[tuple[httpx.Client, Jobs]]:
    """The app behind the real middleware on the test's table; a client and its ``Jobs``."""
    jobs = Jobs()
    settings: dict[str, Any] = {
        "endpoint_url": workflow.dynamodb_endpoint,
        "region_name": REGION,
    }
    with contextlib.ExitStack() as stack:
        if request.param == "fastapi":
            store = AsyncDynamoDBStore(workflow.table, **settings)
            app = IdempotencyMiddleware(
                fastapi_app(jobs, workflow), store=store, on_event=jobs.events.append
            )
            url = stack.enter_context(serve_asgi(app, on_shutdown=store.aclose))
        else:
            sync_store = DynamoDBStore(workflow.table, **settings)
            stack.callback(sync_store.close)  # after the server stopped
            wsgi = flask_app(jobs, workflow)
            wsgi.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
                wsgi.wsgi_app, store=sync_store, on_event=jobs.events.append
            )
            url = stack.enter_context(serve_wsgi(wsgi))
        client = stack.enter_context(
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False)
        )
        yield client, jobs


def post(client: httpx.Client, path: str, key: str, payload: object = None) -> httpx.Response:
    return client.post(path, json=payload or {"order": 7}, headers={KEY_HEADER: key})


def stored_headers(answer: httpx.Response) -> list[tuple[str, str]]:
    """The headers that come from the stored response (not the server's date line)."""
    return [
        (name.lower(), value)
        for name, value in answer.headers.items()
        if name.lower() not in ("date", "server")
    ]


def assert_final_replay(answer: httpx.Response) -> None:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["idempotent-replayed"] == "true"
    assert answer.headers["content-length"] == str(len(RESULT_BYTES))
    assert answer.content == RESULT_BYTES


# --- end to end ------------------------------------------------------------------------------


def test_the_workflow_stores_the_result_that_retries_then_get(
    server: tuple[httpx.Client, Jobs], workflow: Workflow
) -> None:
    client, jobs = server
    key = uuid.uuid4().hex
    first = post(client, "/jobs", key)
    assert first.status_code == 202
    assert first.content == accepted(1)
    [token] = jobs.tokens
    assert [event.kind for event in jobs.events] == ["claimed", "deferred"]
    interim = post(client, "/jobs", key)
    assert (interim.status_code, interim.content) == (202, accepted(1))
    assert interim.headers["idempotent-replayed"] == "true"

    output = workflow.finish(token)

    assert output["response"] == RESPONSE_DOCUMENT
    final = post(client, "/jobs", key)
    assert_final_replay(final)

    # A second execution for the same token is refused by the condition, and changes nothing.
    with pytest.raises(ExecutionFailed) as failed:
        workflow.finish(token, {"order": 7, "state": "cancelled"})
    assert (failed.value.status, failed.value.error) == ("FAILED", CONDITION_FAILED)
    again = post(client, "/jobs", key)
    assert_final_replay(again)
    assert stored_headers(again) == stored_headers(final)
    assert post(client, "/jobs", key, {"order": 8}).status_code == 422
    assert jobs.runs == 1


def test_a_workflow_may_finish_before_the_interim_response_is_stored(
    server: tuple[httpx.Client, Jobs],
) -> None:
    """The handler defers, and its workflow completes the key before the handler returns.

    The workflow's UpdateItem is conditioned on ``#owner = :owner AND #status <> :completed``:
    the key is still ``in_progress`` under the token's owner, so the condition holds and the
    final response lands (``status`` completed, ``response_json``). The middleware's interim
    completion that follows is conditioned on ``#owner = :owner AND #status = :in_progress``;
    it fails, and the item DynamoDB returns with the failure (ALL_OLD) shows the key already
    completed by this very owner, so the store reports it done (the ``deferred`` event, never
    ``lost``) without overwriting anything. The request still gets its 202; retries get the
    workflow's result.
    """
    client, jobs = server
    key = uuid.uuid4().hex

    first = post(client, "/jobs-inline", key)

    assert first.status_code == 202
    assert first.content == accepted(1)
    assert "idempotent-replayed" not in first.headers
    assert [event.kind for event in jobs.events] == ["claimed", "deferred"]
    assert_final_replay(post(client, "/jobs-inline", key))
    assert jobs.runs == 1


# --- the race at the store level, with the state machine ---------------------------------------


class StoreCalls:
    """A DynamoDB store's claim/complete/get, sync or async, called synchronously."""

    def __init__(self, endpoint: str, table: str, asynchronous: bool) -> None:
        self._loop = asyncio.new_event_loop() if asynchronous else None
        if asynchronous:
            self._store: Any = AsyncDynamoDBStore(table, endpoint_url=endpoint, region_name=REGION)
        else:
            self._store = DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION)

    def _run(self, sync: str, *args: Any) -> Any:
        if self._loop is None:
            return getattr(self._store, sync)(*args)
        awaitable: Coroutine[Any, Any, Any] = getattr(self._store, "a" + sync)(*args)
        return self._loop.run_until_complete(awaitable)

    def claim(self, request: ClaimRequest) -> Any:
        return self._run("claim", request)

    def complete(self, completion: Completion) -> bool:
        stored = self._run("complete", completion)
        assert isinstance(stored, bool)
        return stored

    def get(self, key_hash: str) -> Any:
        return self._run("get", key_hash)

    def close(self) -> None:
        if self._loop is None:
            self._store.close()
            return
        self._loop.run_until_complete(self._store.aclose())
        self._loop.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_state_machine_completes_a_key_still_in_progress(
    workflow: Workflow, flavour: str
) -> None:
    """At the store level: the workflow's condition admits an in-progress key of the token's
    owner; the interim completion then finds it completed by its owner and keeps it."""
    calls = StoreCalls(workflow.dynamodb_endpoint, workflow.table, flavour == "async")
    try:
        now = time.time()
        claim = ClaimRequest(uuid.uuid4().hex * 2, "fp-race", new_owner(), now, LOCK)
        assert calls.claim(claim) == Claimed(taken_over=False)
        token = new_token(claim.key_hash, claim.owner, now + TTL)

        workflow.finish(token)

        final = calls.get(claim.key_hash)
        expected = StoredResponse(200, [(b"content-type", b"application/json")], RESULT_BYTES)
        assert final.status is Status.COMPLETED
        assert final.response == expected
        assert final.expires_at == parse_token(token).expires_at
        interim = StoredResponse(202, [(b"content-type", b"application/json")], accepted(1))
        completion = Completion(claim.key_hash, claim.owner, now + 1, TTL, interim, deferred=True)
        assert calls.complete(completion) is True
        assert calls.get(claim.key_hash) == final
        retry = claim._replace(owner=new_owner(), now=now + 2)
        held = calls.claim(retry)
        assert isinstance(held, Held)
        assert held.record.response == expected
        # Another owner's interim completion is fenced out all the same.
        stranger = completion._replace(owner=new_owner())
        assert calls.complete(stranger) is False
    finally:
        calls.close()
