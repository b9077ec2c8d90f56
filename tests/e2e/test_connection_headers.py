"""Headers a response's ``Connection`` header names are hop-by-hop (RFC 9110 7.6.1):
neither stored nor replayed, through uvicorn and waitress."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from idempotency_middleware import IdempotencyMiddleware, IdempotencyWSGIMiddleware, MemoryStore
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.web.asgi import Receive, Scope, Send
from idempotency_middleware.web.wsgi_environ import Environ, StartResponse
from tests.support.servers import serve_asgi, serve_wsgi

HEADERS = [
    ("Content-Type", "text/plain"),
    ("Connection", "X-Hop, keep-alive"),
    ("Connection", "x-other"),
    ("X-Hop", "1"),
    ("x-OTHER", "2"),
    ("X-Kept", "3"),
]


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    headers = [(name.lower().encode(), value.encode()) for name, value in HEADERS]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": b"made"})


def wsgi_app(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    start_response("201 Created", list(HEADERS))
    return iter([b"made"])


@pytest.mark.parametrize("door", ["asgi", "wsgi"])
def test_headers_named_by_connection_are_neither_stored_nor_replayed(door: str) -> None:
    store = MemoryStore()
    server = (
        serve_asgi(IdempotencyMiddleware(asgi_app, store=store))
        if door == "asgi"
        else serve_wsgi(IdempotencyWSGIMiddleware(wsgi_app, store=store))
    )
    with server as url, httpx.Client(base_url=url, timeout=10) as client:
        client.post("/orders", headers={"Idempotency-Key": '"hop-1"'}, content=b"x")
        replay = client.post("/orders", headers={"Idempotency-Key": '"hop-1"'}, content=b"x")
    record = store.get(storage_key("POST", "/orders", None, "hop-1"))
    assert record is not None and record.response is not None
    assert [name for name, _ in record.response.headers] == [b"content-type", b"x-kept"]
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.headers["x-kept"] == "3"
    assert "x-hop" not in replay.headers and "x-other" not in replay.headers
