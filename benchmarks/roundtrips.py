"""DynamoDB calls per request, counted on the wire.

A counting HTTP reverse proxy on 127.0.0.1 sits between ``AsyncDynamoDBStore`` and moto's
``ThreadedMotoServer``; it counts every request it forwards by its ``X-Amz-Target`` header
(``DynamoDB_20120810.PutItem`` ...). The real middleware is driven in-process through the
raw ASGI interface, so nothing but the store talks to the proxy.

    python -m benchmarks.roundtrips [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import inspect
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from benchmarks._common import (
    HOST,
    REGION,
    Exchange,
    call_once,
    create_table,
    heading,
    machine_summary,
    moto_in_thread,
    table,
)
from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
)
REPLAY_CACHE_SIZE = 128


class CountingProxy:
    """A threaded HTTP/1.1 reverse proxy that counts what passes through it."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy.forward(self)

            def do_GET(self) -> None:
                proxy.forward(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(*self.upstream, timeout=10)
            self._local.connection = connection
        return connection

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        target = handler.headers.get("X-Amz-Target") or f"{handler.command} (no X-Amz-Target)"
        with self._lock:
            self.calls[target.rsplit(".", 1)[-1]] += 1
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_BY_HOP}
        connection = self._connection()
        try:
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException):
            connection.close()  # the upstream dropped a kept-alive connection: retry once
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
        payload = response.read()
        handler.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.calls)

    @contextlib.contextmanager
    def running(self) -> Iterator[CountingProxy]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


class GatedApp:
    """A raw ASGI app answering 201; when ``hold`` is set it waits inside the handler."""

    def __init__(self) -> None:
        self.hold = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message: Message = await receive()
        while message.get("more_body", False):
            message = await receive()
        self.runs += 1
        if self.hold:
            self.entered.set()
            await self.release.wait()
        body = b'{"status":"accepted"}'
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _describe(calls: Counter[str]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in sorted(calls.items())) or "none"


def _per_request(calls: Counter[str], requests: int) -> str:
    total = sum(calls.values()) / requests
    return f"{total:g}"


def _replayed(exchange: Exchange) -> bool:
    return exchange.header(b"idempotent-replayed") == b"true"


def _accepts_replay_cache() -> bool:
    return "replay_cache_size" in inspect.signature(IdempotencyMiddleware.__init__).parameters


async def _scenarios(proxy: CountingProxy, table_name: str, repeats: int) -> list[list[str]]:
    rows: list[list[str]] = []
    async with AsyncDynamoDBStore(table_name, endpoint_url=proxy.url, region_name=REGION) as store:
        gated = GatedApp()
        app = IdempotencyMiddleware(gated, store=store)
        await call_once(app, b"connection-warm-up")  # the client's first call opens its pool

        def row(label: str, expected: str, calls: Counter[str], n: int, result: str) -> None:
            rows.append([label, expected, _per_request(calls, n), _describe(calls), result])

        # New keys.
        keys = [f"new-{uuid.uuid4().hex}".encode() for _ in range(repeats)]
        before = proxy.snapshot()
        statuses = [(await call_once(app, key)).status for key in keys]
        row(
            "new key",
            "2",
            proxy.snapshot() - before,
            repeats,
            f"{Counter(statuses)[201]}/{repeats} x 201",
        )

        # Duplicates of completed keys: replayed from the store.
        before = proxy.snapshot()
        runs = gated.runs
        replays = [await call_once(app, key) for key in keys]
        ok = sum(1 for e in replays if e.status == 201 and _replayed(e))
        row(
            "duplicate (completed -> replay)",
            "1",
            proxy.snapshot() - before,
            repeats,
            f"{ok}/{repeats} replayed, handler runs +{gated.runs - runs}",
        )

        # Duplicates while the first request is still in its handler: 409.
        conflicts = 0
        calls: Counter[str] = Counter()
        gated.hold = True
        for _ in range(repeats):
            key = f"busy-{uuid.uuid4().hex}".encode()
            gated.entered.clear()
            gated.release.clear()
            first = asyncio.create_task(call_once(app, key))
            await gated.entered.wait()
            before = proxy.snapshot()
            second = await call_once(app, key)
            calls += proxy.snapshot() - before
            conflicts += second.status == 409
            gated.release.set()
            await first
        gated.hold = False
        row(
            "in-progress conflict (409)",
            "1",
            calls,
            repeats,
            f"{conflicts}/{repeats} x 409",
        )

        # Replays served from the opt-in in-process cache.
        if not _accepts_replay_cache():
            rows.append(
                [
                    f"cached replay (replay_cache_size={REPLAY_CACHE_SIZE}, from the cache)",
                    "0",
                    "n/a (option not available)",
                    "-",
                    "-",
                ]
            )
            return rows
        options: dict[str, Any] = {"replay_cache_size": REPLAY_CACHE_SIZE}
        cached_app = IdempotencyMiddleware(gated, store=store, **options)
        cached_keys = [f"cached-{uuid.uuid4().hex}".encode() for _ in range(repeats)]
        before = proxy.snapshot()
        statuses = [(await call_once(cached_app, key)).status for key in cached_keys]
        row(
            f"new key, replay_cache_size={REPLAY_CACHE_SIZE}",
            "2",
            proxy.snapshot() - before,
            repeats,
            f"{Counter(statuses)[201]}/{repeats} x 201",
        )
        for label, expected in (
            ("first replay, cache on (may fill the cache)", "<= 1"),
            ("cached replay (served from the cache)", "0"),
        ):
            before = proxy.snapshot()
            runs = gated.runs
            replays = [await call_once(cached_app, key) for key in cached_keys]
            ok = sum(1 for e in replays if e.status == 201 and _replayed(e))
            row(
                label,
                expected,
                proxy.snapshot() - before,
                repeats,
                f"{ok}/{repeats} replayed, handler runs +{gated.runs - runs}",
            )
    return rows


def run(repeats: int = 5) -> str:
    with moto_in_thread() as moto_url:
        proxy = CountingProxy(moto_url)
        with proxy.running():
            table_name = f"bench-{uuid.uuid4().hex[:8]}"
            create_table(moto_url, table_name)
            rows = asyncio.run(_scenarios(proxy, table_name, repeats))
    return "\n".join(
        [
            table(
                "DynamoDB requests per HTTP request, counted by a proxy in front of moto",
                ["scenario", "target", "measured per request", "operations seen", "responses"],
                rows,
            ),
            "",
            f"Each scenario runs {repeats} times on fresh keys; 'operations seen' totals them.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="DynamoDB round trips, counted on the wire")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    heading("roundtrips: DynamoDB calls counted on the wire (moto behind a counting proxy)")
    print(run(args.repeats), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
