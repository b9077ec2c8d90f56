"""The WSGI adapter's per-request overhead over a bare Flask app, in-process.

Each request builds a minimal PEP 3333 environ (the ~100-byte JSON order in
``wsgi.input``), calls the WSGI callable and drains its iterable. Rounds interleave bare
Flask, the middleware with a new key each request, with one repeated key (replay), and
with no key (pass-through); each figure is the median over rounds of the mean per request,
each overhead the median over rounds of (mean - bare mean in that round).

    python -m benchmarks.wsgi_overhead [--rounds 20] [--requests 500]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import io
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

from benchmarks._common import BODY, heading, machine_summary, median, signed_us, table, us
from idempotency_middleware import IdempotencyWSGIMiddleware, MemoryStore

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class HandlerRuns:
    count = 0


def flask_app() -> Flask:
    app = Flask("bench")

    @app.post("/orders")
    def create_order() -> ResponseReturnValue:
        order = request.get_json()
        HandlerRuns.count += 1
        return jsonify(id=HandlerRuns.count, amount=order["amount"], status="accepted"), 201

    return app


def environ_for(key: str | None) -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/orders",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "50000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_HOST": "127.0.0.1:8000",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    return environ


class _Status:
    __slots__ = ("line",)

    def __init__(self) -> None:
        self.line = ""

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], object]:
        self.line = status
        return lambda _chunk: None


def call(app: WSGIApp, key: str | None) -> str:
    status = _Status()
    result = app(environ_for(key), status.start_response)
    try:
        for _chunk in result:
            pass
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return status.line


def timed_batch(app: WSGIApp, keys: Sequence[str | None]) -> float:
    gc.collect()
    wrong = 0
    start = time.perf_counter()
    for key in keys:
        if not call(app, key).startswith("201"):
            wrong += 1
    elapsed = time.perf_counter() - start
    if wrong:
        raise RuntimeError(f"{wrong} of {len(keys)} responses were not 201")
    return elapsed / len(keys)


def _close(app: IdempotencyWSGIMiddleware) -> None:
    # Stops the adapter's lease-renewal thread, where the adapter has one.
    close = getattr(app, "close", None)
    if close is not None:
        close()


def _new_key(flask: Flask, requests: int) -> float:
    app = IdempotencyWSGIMiddleware(flask.wsgi_app, store=MemoryStore())
    prefix = uuid.uuid4().hex[:12]
    keys: list[str | None] = [f"{prefix}-{index:06d}" for index in range(requests)]
    before = HandlerRuns.count
    try:
        mean = timed_batch(app, keys)
    finally:
        _close(app)
    if HandlerRuns.count - before != requests:
        raise RuntimeError("the handler did not run once per new key")
    return mean


def _replay(flask: Flask, requests: int) -> float:
    app = IdempotencyWSGIMiddleware(flask.wsgi_app, store=MemoryStore())
    try:
        call(app, "replayed-key-0001")
        before = HandlerRuns.count
        mean = timed_batch(app, ["replayed-key-0001"] * requests)
    finally:
        _close(app)
    if HandlerRuns.count != before:
        raise RuntimeError("the handler ran on a replay")
    return mean


def _no_key(flask: Flask, requests: int) -> float:
    app = IdempotencyWSGIMiddleware(flask.wsgi_app, store=MemoryStore())
    try:
        return timed_batch(app, [None] * requests)
    finally:
        _close(app)


def run(rounds: int = 20, requests: int = 500) -> str:
    flask = flask_app()
    jobs: list[tuple[str, Callable[[Flask, int], float]]] = [
        ("bare", lambda app, n: timed_batch(app.wsgi_app, ["k"] * n)),
        ("new key", _new_key),
        ("replay", _replay),
        ("no key (pass-through)", _no_key),
    ]
    means: dict[str, list[float]] = {name: [] for name, _ in jobs}
    overheads: dict[str, list[float]] = {name: [] for name, _ in jobs}
    for round_number in range(rounds + 1):  # the first round warms up and is discarded
        shift = round_number % len(jobs)
        results = {name: job(flask, requests) for name, job in jobs[shift:] + jobs[:shift]}
        if round_number == 0:
            continue
        for name, mean in results.items():
            means[name].append(mean)
            overheads[name].append(mean - results["bare"])
    bare = median(means["bare"])
    rows = [["bare Flask app", us(bare), "-"]]
    rows += [
        [
            f"IdempotencyWSGIMiddleware, MemoryStore: {name}",
            us(median(means[name])),
            signed_us(median(overheads[name])),
        ]
        for name, _ in jobs[1:]
    ]
    return "\n".join(
        [
            table(
                "WSGI: per-request time over bare Flask (microseconds, median of round means)",
                ["app", "per request", "overhead"],
                rows,
            ),
            "",
            f"Flask {importlib.metadata.version('flask')}; {rounds} interleaved rounds (+1 "
            f"warm-up) x {requests} requests; bare round means "
            f"{us(min(means['bare']))}-{us(max(means['bare']))} us.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="WSGI adapter overhead over bare Flask")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args(argv)
    heading("wsgi_overhead: in-process WSGI calls, Flask")
    print(run(args.rounds, args.requests), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
