"""The API the Step Functions orphan tests serve in a uvicorn subprocess and kill with
SIGKILL: ``POST /jobs`` starts the job's execution with ``astart_execution`` (aioboto3) and
answers 202, behind ``IdempotencyMiddleware`` and an ``AsyncDynamoDBStore``.

``python -m uvicorn tests.support.sfn_crash_app:app --host 127.0.0.1 --port 0``, configured by
environment variables:

- ``CRASH_DYNAMODB_ENDPOINT``, ``CRASH_DYNAMODB_TABLE``: the moto endpoint and table;
- ``CRASH_SFN_ENDPOINT``, ``CRASH_STATE_MACHINE``: the Step Functions server and the state
  machine the handler starts;
- ``CRASH_RUNS_FILE``: every handler run appends one line (``<run> <pid>``) to this file
  before doing anything else, so the test counts runs across processes;
- ``CRASH_LOCK_SECONDS``, ``CRASH_CLOCK_FILE``: the middleware's ``lock_timeout_seconds``,
  and its clock, a ``FileClock`` the test moves past the dead owner's lock;
- ``CRASH_POINT``: where the *first* run hangs, to be killed: ``before_start`` (before
  ``StartExecution``) or ``after_start`` (after it, before the 202 is stored). Later runs
  answer at once.

The body is ``{"run": n, "execution": name, "adopted": bool}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import aioboto3
import orjson

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware
from idempotency_middleware.step_functions import astart_execution
from idempotency_middleware.web.asgi import Receive, Scope, Send
from tests.support.file_clock import FileClock

RUNS_FILE = os.environ.get("CRASH_RUNS_FILE", "")
CRASH_POINT = os.environ.get("CRASH_POINT", "before_start")
HANG_SECONDS = 120.0
REGION = "us-east-1"

_clients = contextlib.AsyncExitStack()
_sfn: list[Any] = []


def _record_run() -> int:
    """Append this run to the runs file; its number (1 for the first, across processes)."""
    with open(RUNS_FILE, "a+", encoding="utf-8") as runs:
        runs.seek(0)
        run = len(runs.read().splitlines()) + 1
        runs.write(f"{run} {os.getpid()}\n")
        runs.flush()
        os.fsync(runs.fileno())
    return run


async def _stepfunctions() -> Any:
    if not _sfn:
        session = aioboto3.Session()
        client = session.client(
            "stepfunctions", endpoint_url=os.environ["CRASH_SFN_ENDPOINT"], region_name=REGION
        )
        _sfn.append(await _clients.enter_async_context(client))
    return _sfn[0]


async def handler(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return  # lifespan: nothing to set up
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = bool(message.get("more_body", False))
    run = _record_run()
    if run == 1 and CRASH_POINT == "before_start":
        await asyncio.sleep(HANG_SECONDS)  # killed in here
    client = await _stepfunctions()
    started = await astart_execution(client, os.environ["CRASH_STATE_MACHINE"], orjson.loads(body))
    if run == 1 and CRASH_POINT == "after_start":
        await asyncio.sleep(HANG_SECONDS)  # killed in here
    answer = orjson.dumps({"run": run, "execution": started.name, "adopted": started.adopted})
    await send(
        {
            "type": "http.response.start",
            "status": 202,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(answer)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": answer, "more_body": False})


app = IdempotencyMiddleware(
    handler,
    store=AsyncDynamoDBStore(
        os.environ.get("CRASH_DYNAMODB_TABLE", "idempotency"),
        endpoint_url=os.environ.get("CRASH_DYNAMODB_ENDPOINT"),
        region_name=REGION,
    ),
    lock_timeout_seconds=float(os.environ.get("CRASH_LOCK_SECONDS", "60")),
    clock=FileClock(os.environ["CRASH_CLOCK_FILE"]),
)
