"""The API that hands jobs to Step Functions, as the failure and orphan tests serve it:
``POST /jobs`` starts the job's execution through the package (``astart_execution`` with
aioboto3 behind ``IdempotencyMiddleware`` and an ``AsyncDynamoDBStore`` on uvicorn;
``start_execution`` with boto3 behind ``IdempotencyWSGIMiddleware`` and a ``DynamoDBStore``
on waitress) and answers 202 with the handler's run number and the execution it got.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aioboto3
import boto3
import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
)
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.step_functions import (
    StartedExecution,
    astart_execution,
    execution_name,
    start_execution,
)
from tests.conftest import REGION
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi, serve_wsgi

KEY_HEADER = "Idempotency-Key"
PATH = "/jobs"


class Jobs:
    """Shared by a test and its app: the state machine to start, the handler's runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.machine = ""
        self.runs = 0

    def ran(self) -> int:
        with self._lock:
            self.runs += 1
            return self.runs


def accepted(run: int, started: StartedExecution) -> dict[str, Any]:
    return {"run": run, "execution": started.name, "adopted": started.adopted}


def fastapi_app(jobs: Jobs, sfn_endpoint: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        session = aioboto3.Session()
        async with session.client(
            "stepfunctions", endpoint_url=sfn_endpoint, region_name=REGION
        ) as client:
            app.state.sfn = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post(PATH)
    async def submit(request: Request) -> JSONResponse:
        job = await request.json()
        run = jobs.ran()
        started = await astart_execution(request.app.state.sfn, jobs.machine, job)
        return JSONResponse(accepted(run, started), status_code=202)

    return app


def flask_app(jobs: Jobs, sfn: Any) -> Flask:
    app = Flask("step_functions_jobs")

    @app.route(PATH, methods=["POST"])
    def submit() -> FlaskResponse:
        job = flask_request.get_json()
        run = jobs.ran()
        started = start_execution(sfn, jobs.machine, job)
        body = json.dumps(accepted(run, started))
        return FlaskResponse(body, status=202, content_type="application/json")

    return app


@dataclass
class JobsAPI:
    """A served API, its client, what it shares with the test, and a store on its table."""

    client: httpx.Client
    jobs: Jobs
    store: DynamoDBStore

    def post(self, key: str, job: dict[str, Any]) -> httpx.Response:
        return self.client.post(PATH, json=job, headers={KEY_HEADER: key})


@contextlib.contextmanager
def jobs_api(
    flavour: str, sfn_endpoint: str, dynamodb_endpoint: str, table: str
) -> Iterator[JobsAPI]:
    """The API of ``flavour`` (``fastapi`` or ``flask``) on ``table``."""
    jobs = Jobs()
    settings: dict[str, Any] = {"endpoint_url": dynamodb_endpoint, "region_name": REGION}
    with contextlib.ExitStack() as stack:
        if flavour == "fastapi":
            store = AsyncDynamoDBStore(table, **settings)
            app = IdempotencyMiddleware(fastapi_app(jobs, sfn_endpoint), store=store)
            url = stack.enter_context(serve_asgi(app, on_shutdown=store.aclose, lifespan=True))
        else:
            sync_store = DynamoDBStore(table, **settings)
            stack.callback(sync_store.close)  # after the server stopped
            sfn = boto3.client("stepfunctions", endpoint_url=sfn_endpoint, region_name=REGION)
            stack.callback(sfn.close)
            wsgi = flask_app(jobs, sfn)
            wsgi.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
                wsgi.wsgi_app, store=sync_store
            )
            url = stack.enter_context(serve_wsgi(wsgi))
        client = stack.enter_context(
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False)
        )
        inspector = stack.enter_context(DynamoDBStore(table, **settings))
        yield JobsAPI(client, jobs, inspector)


@pytest.fixture(params=["fastapi", "flask"])
def api_flavour(request: pytest.FixtureRequest) -> str:
    flavour: str = request.param
    return flavour


def new_job() -> dict[str, Any]:
    """A job's input: its id names its run counter and gate
    (tests/support/step_functions_harness.py)."""
    return {"job_id": uuid.uuid4().hex, "order": 7}


def key_hash(key: str) -> str:
    return storage_key("POST", PATH, None, key)


def name_of(key: str, number: int) -> str:
    """The name of the ``number``-th execution started for the client key ``key``."""
    return execution_name(key_hash(key), number)


def assert_accepted(
    answer: httpx.Response,
    key: str,
    *,
    run: int,
    execution: int,
    replayed: bool,
    adopted: bool = False,
) -> None:
    """The 202 of the handler's ``run``-th run, which got the ``execution``-th execution."""
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"run": run, "execution": name_of(key, execution), "adopted": adopted}
    assert (answer.headers.get("idempotent-replayed") == "true") is replayed


def assert_final(answer: httpx.Response, status: int, body: dict[str, Any]) -> None:
    """The final response a workflow stored, replayed."""
    assert answer.status_code == status, answer.text
    assert answer.json() == body
    assert answer.headers["idempotent-replayed"] == "true"
