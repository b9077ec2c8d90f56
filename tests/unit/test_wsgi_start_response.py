"""PEP 3333 ``start_response`` with ``exc_info`` through the buffering WSGI adapter.

The adapter buffers the response, so it decides what a server would have done with it:
headers may be replaced until body bytes exist, and past them the error is re-raised.
In-process WSGI calls: this is the adapter's contract with the app, not with a server.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from idempotency_middleware import IdempotencyWSGIMiddleware, MemoryStore

Environ = dict[str, Any]


def environ_for(key: str) -> Environ:
    body = b'{"a": 1}'
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/orders",
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
    }


class Sent:
    def __init__(self) -> None:
        self.status = ""
        self.headers: list[tuple[str, str]] = []

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], object]:
        self.status, self.headers = status, headers
        return lambda _chunk: None


def call(app: IdempotencyWSGIMiddleware, key: str) -> tuple[Sent, bytes]:
    sent = Sent()
    result = app(environ_for(key), sent.start_response)
    try:
        return sent, b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


class Runs:
    count = 0


def replaces_headers_before_any_body(environ: Environ, start_response: Any) -> Iterable[bytes]:
    Runs.count += 1
    start_response("200 OK", [("Content-Type", "text/plain")])
    try:
        raise ValueError("failed after start_response")
    except ValueError:
        start_response("409 Conflict", [("Content-Type", "text/plain")], sys.exc_info())
    return [b"conflict"]


def fails_after_writing_body(environ: Environ, start_response: Any) -> Iterable[bytes]:
    Runs.count += 1
    write = start_response("200 OK", [("Content-Type", "text/plain")])
    write(b"partial ")
    try:
        raise ValueError("failed after writing body")
    except ValueError:
        start_response("500 Internal Server Error", [], sys.exc_info())
    return [b"never"]


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    Runs.count = 0


def test_headers_replaced_before_any_body_are_the_ones_stored_and_replayed() -> None:
    app = IdempotencyWSGIMiddleware(replaces_headers_before_any_body, store=MemoryStore())
    try:
        first, first_body = call(app, "k-1")
        again, again_body = call(app, "k-1")
    finally:
        app.close()
    assert first.status.startswith("409") and first_body == b"conflict"
    assert again.status.startswith("409") and again_body == b"conflict"
    assert ("Idempotent-Replayed", "true") in [(n.title(), v) for n, v in again.headers]
    assert Runs.count == 1


def test_exc_info_after_body_bytes_reraises_and_releases_the_key() -> None:
    app = IdempotencyWSGIMiddleware(fails_after_writing_body, store=MemoryStore())
    try:
        with pytest.raises(ValueError, match="failed after writing body"):
            call(app, "k-2")
        with pytest.raises(ValueError, match="failed after writing body"):
            call(app, "k-2")  # released, not stored: the retry runs the handler again
    finally:
        app.close()
    assert Runs.count == 2
