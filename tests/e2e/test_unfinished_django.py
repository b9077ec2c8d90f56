"""An unfinished Django response is never stored nor replayed.

The ``cut`` view answers a body that does not match its Content-Length (buffered or
streaming), or a stream that fails midway. Served by waitress (Django's WSGI handler) and
uvicorn (its ASGI handler) without the middleware, the client sees the server's cut
response; with it, the client sees the same, the key is released, and a retry runs the
view again.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings

from idempotency_middleware import MemoryStore
from idempotency_middleware.policy.keys import storage_key
from tests.support import django_project as project
from tests.support.apps import AppState
from tests.support.servers import released, serve_asgi, serve_wsgi

WITHOUT_US = ["django.middleware.common.CommonMiddleware"]
# Under ASGI Django warns that it consumes the cut view's sync iterators: that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume")


def key_for(url: str) -> str:
    """One key per case: every case is the route /cut."""
    return "cut-" + hashlib.sha256(url.encode()).hexdigest()[:12]


def outcome(client: httpx.Client, url: str) -> tuple[Any, ...]:
    try:
        response = client.post(url, headers={"Idempotency-Key": key_for(url)}, content=b"x")
    except httpx.HTTPError as error:
        return ("failed", type(error).__name__)
    return ("answered", response.status_code, response.content)


@pytest.fixture(params=["wsgi", "asgi"], scope="module")
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, MemoryStore]]:
    store = MemoryStore()
    handler_class: Any = ASGIHandler if request.param == "asgi" else WSGIHandler
    serve: Any = serve_asgi if request.param == "asgi" else serve_wsgi
    with override_settings(MIDDLEWARE=WITHOUT_US):
        bare = handler_class()
    with override_settings(IDEMPOTENCY={"store": store}):
        wrapped = handler_class()
    with contextlib.ExitStack() as stack:
        bare_url = stack.enter_context(serve(bare))
        wrapped_url = stack.enter_context(serve(wrapped))
        yield bare_url, wrapped_url, store


@pytest.mark.parametrize(
    "url",
    [
        "/cut?length=100",
        "/cut?length=3",
        "/cut?length=100&stream=1",
        "/cut?length=3&stream=1",
        "/cut?fail=1",
    ],
)
def test_an_unfinished_response_is_cut_released_and_run_again(
    servers: tuple[str, str, MemoryStore], url: str
) -> None:
    bare_url, wrapped_url, store = servers
    project.use_state(AppState())
    with httpx.Client(base_url=bare_url, timeout=10) as client:
        without = outcome(client, url)
    assert without[:2] != ("answered", 200) or without[2] != b"partial"
    key_hash = storage_key("POST", "/cut", None, key_for(url))
    with httpx.Client(base_url=wrapped_url, timeout=10) as client:
        first = outcome(client, url)
        assert released(store, key_hash)  # released, nothing stored
        retry = outcome(client, url)
    assert first == retry == without
    assert project.state().calls(project.POST_CUT) == 3  # the bare run, then two
    assert released(store, key_hash)
