"""The ASGI door refuses a declared Content-Length over ``max_body_bytes`` before reading the
body, whatever its digit count: it parses only a value with as many digits as the limit or
more (a shorter one cannot exceed it), and that shortcut must not let a longer one through.

Raw HTTP/1.1 over a socket to uvicorn: the request declares its length and sends no body, so
an answer at all shows the door answered from the declared length alone (had it read the
body, uvicorn would wait for bytes that never come)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from idempotency_middleware import IdempotencyMiddleware, MemoryStore
from tests.support.servers import serve_asgi

LIMIT = 100  # three digits


async def create(request: Request) -> Response:
    return Response(str(len(await request.body())), status_code=201)


def _post(url: str, declared: str, body: bytes, key: str) -> bytes:
    parts = urlsplit(url)
    assert parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(
            b"POST /orders HTTP/1.1\r\nHost: test\r\nContent-Type: application/octet-stream\r\n"
            + f"Content-Length: {declared}\r\nIdempotency-Key: {key}\r\n\r\n".encode()
            + body
        )
        head = conn.recv(65536)
    return head.split(b"\r\n", 1)[0]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), max_body_bytes=LIMIT)
    with serve_asgi(app) as served:
        yield served


@pytest.mark.parametrize("declared", ["101", "0101", "1000", "99999999999999999999"])
def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(
    url: str, declared: str
) -> None:
    assert _post(url, declared, b"", f"over-{declared}") == b"HTTP/1.1 413 Request Entity Too Large"


@pytest.mark.parametrize("declared", ["1", "99", "100", "0100"])
def test_a_declared_length_within_the_limit_reaches_the_handler(url: str, declared: str) -> None:
    body = b"x" * int(declared)
    assert _post(url, declared, body, f"within-{declared}") == b"HTTP/1.1 201 Created"
