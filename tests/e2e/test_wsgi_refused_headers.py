"""A WSGI server that refuses a live stream's headers (wsgiref asserts on hop-by-hop
headers): the stream never starts, the key is released and a retry runs the handler."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx

from idempotency_middleware import IdempotencyWSGIMiddleware, MemoryStore
from idempotency_middleware.web.wsgi_environ import Environ
from tests.support.servers import HOST


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class StreamWithHopByHopHeader:
    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, environ: Environ, start_response: Callable[..., object]) -> Iterable[bytes]:
        self.runs += 1
        start_response(
            "200 OK", [("Content-Type", "text/event-stream"), ("Connection", "keep-alive")]
        )
        return iter([b"data: 1\n\n"])


def serve_wsgiref(app: Callable[..., Iterable[bytes]]) -> Iterator[str]:
    server: WSGIServer = make_server(HOST, 0, app, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_live_stream_whose_headers_the_server_refuses_releases_its_key() -> None:
    app = StreamWithHopByHopHeader()
    store = MemoryStore()
    middleware = IdempotencyWSGIMiddleware(app, store=store)
    for url in serve_wsgiref(middleware):
        with httpx.Client(base_url=url, trust_env=False, timeout=10) as client:
            first = client.post("/events", json={}, headers={"Idempotency-Key": "k-1"})
            retry = client.post("/events", json={}, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 500  # wsgiref's own answer to the refused headers
    assert retry.status_code == 500
    assert app.runs == 2  # released, not held until the lock timeout (no 409)
    assert len(store) == 0
    middleware.close()
