"""Long-running work: answer 202 at once, do the work in a worker, and give retries of the
same request the final result once it is there.

    pip install -e '.[dynamodb,fastapi]' uvicorn     (from a checkout)
    uvicorn long_running_work:app     (from this repository: examples.long_running_work:app)

Configured by the environment alone: the AWS SDK's own variables (credentials, AWS_REGION,
AWS_ENDPOINT_URL_DYNAMODB for a local DynamoDB), IDEMPOTENCY_TABLE, and REPORT_SECONDS (how
long a report takes). The worker is an asyncio task in the same process, to keep the
example runnable; a queue (SQS) and a worker fleet, or Step Functions, do the same with the
token. tests/docs/test_idempotency_examples.py runs this file under uvicorn against moto and
Amazon's DynamoDB Local.
"""

import asyncio
import calendar
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NamedTuple
from uuid import uuid4

from fastapi import FastAPI, HTTPException, Response
from pydantic import BaseModel

from idempotency_middleware import (
    AsyncDynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyRule,
    defer_completion,
)

logger = logging.getLogger(__name__)

store = AsyncDynamoDBStore(
    os.environ.get("IDEMPOTENCY_TABLE", "idempotency"),
    region_name=os.environ.get("AWS_REGION", "eu-west-1"),
)
REPORT_SECONDS = float(os.environ.get("REPORT_SECONDS", "5"))


class ReportRequest(BaseModel):
    month: str  # "2026-11"


class Job(NamedTuple):
    token: str  # from defer_completion(): what the worker finishes the key with
    report_id: str
    month: str


jobs: asyncio.Queue[Job] = asyncio.Queue()
# What the status URL shows; one process's memory here, a table in production.
reports: dict[str, dict[str, Any]] = {}


async def build_report(month: str) -> dict[str, Any]:
    await asyncio.sleep(REPORT_SECONDS)  # stands in for a slow query
    year, number = (int(part) for part in month.split("-"))
    return {"month": month, "days": calendar.monthrange(year, number)[1]}  # "2026-13" raises


async def run(job: Job) -> None:
    try:
        report = await build_report(job.month)
    except BaseException:
        # The work did not happen (it failed, or the server is stopping): forget the key, so
        # that a retry of the POST runs the handler again (and queues the report anew)
        # instead of getting the 202 replayed until the key expires.
        reports[job.report_id] = {"status": "failed"}
        try:
            await store.arelease_deferred(job.token)
        except Exception:
            # The store is out of reach too (stopping with the server, say): the key stays
            # deferred until it expires. What stopped the work still propagates, so that a
            # cancelled worker ends and the server can stop.
            logger.exception("report %s: its key could not be released", job.report_id)
        raise
    # From now on a retry of the POST gets this 200 replayed instead of the 202. (False
    # would mean the token no longer applies: the key expired, or was released.)
    body = json.dumps(report).encode()
    await store.acomplete_deferred(job.token, 200, [(b"content-type", b"application/json")], body)
    reports[job.report_id] = {"status": "done", "report": report}


async def worker() -> None:
    while True:
        job = await jobs.get()
        try:
            await run(job)
        except Exception:
            logger.exception("report %s failed", job.report_id)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with store:
        await store.create_table()  # at deploy time in production (see the quick start)
        running = asyncio.create_task(worker())
        try:
            yield
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


app = FastAPI(lifespan=lifespan)
# defer_completion() needs the request's key: require it on the route that defers.
app.add_middleware(
    IdempotencyMiddleware, store=store, rules=[IdempotencyRule("/reports", required=True)]
)


@app.post("/reports", status_code=202)
async def create_report(request: ReportRequest, response: Response) -> dict[str, Any]:
    # This 202 becomes the key's interim response: retries get it replayed while the work
    # runs. The worker may even finish before it is stored; the final response then wins.
    token = defer_completion()
    report_id = uuid4().hex
    reports[report_id] = {"status": "running"}
    await jobs.put(Job(token, report_id, request.month))
    response.headers["Location"] = f"/reports/{report_id}"
    return {"report_id": report_id, "status": "running"}


@app.get("/reports/{report_id}")
async def report_status(report_id: str) -> dict[str, Any]:
    if report_id not in reports:
        raise HTTPException(404)
    return reports[report_id]
