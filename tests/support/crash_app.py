"""The app the crash test serves in a uvicorn subprocess and kills with SIGKILL.

``python -m uvicorn tests.support.crash_app:app --host 127.0.0.1 --port <port>``, configured by
environment variables:

- ``CRASH_DYNAMODB_ENDPOINT``, ``CRASH_DYNAMODB_TABLE``: the moto endpoint and table;
- ``CRASH_RUNS_FILE``: every handler run appends one line (``<run> <pid>``) to this file
  before doing anything else, so the test counts runs across processes;
- ``CRASH_LOCK_SECONDS``: the middleware's ``lock_timeout_seconds``;
- ``CRASH_CLOCK_FILE``: the middleware's clock is a ``FileClock`` on this file (the real time
  plus the offset the test writes there), shared by the servers the test starts;
- ``CRASH_HANG_SECONDS``: how long the *first* run sleeps (long enough to be killed in);
  later runs answer at once.

The response body is ``{"run": n, "pid": p}``, so a replay says which run it came from.
"""

from __future__ import annotations

import asyncio
import os

import orjson

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware
from idempotency_middleware.clock import SYSTEM_CLOCK
from idempotency_middleware.web.asgi import Receive, Scope, Send
from tests.support.file_clock import FileClock

RUNS_FILE = os.environ.get("CRASH_RUNS_FILE", "")
HANG_SECONDS = float(os.environ.get("CRASH_HANG_SECONDS", "60"))


def _record_run() -> int:
    """Append this run to the runs file; its number (1 for the first, across processes)."""
    with open(RUNS_FILE, "a+", encoding="utf-8") as runs:
        runs.seek(0)
        run = len(runs.read().splitlines()) + 1
        runs.write(f"{run} {os.getpid()}\n")
        runs.flush()
        os.fsync(runs.fileno())
    return run


async def handler(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return  # lifespan: nothing to set up
    more = True
    while more:
        message = await receive()
        more = bool(message.get("more_body", False))
    run = _record_run()
    if run == 1:
        await asyncio.sleep(HANG_SECONDS)  # killed in here
    body = orjson.dumps({"run": run, "pid": os.getpid()})
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


app = IdempotencyMiddleware(
    handler,
    store=AsyncDynamoDBStore(
        os.environ.get("CRASH_DYNAMODB_TABLE", "idempotency"),
        endpoint_url=os.environ.get("CRASH_DYNAMODB_ENDPOINT"),
        region_name="us-east-1",
    ),
    lock_timeout_seconds=float(os.environ.get("CRASH_LOCK_SECONDS", "2")),
    clock=FileClock(os.environ["CRASH_CLOCK_FILE"])
    if os.environ.get("CRASH_CLOCK_FILE")
    else SYSTEM_CLOCK,
)
