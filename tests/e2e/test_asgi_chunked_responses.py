"""An ASGI response sent in several body messages (not a streaming media type) is buffered
whole, stored, and replayed byte for byte, with or without a declared Content-Length."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from idempotency_middleware import IdempotencyMiddleware, MemoryStore
from tests.support.servers import serve_asgi

CHUNKS = [b"", b'{"items": [', b'"a", "b"', b"]}"]
BODY = b"".join(CHUNKS)


class Runs:
    count = 0


async def chunks() -> AsyncIterator[bytes]:
    for chunk in CHUNKS:
        yield chunk


async def create(request: Request) -> StreamingResponse:
    Runs.count += 1
    headers = {"content-length": str(len(BODY))} if "declared" in request.url.path else {}
    return StreamingResponse(
        chunks(), status_code=201, media_type="application/json", headers=headers
    )


@pytest.mark.parametrize("path", ["/declared", "/undeclared"])
def test_a_response_sent_in_several_chunks_is_stored_whole_and_replayed(path: str) -> None:
    app = Starlette(routes=[Route(path, create, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore())
    before = Runs.count
    with serve_asgi(app) as url, httpx.Client(base_url=url, trust_env=False) as client:
        first = client.post(path, json={}, headers={"Idempotency-Key": f"c-{path}"})
        replay = client.post(path, json={}, headers={"Idempotency-Key": f"c-{path}"})
    assert first.status_code == replay.status_code == 201
    assert first.content == replay.content == BODY
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.headers["content-length"] == str(len(BODY))
    assert Runs.count - before == 1
