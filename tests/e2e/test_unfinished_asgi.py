"""An unfinished ASGI response is never stored nor replayed.

Each app below cuts its response short (returns or raises before ``more_body=False``, or
sends fewer or more bytes than its ``Content-Length``). Served by uvicorn without the
middleware, the client sees the server's cut response; with it, the client sees the same,
the key is released, and a retry runs the handler again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from idempotency_middleware import IdempotencyMiddleware, MemoryStore, defer_completion
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.web.asgi import Receive, Scope, Send
from tests.support.servers import released, serve_asgi

KEY = {"Idempotency-Key": '"cut-1"'}


def key_hash(path: str) -> str:
    return storage_key("POST", path, None, "cut-1")


class CuttingApp:
    """Cuts its response as its path says; counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.runs += 1
        await receive()
        path: str = scope["path"]
        if path.endswith("/defer"):
            with contextlib.suppress(LookupError):  # no attempt without the middleware
                defer_completion()
        stream = "stream" in path
        headers = [(b"content-type", b"text/event-stream" if stream else b"text/plain")]
        if "short" in path:
            headers.append((b"content-length", b"100"))
        elif "long" in path:
            headers.append((b"content-length", b"3"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        await asyncio.sleep(0)
        if "returned" in path:
            return
        if "raised" in path:
            raise RuntimeError("the handler failed midway")
        await send({"type": "http.response.body", "body": b"ial", "more_body": False})


def outcome(client: httpx.Client, path: str) -> tuple[Any, ...]:
    """What the client saw: a whole response, or the kind of failure."""
    try:
        response = client.post(path, headers=KEY, content=b"x")
    except httpx.HTTPError as error:
        return ("failed", type(error).__name__)
    return ("answered", response.status_code, response.content)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[CuttingApp, str, CuttingApp, MemoryStore, str]]:
    bare, wrapped = CuttingApp(), CuttingApp()
    store = MemoryStore()
    with (
        serve_asgi(bare) as bare_url,
        serve_asgi(IdempotencyMiddleware(wrapped, store=store)) as wrapped_url,
    ):
        yield bare, bare_url, wrapped, store, wrapped_url


CUTS = [
    "/returned",
    "/raised",
    "/short",
    "/long",
    "/stream/returned",
    "/stream/raised",
    "/stream/short",
    "/returned/defer",
    "/short/defer",
]


@pytest.mark.parametrize("path", CUTS)
def test_an_unfinished_response_is_cut_released_and_run_again(
    servers: tuple[CuttingApp, str, CuttingApp, MemoryStore, str], path: str
) -> None:
    _, bare_url, wrapped, store, wrapped_url = servers
    with httpx.Client(base_url=bare_url, timeout=10) as client:
        without = outcome(client, path)
    assert without[0] == "failed"  # uvicorn cuts it: the client never sees a whole response
    runs = wrapped.runs
    with httpx.Client(base_url=wrapped_url, timeout=10) as client:
        first = outcome(client, path)
        assert released(store, key_hash(path))  # released, nothing stored
        retry = outcome(client, path)
    assert first == retry == without
    assert wrapped.runs == runs + 2  # the retry ran the handler again
    assert released(store, key_hash(path))


def test_a_finished_response_is_still_stored_and_replayed(
    servers: tuple[CuttingApp, str, CuttingApp, MemoryStore, str],
) -> None:
    _, _, wrapped, store, wrapped_url = servers
    runs = wrapped.runs
    with httpx.Client(base_url=wrapped_url, timeout=10) as client:
        first = client.post("/whole", headers=KEY, content=b"x")
        retry = client.post("/whole", headers=KEY, content=b"x")
    assert first.content == retry.content == b"partial"
    assert retry.headers["idempotent-replayed"] == "true"
    assert wrapped.runs == runs + 1
    assert store.get(key_hash("/whole")) is not None


def test_a_stream_its_app_stopped_because_its_client_left_stays_completed() -> None:
    # Starlette stops a StreamingResponse when its client disconnects, without a last
    # message: that stream is not unfinished (its handler started a success), it is done,
    # as a WSGI stream closed early is. The handler never runs again; a retry gets 410.
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    runs: list[int] = []
    store = MemoryStore()

    async def endless(request: Request) -> StreamingResponse:
        runs.append(1)

        async def events() -> AsyncIterator[bytes]:
            while True:
                yield b"data: tick\n\n"
                await asyncio.sleep(0.01)

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/events", endless, methods=["POST"])])
    with (
        serve_asgi(IdempotencyMiddleware(app, store=store)) as url,
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        with client.stream("POST", "/events", headers=KEY, content=b"x") as response:
            assert next(response.iter_bytes()).startswith(b"data: tick")
        deadline = time.monotonic() + 5
        while (record := store.get(key_hash("/events"))) is None or record.status.value != (
            "completed"
        ):
            assert time.monotonic() < deadline, record
            time.sleep(0.01)
        retry = client.post("/events", headers=KEY, content=b"x")
    assert retry.status_code == 410
    assert runs == [1]
