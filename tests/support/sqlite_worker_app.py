"""Worker processes for tests/contract/test_sqlite_store.py, kept light to start (no boto3).

``create_app`` is a Starlette app on ``SQLiteStore`` for ``uvicorn --workers N --factory``,
served from several worker processes sharing one database file. It is configured by
environment variables (all paths):

- ``IDEM_SQLITE_PATH``: the database file;
- ``IDEM_RUNS_FILE``: the handler appends one line per run (``pid run-id``);
- ``IDEM_HITS_FILE``: every HTTP request appends the pid of the worker that received it;
- ``IDEM_READY_DIR``: each worker creates a file named after its pid once started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from idempotency_middleware import IdempotencyMiddleware
from idempotency_middleware.stores.sqlite import SQLiteStore
from idempotency_middleware.web.asgi import ASGIApp, Receive, Scope, Send

HANDLER_SECONDS = 0.2


def _append(path: Path, line: str) -> None:
    # One small write on an O_APPEND file: lines from several processes never interleave.
    with path.open("a", encoding="utf-8") as file:
        file.write(line + "\n")


def create_app() -> ASGIApp:
    """The app of one worker: hit counter -> IdempotencyMiddleware(SQLiteStore) -> Starlette."""
    store = SQLiteStore(os.environ["IDEM_SQLITE_PATH"])
    runs_file = Path(os.environ["IDEM_RUNS_FILE"])
    hits_file = Path(os.environ["IDEM_HITS_FILE"])
    ready_dir = Path(os.environ["IDEM_READY_DIR"])
    pid = os.getpid()

    async def create_order(request: Request) -> JSONResponse:
        run_id = uuid.uuid4().hex
        _append(runs_file, f"{pid} {run_id}")
        await asyncio.sleep(HANDLER_SECONDS)
        return JSONResponse({"run": run_id, "pid": pid}, status_code=201)

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(pid))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        (ready_dir / str(pid)).touch()
        try:
            yield
        finally:
            await store.aclose()

    starlette_app = Starlette(
        routes=[
            Route("/orders", create_order, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    protected = IdempotencyMiddleware(starlette_app, store=store)

    async def count_hits(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            _append(hits_file, str(pid))
        await protected(scope, receive, send)

    return count_hits
