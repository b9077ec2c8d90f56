"""The floor: the least a new key can cost with our guarantees, next to ours and the peer's.

``FloorMiddleware`` is a measurement device, not a middleware to deploy. It does, inlined
in one function (it hands the app the body through our own replaying ``receive``), only
the work the README's semantics ask of every new key:

- check the key and the body's size;
- fingerprint the request (canonical JSON, SHA-256, our framing);
- namespace and hash the key;
- claim and complete it in a dict, fenced by an owner token, releasing it on an exception;
- buffer the response and drop its hop-by-hop headers.

It leaves out everything ours adds around that: rules, problem responses, lease renewal,
events, the replay cache, streaming, the store protocol. It handles the benchmark's
requests only and raises on anything else.

So its figure is a lower bound for ours: if the floor cannot beat the lightest peer, no
arrangement of our code that keeps canonical JSON will. The floor without canonical JSON
(the raw body hashed, as the peer does) shows that the harness does not favour the peer.

    python -m benchmarks.floor [--rounds 30] [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from benchmarks import overhead
from benchmarks._apps import order_app
from benchmarks._common import heading, machine_summary, median, signed_us, table, timed_batch
from idempotency_middleware.policy.fingerprint import _DIGITS_TO_ZERO, _LONG_NUMBER
from idempotency_middleware.policy.keys import _BARE_ALLOWED, MAX_KEY_LENGTH
from idempotency_middleware.policy.options import (
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_TTL_SECONDS,
)
from idempotency_middleware.stores.records import DROPPED_HEADERS
from idempotency_middleware.web.asgi_messages import replaying_receive as _replaying_receive

LIGHTEST_PEER = "fastapi-idempotency-key"
_COVERED = frozenset({"POST", "PATCH"})

Response = tuple[int, list[tuple[bytes, bytes]], bytes]
# fingerprint, owner token, expiry (the lock's while in progress, the TTL's once completed),
# response (None while in progress)
FloorRecord = tuple[str, str, float, Response | None]


class Unsupported(Exception):
    """A request outside the floor's one path (ours would answer it; the floor does not)."""


class FloorMiddleware:
    def __init__(self, app: ASGIApp, *, canonical_json: bool = True) -> None:
        self.app = app
        self.canonical_json = canonical_json
        self.records: dict[str, FloorRecord] = {}
        self._lock = threading.Lock()
        self._owner_prefix = os.urandom(12).hex() + "-"
        self._owner_numbers = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _COVERED:
            await self.app(scope, receive, send)
            return
        key = content_type = None
        for name, value in scope["headers"]:
            if name == b"idempotency-key":
                if key is not None:
                    raise Unsupported("the key header twice")
                key = value
            elif name == b"content-type":
                content_type = value
        if key is None:
            await self.app(scope, receive, send)
            return
        if scope.get("query_string"):
            raise Unsupported("a query string (the floor's fingerprint leaves it out)")
        key = key.strip(b" \t")
        if not key or len(key) > MAX_KEY_LENGTH or key.translate(None, _BARE_ALLOWED):
            raise Unsupported("an invalid or quoted key")
        message = await receive()
        if message["type"] != "http.request" or message.get("more_body", False):
            raise Unsupported("a body in more than one message, or a disconnect")
        body: bytes = message.get("body", b"")
        if len(body) > DEFAULT_MAX_BODY_BYTES:
            raise Unsupported("a body over the limit (ours answers 413)")

        # The same framing as keys.storage_key (no scope) and fingerprint.fingerprint_request
        # (no query), so the floor hashes exactly what ours hashes.
        method = scope["method"].encode("ascii")
        path = scope["path"].encode("utf-8")
        storage_key = hashlib.sha256(
            b"%d %s%d %s0 %d %s" % (len(method), method, len(path), path, len(key), key)
        ).hexdigest()
        kind, canonical = b"bytes", body
        if (
            self.canonical_json
            and content_type == b"application/json"
            and _LONG_NUMBER not in body.translate(_DIGITS_TO_ZERO)
        ):
            kind = b"json"
            canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
        fingerprint = hashlib.sha256(
            b"%d %s%d %s0 %d %s%d %s"
            % (len(method), method, len(path), path, len(kind), kind, len(canonical), canonical)
        ).hexdigest()

        owner = f"{self._owner_prefix}{next(self._owner_numbers):x}"
        now = time.time()
        with self._lock:
            held = self.records.get(storage_key)
            if held is not None and held[2] > now:
                raise Unsupported("a key already held (the floor measures new keys)")
            self.records[storage_key] = (
                fingerprint,
                owner,
                now + DEFAULT_LOCK_TIMEOUT_SECONDS,
                None,
            )

        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self.app(scope, _replaying_receive(body, receive), capture)
        except BaseException:
            self._release(storage_key, owner)
            raise
        if start is None or start["status"] >= 500:
            self._release(storage_key, owner)
            raise Unsupported("no response, or a 5xx")
        response_body = b"".join(chunks)
        headers = [
            (name, value)
            for name, value in start.get("headers", [])
            if name.lower() not in DROPPED_HEADERS
        ]
        finished = time.time()
        with self._lock:
            held = self.records.get(storage_key)
            if held is None or held[1] != owner:
                raise Unsupported("the claim was taken over")
            self.records[storage_key] = (
                fingerprint,
                owner,
                finished + DEFAULT_TTL_SECONDS,
                (start["status"], headers, response_body),
            )
        await send(start)
        await send({"type": "http.response.body", "body": response_body, "more_body": False})

    def _release(self, storage_key: str, owner: str) -> None:
        with self._lock:
            held = self.records.get(storage_key)
            if held is not None and held[1] == owner:
                del self.records[storage_key]


