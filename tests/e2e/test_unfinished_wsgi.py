"""An unfinished WSGI response is never stored nor replayed.

Each app below cuts its response short (its iterable raises, or it sends fewer or more
bytes than its ``Content-Length``). Served by waitress without the middleware, the client
sees what waitress makes of it; with it, the client sees the same, the key is released,
and a retry runs the handler again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from idempotency_middleware import IdempotencyWSGIMiddleware, MemoryStore
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.web.wsgi_environ import Environ, StartResponse
from tests.support.servers import released, serve_wsgi

KEY = {"Idempotency-Key": '"cut-1"'}


def key_hash(path: str) -> str:
    return storage_key("POST", path, None, "cut-1")


class CuttingApp:
    """Cuts its response as its path says; counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
        self.runs += 1
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        path: str = environ["PATH_INFO"]
        stream = "stream" in path
        headers = [("Content-Type", "text/event-stream" if stream else "text/plain")]
        if "short" in path:
            headers.append(("Content-Length", "100"))
        elif "long" in path:
            headers.append(("Content-Length", "3"))
        start_response("200 OK", headers)
        return self.body(path)

    @staticmethod
    def body(path: str) -> Iterator[bytes]:
        if "raised-first" in path:
            raise RuntimeError("the handler failed before its first byte")
        yield b"part"
        if "raised" in path:
            raise RuntimeError("the handler failed midway")
        yield b"ial"


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
    middleware = IdempotencyWSGIMiddleware(wrapped, store=store)
    with serve_wsgi(bare) as bare_url, serve_wsgi(middleware) as wrapped_url:
        yield bare, bare_url, wrapped, store, wrapped_url
    middleware.close()


@pytest.mark.parametrize(
    ("path", "cut"),
    [
        ("/raised", True),
        ("/raised-first", False),  # waitress answers 500: no byte was sent
        ("/short", True),
        ("/long", False),  # waitress sends the declared 3 bytes and drops the rest
        ("/stream/raised", True),
        ("/stream/short", True),
        ("/stream/long", False),
    ],
)
def test_an_unfinished_response_is_cut_released_and_run_again(
    servers: tuple[CuttingApp, str, CuttingApp, MemoryStore, str], path: str, cut: bool
) -> None:
    _, bare_url, wrapped, store, wrapped_url = servers
    with httpx.Client(base_url=bare_url, timeout=10) as client:
        without = outcome(client, path)
    assert (without[0] == "failed") is cut
    if path == "/long":
        assert without == ("answered", 200, b"par")  # waitress sends the declared length
    elif path == "/raised-first":
        assert without[:2] == ("answered", 500)
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
