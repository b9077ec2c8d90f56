"""The app the chaos test (tests/e2e/test_chaos.py) serves from several processes, killed at random.

Two factories, one handler, the same behaviour, both on ``SQLiteStore`` over one shared file:

- ``python -m uvicorn --factory tests.support.chaos_app:create_asgi_app ...``: a bare ASGI handler
  behind ``IdempotencyMiddleware``;
- ``python -m waitress --call tests.support.chaos_app:create_wsgi_app``: a bare WSGI handler behind
  ``IdempotencyWSGIMiddleware``.

``POST /orders`` with ``{"key": ..., "amount": ...}``: the handler's side effect is one line
``<key> <pid>`` appended (``O_APPEND``, one write, fsync'd) to the effects file, then a
random pause, then 201 ``{"key", "pid", "run"}`` (``run`` a fresh uuid), so every run
answers different bytes and a replay names the run it replays.

Configured by environment variables:

- ``CHAOS_SQLITE_PATH``: the database file every process shares;
- ``CHAOS_EFFECTS_FILE``: the side effects, one line per handler run, across processes;
- ``CHAOS_EVENTS_FILE``: ``<kind> <key hash> <pid>`` per middleware event the test checks
  (take-overs, lost claims, store errors, releases, mismatches);
- ``CHAOS_LOCK_SECONDS``: the middlewares' ``lock_timeout_seconds``;
- ``CHAOS_MAX_PAUSE_SECONDS``: the longest pause after the side effect.

Kept light to import (no web framework, no boto3): the test starts a replacement process
after every kill, and a slow start would leave fewer servers alive.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterable

import orjson

from idempotency_middleware import (
    IdempotencyEvent,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    SQLiteStore,
)
from idempotency_middleware.web.asgi import ASGIApp, Receive, Scope, Send
from idempotency_middleware.web.wsgi import Environ, StartResponse, WSGIApp

# The events whose lines the test reads; the routine ones (claimed, replayed, conflict,
# completed) would only slow every request down.
RECORDED_EVENTS = frozenset(
    {"taken_over", "lost", "store_error", "released", "mismatch", "fail_open", "not_stored"}
)
RESPONSE_HEADERS = [("Content-Type", "application/json")]


def _setting(name: str) -> str:
    return os.environ[f"CHAOS_{name}"]


def _append(path: str, line: str, *, durable: bool) -> None:
    # One write() on an O_APPEND descriptor: lines from several processes never interleave,
    # and a process killed right after the write has still left its whole line.
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode() + b"\n")
        if durable:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


def record_event(event: IdempotencyEvent) -> None:
    """The middlewares' ``on_event`` hook: the events the test checks, one line each."""
    if event.kind in RECORDED_EVENTS:
        line = f"{event.kind} {event.key_hash} {os.getpid()}"
        _append(_setting("EVENTS_FILE"), line, durable=False)


def side_effect(body: bytes) -> tuple[bytes, float]:
    """Run the side effect for this request; the response body and the pause to take."""
    key = str(orjson.loads(body)["key"])
    _append(_setting("EFFECTS_FILE"), f"{key} {os.getpid()}", durable=True)
    answer = orjson.dumps({"key": key, "pid": os.getpid(), "run": uuid.uuid4().hex})
    return answer, random.uniform(0, float(_setting("MAX_PAUSE_SECONDS")))


def _store() -> SQLiteStore:
    return SQLiteStore(_setting("SQLITE_PATH"))


def _lock_seconds() -> float:
    return float(_setting("LOCK_SECONDS"))


def create_asgi_app() -> ASGIApp:
    """The handler behind ``IdempotencyMiddleware`` (uvicorn ``--factory``)."""

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to set up
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        # The fsync off the loop, so the middleware's lease renewals keep their timers.
        answer, pause = await asyncio.to_thread(side_effect, b"".join(chunks))
        await asyncio.sleep(pause)
        headers = [(name.lower().encode(), value.encode()) for name, value in RESPONSE_HEADERS]
        headers.append((b"content-length", str(len(answer)).encode()))
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": answer, "more_body": False})

    return IdempotencyMiddleware(
        handler, store=_store(), lock_timeout_seconds=_lock_seconds(), on_event=record_event
    )


def create_wsgi_app() -> WSGIApp:
    """The handler behind ``IdempotencyWSGIMiddleware`` (waitress ``--call``)."""

    def handler(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        answer, pause = side_effect(environ["wsgi.input"].read(length))
        time.sleep(pause)
        start_response("201 Created", [*RESPONSE_HEADERS, ("Content-Length", str(len(answer)))])
        return [answer]

    return IdempotencyWSGIMiddleware(
        handler, store=_store(), lock_timeout_seconds=_lock_seconds(), on_event=record_event
    )