def floor_app(*, canonical_json: bool) -> Starlette:
    return order_app([Middleware(FloorMiddleware, canonical_json=canonical_json)])


def _contenders() -> list[tuple[str, Callable[[], Starlette] | None, str]]:
    """(label, app builder or None, why not) in table order."""
    listed = {contender.distribution: contender for contender in overhead.all_contenders()}
    ours, peer = listed["idempotency-middleware"], listed[LIGHTEST_PEER]
    return [
        ("ours, MemoryStore (canonical JSON)", ours.build, ours.error),
        (f"{LIGHTEST_PEER} {peer.version} (raw body)", peer.build, peer.error),
        ("floor, canonical JSON", lambda: floor_app(canonical_json=True), ""),
        ("floor, raw body (as the peer)", lambda: floor_app(canonical_json=False), ""),
    ]


async def _run(rounds: int, requests: int) -> str:
    contenders = _contenders()
    overheads: dict[str, list[float]] = {label: [] for label, _, _ in contenders}
    bare_means: list[float] = []
    jobs: list[tuple[str, Callable[[], Starlette] | None]] = [("bare", None)]
    jobs += [(label, build) for label, build, error in contenders if build and not error]
    for round_number in range(rounds + 1):  # round 0 is a discarded warm-up
        shift = round_number % len(jobs)
        means: dict[str, float] = {}
        for label, build in jobs[shift:] + jobs[:shift]:
            if build is None:
                means[label] = await timed_batch(order_app(), [b"k"] * requests, 201)
            else:
                means[label] = await overhead.measure_new(build, requests)
        if round_number == 0:
            continue
        bare_means.append(means["bare"])
        for label, mean in means.items():
            if label != "bare":
                overheads[label].append(mean - means["bare"])

    peer_label = contenders[1][0]
    peer = median(overheads[peer_label]) if overheads[peer_label] else None
    rows = []
    for label, _, error in contenders:
        if error or not overheads[label]:
            rows.append([label, error or "n/a", ""])
            continue
        figure = median(overheads[label])
        ratio = f"{figure / peer:.2f}x" if peer else "n/a"
        rows.append([label, signed_us(figure), ratio])
    return "\n".join(
        [
            table(
                "New-key overhead over the bare app (microseconds, median of round differences)",
                ["middleware", "new key overhead", f"vs {LIGHTEST_PEER}"],
                rows,
            ),
            "",
            f"{rounds} interleaved rounds (+1 warm-up) x {requests} new keys each; bare app "
            f"{min(bare_means) * 1e6:.1f}-{max(bare_means) * 1e6:.1f} us per request.",
            "The floor does only the essential work, inlined (see benchmarks/floor.py): it is "
            "a lower bound for ours, not a middleware.",
        ]
    )


def run(rounds: int = 30, requests: int = 500) -> str:
    return asyncio.run(_run(rounds, requests))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args(argv)
    heading("floor: the least a new key can cost with canonical JSON, raw ASGI driver")
    print(run(args.rounds, args.requests), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
