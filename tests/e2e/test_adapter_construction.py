"""Both middlewares validate alike at construction, and refuse a store of the wrong kind."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyRule,
    IdempotencyWSGIMiddleware,
    MemoryStore,
)
from tests.support.servers import serve_asgi, serve_wsgi


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("never called")


def wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
    raise AssertionError("never called")


def build_asgi(**options: Any) -> object:
    return IdempotencyMiddleware(asgi_app, store=MemoryStore(), **options)


def build_wsgi(**options: Any) -> object:
    return IdempotencyWSGIMiddleware(wsgi_app, store=MemoryStore(), **options)


BUILDERS: list[Callable[..., object]] = [build_asgi, build_wsgi]


def test_the_asgi_middleware_refuses_a_sync_only_store() -> None:
    with pytest.raises(TypeError, match="needs an async store"):
        IdempotencyMiddleware(asgi_app, store=DynamoDBStore("t"))  # type: ignore[arg-type]


def test_the_wsgi_middleware_refuses_an_async_only_store() -> None:
    with pytest.raises(TypeError, match="needs a sync store"):
        IdempotencyWSGIMiddleware(wsgi_app, store=AsyncDynamoDBStore("t"))  # type: ignore[arg-type]


def test_one_memory_store_serves_both_middlewares() -> None:
    # MemoryStore is both a sync and an async store: one instance behind an ASGI and a WSGI
    # app runs each app's handler once per key and replays the retry.
    store = MemoryStore()
    runs: collections.Counter[str] = collections.Counter()

    async def counting_asgi_app(scope: Any, receive: Any, send: Any) -> None:
        runs["asgi"] += 1
        body = f"asgi run {runs['asgi']}".encode()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})

    def counting_wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
        runs["wsgi"] += 1
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [f"wsgi run {runs['wsgi']}".encode()]

    wsgi = IdempotencyWSGIMiddleware(counting_wsgi_app, store=store)
    asgi = IdempotencyMiddleware(counting_asgi_app, store=store)
    try:
        with serve_asgi(asgi) as asgi_url, serve_wsgi(wsgi) as wsgi_url:
            for adapter, url in (("asgi", asgi_url), ("wsgi", wsgi_url)):
                headers = {"Idempotency-Key": f"{adapter}-{uuid.uuid4()}"}
                with httpx.Client(base_url=url, timeout=15) as client:
                    first = client.post("/orders", content=b"{}", headers=headers)
                    retry = client.post("/orders", content=b"{}", headers=headers)
                assert first.status_code == retry.status_code == 201, adapter
                assert first.content == retry.content == f"{adapter} run 1".encode()
                assert retry.headers.get("idempotent-replayed") == "true", adapter
    finally:
        wsgi.close()
    assert runs == {"asgi": 1, "wsgi": 1}


@pytest.mark.parametrize("build", BUILDERS, ids=["asgi", "wsgi"])
@pytest.mark.parametrize(
    "options",
    [
        {"ttl_seconds": 0},
        {"lock_timeout_seconds": -1},
        {"methods": ["GET"]},
        {"header_name": "Idempotency Key"},
        {"max_body_bytes": 0},
        {"scope": "tenant"},
        {"on_store_error": "ignore"},
        {"replay_cache_size": -1},
        {"on_event": 42},
        {"rules": [IdempotencyRule("/{rest:path}"), IdempotencyRule("/orders")]},
    ],
    ids=lambda options: next(iter(options)),
)
def test_both_middlewares_refuse_the_same_bad_options(
    build: Callable[..., object], options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        build(**options)


@pytest.mark.parametrize("build", BUILDERS, ids=["asgi", "wsgi"])
def test_both_middlewares_have_the_documented_defaults(build: Callable[..., object]) -> None:
    options = build().options  # type: ignore[attr-defined]
    assert options.header_name == "Idempotency-Key"
    assert options.methods == frozenset({"POST", "PATCH"})
    assert options.required is False
    assert options.ttl_seconds == 86400
    assert options.lock_timeout_seconds == 60
    assert options.rules == ()
    assert options.scope is None
    assert options.max_body_bytes == 1024 * 1024
