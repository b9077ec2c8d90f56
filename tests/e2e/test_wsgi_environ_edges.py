"""The WSGI adapter's reading of the environ and capture of the app's response, at the edges.

The live stream with a ``write()`` prefix goes through waitress. The other cases are
environs that real servers rarely or never produce (no ``wsgi.input``, a body shorter than
its Content-Length, a path that is not UTF-8) or apps that break PEP 3333; they are hand-built
PEP 3333 environs handed to the middleware in-process.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import pytest

from idempotency_middleware import IdempotencyWSGIMiddleware, MemoryStore
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.records import Status
from idempotency_middleware.web.live_body import LiveBody
from tests.support.servers import serve_wsgi

Environ = dict[str, Any]


def environ_for(key: str, *, path: str = "/orders", body: bytes | None = b"{}") -> Environ:
    environ: Environ = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
    }
    if body is not None:
        environ["CONTENT_LENGTH"] = str(len(body))
        environ["wsgi.input"] = io.BytesIO(body)
    return environ


class Recorder:
    """A WSGI app that answers 201 with the body it read; counts its runs."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lengths: list[str] = []

    def __call__(self, environ: Environ, start_response: Any) -> Iterable[bytes]:
        body = environ["wsgi.input"].read()
        self.bodies.append(body)
        self.lengths.append(environ["CONTENT_LENGTH"])
        start_response("201 Created", [("Content-Type", "application/octet-stream")])
        return [body]


def call(app: Callable[..., Iterable[bytes]], environ: Environ) -> tuple[str, bytes]:
    statuses: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Callable[..., None]:
        statuses.append(status)
        return lambda _chunk: None

    result = app(environ, start_response)
    try:
        return statuses[-1], b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


def test_a_request_without_wsgi_input_reads_as_an_empty_body() -> None:
    recorder = Recorder()
    app = IdempotencyWSGIMiddleware(recorder, store=MemoryStore())
    try:
        first = call(app, environ_for("k1", body=None))
        again = call(app, environ_for("k1", body=b""))  # same (empty) body: a replay
    finally:
        app.close()
    assert first == ("201 Created", b"")
    assert again == first
    assert recorder.bodies == [b""]
    assert recorder.lengths == ["0"]


def test_a_body_shorter_than_its_content_length_is_what_arrived() -> None:
    recorder = Recorder()
    app = IdempotencyWSGIMiddleware(recorder, store=MemoryStore())
    environ = environ_for("k1", body=b"abc")
    environ["CONTENT_LENGTH"] = "10"  # the client went away after three bytes
    try:
        status, body = call(app, environ)
    finally:
        app.close()
    assert (status, body) == ("201 Created", b"abc")
    assert recorder.bodies == [b"abc"]
    assert recorder.lengths == ["3"]  # the app sees the length it can read


@pytest.mark.parametrize(
    ("path_info", "route"),
    [
        ("/caf\xc3\xa9", "/café"),  # UTF-8 bytes, latin-1 decoded per PEP 3333: re-decoded
        ("/caf\xe9", "/caf\xe9"),  # a lone 0xE9 byte is not UTF-8: kept as given
        ("/\u20ac", "/\u20ac"),  # not latin-1 at all (no server sends this): kept as given
    ],
)
def test_the_request_path_keys_records_as_utf8_when_it_can(path_info: str, route: str) -> None:
    store = MemoryStore()
    app = IdempotencyWSGIMiddleware(Recorder(), store=store)
    try:
        assert call(app, environ_for("k1", path=path_info))[0] == "201 Created"
    finally:
        app.close()
    record = store.get(storage_key("POST", route, None, "k1"))
    assert record is not None and record.status is Status.COMPLETED


def test_an_app_that_never_calls_start_response_is_an_error_and_frees_the_key() -> None:
    calls: list[bool] = []

    def app(environ: Environ, start_response: Any) -> Iterable[bytes]:
        calls.append(True)
        if len(calls) == 1:
            return []
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    store = MemoryStore()
    middleware = IdempotencyWSGIMiddleware(app, store=store)
    try:
        with pytest.raises(RuntimeError, match="without calling start_response"):
            call(middleware, environ_for("k1"))
        # The key was not completed with nothing: the retry runs the app.
        assert call(middleware, environ_for("k1")) == ("200 OK", b"ok")
    finally:
        middleware.close()
    assert len(calls) == 2


def test_start_response_twice_without_exc_info_is_refused() -> None:
    def app(environ: Environ, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"never"]

    middleware = IdempotencyWSGIMiddleware(app, store=MemoryStore())
    try:
        with pytest.raises(AssertionError, match="start_response called twice"):
            call(middleware, environ_for("k1"))
    finally:
        middleware.close()


def streaming_app(environ: Environ, start_response: Any) -> Iterable[bytes]:
    write = start_response("200 OK", [("Content-Type", "text/event-stream")])
    write(b"data: first\n\n")  # the legacy write() before the iterable
    return [b"data: second\n\n", b"data: third\n\n"]  # a list: it has no close()


def test_a_live_stream_sends_its_write_prefix_first_and_counts_it() -> None:
    store = MemoryStore()
    app = IdempotencyWSGIMiddleware(streaming_app, store=store)
    expected = b"data: first\n\ndata: second\n\ndata: third\n\n"
    try:
        with serve_wsgi(app) as url:
            response = httpx.post(f"{url}/events", headers={"Idempotency-Key": "s1"}, content=b"")
    finally:
        app.close()
    assert response.status_code == 200
    assert response.content == expected
    record = store.get(storage_key("POST", "/events", None, "s1"))
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.response_not_stored
    assert record.response_size == len(expected)


def test_live_body_close_without_an_iterable_close_still_finishes_once() -> None:
    finished: list[tuple[int, bool]] = []
    body = LiveBody(b"ab", iter([b"cde"]), lambda size, failed: finished.append((size, failed)))
    assert list(body) == [b"ab", b"cde"]
    body.close()
    body.close()
    assert finished == [(5, False)]
