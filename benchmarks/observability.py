"""The cost of the metrics and traces hooks per request: the ASGI middleware on
``MemoryStore`` with each hook against none, side by side in one run, and against the
calls the hook makes to its library, alone.

    python -m benchmarks.observability [--rounds 9] [--requests 300]
    python -m benchmarks.observability --instructions [--requests 300]

The app answers ``POST /orders`` with 201 and a small JSON document, driven in process over
raw ASGI. Contenders: the app alone (to measure the middleware's own overhead), the
middleware with no hook, with a hook doing nothing (what building the events costs, any
hook's floor), with ``Prometheus`` (a registry of its own), with
``OpenTelemetry`` on the SDK's meter provider (metrics only: no span is current), and the
middleware with no hook and with ``OpenTelemetry`` each inside a recording server span (the
SDK's tracer provider, no exporter), where the hook adds a child span per store call. Cases:
a new key every request (claim and complete) and a replay.

Beside them, the libraries' own floor: the app alone making, per request, exactly the
library calls the hook makes for that case (a new key: two counter increments and two
histogram observations; a replay: one of each; in a span, also a child span per store call
and two attributes per event on the server's span), on label children or attribute sets
built once, the cheapest way to call the library. What a hook adds beyond them is what the
package can make cheaper.

Every round runs a batch of ``--requests`` requests per contender per case, in an order that
alternates from round to round; a figure is the median over the rounds of the batch's mean
CPU per request (``time.process_time``). A hook's cost is set against the middleware's own
overhead (no hook minus the app alone). ``--instructions`` counts the CPU instructions of
the same requests instead, under valgrind's callgrind: a figure that does not move with the
machine's load (about 1% from run to run).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter, Histogram

from benchmarks._common import (
    Exchange,
    heading,
    http_scope,
    machine_summary,
    median,
    order_headers,
    table,
)
from idempotency_middleware import IdempotencyMiddleware, MemoryStore
from idempotency_middleware.observability import OpenTelemetry, Prometheus
from idempotency_middleware.observability import conventions as names

NEW, REPLAY = "new key", "replay"
CASES = (NEW, REPLAY)
BODY = b'{"order": "created"}'
TARGET = 0.10
WARM_UP_REQUESTS = 50
# What a MemoryStore call takes: the first bucket, as the hooks' own observations land.
STORE_CALL_SECONDS = 2e-6

# What the hooks label a request of this app with (no rule: the route is "unmatched").
_ATTEMPT = ("http", "unmatched", "memory")
# The events and store calls of one request, per case.
_EVENTS = {NEW: ("claimed", "completed"), REPLAY: ("replayed",)}
_STORE_CALLS = {NEW: ("claim", "complete"), REPLAY: ("claim",)}


async def order_app(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    while message.get("more_body", False):
        message = await receive()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"20")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


def order_app_calling(calls: Callable[[], None]) -> Any:
    """``order_app`` making ``calls()`` once per request: a library's floor."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls()
        await order_app(scope, receive, send)

    return app


def in_server_span(app: Any, tracer_provider: TracerProvider) -> Any:
    """``app`` inside a recording span per request, as the ASGI instrumentation runs it."""
    tracer = tracer_provider.get_tracer("benchmark")

    async def traced(scope: Any, receive: Any, send: Any) -> None:
        with tracer.start_as_current_span("POST /orders"):
            await app(scope, receive, send)

    return traced


def prometheus_calls(case: str, registry: CollectorRegistry | None = None) -> Callable[[], None]:
    """The ``prometheus_client`` calls ``Prometheus`` makes for a request of ``case``."""
    registry = registry if registry is not None else CollectorRegistry()
    common: dict[str, Any] = {"namespace": "idempotency", "registry": registry}
    attempts = Counter(names.PROMETHEUS_ATTEMPTS, "attempts", names.ATTEMPT_LABELS, **common)
    durations = Histogram(
        names.PROMETHEUS_STORE_DURATION,
        "store calls",
        names.STORE_CALL_LABELS,
        buckets=names.STORE_DURATION_BUCKETS,
        **common,
    )
    counts = [attempts.labels(kind, *_ATTEMPT) for kind in _EVENTS[case]]
    timings = [durations.labels(operation, "memory", "") for operation in _STORE_CALLS[case]]

    def calls() -> None:
        for timing in timings:
            timing.observe(STORE_CALL_SECONDS)
        for count in counts:
            count.inc()

    return calls


def opentelemetry_calls(
    case: str, meter_provider: MeterProvider, tracer_provider: TracerProvider | None = None
) -> Callable[[], None]:
    """The OpenTelemetry SDK calls ``OpenTelemetry`` makes for a request of ``case``; with
    ``tracer_provider``, its spans' too (a child span per store call, two attributes per
    event on the current span)."""
    meter = meter_provider.get_meter("floor")
    attempts = meter.create_counter(names.ATTEMPTS, unit="{attempt}")
    durations = meter.create_histogram(
        names.STORE_DURATION,
        unit="s",
        explicit_bucket_boundaries_advisory=list(names.STORE_DURATION_BUCKETS),
    )
    labels = (names.DOOR, names.ROUTE, names.STORE)
    counted = [
        {names.OUTCOME: kind, **dict(zip(labels, _ATTEMPT, strict=True))} for kind in _EVENTS[case]
    ]
    timed = [
        {names.OPERATION: operation, names.STORE: "memory"} for operation in _STORE_CALLS[case]
    ]
    tracer = tracer_provider.get_tracer("floor") if tracer_provider is not None else None
    spans = [
        (
            names.span_name(operation),
            {names.DB_SYSTEM_NAME: "memory", names.STORE: "memory", names.OPERATION: operation},
        )
        for operation in _STORE_CALLS[case]
    ]
    client = trace.SpanKind.CLIENT

    def calls() -> None:
        for attributes, (name, span_attributes) in zip(timed, spans, strict=True):
            if tracer is not None:
                tracer.start_span(name, kind=client, attributes=span_attributes).end()
            durations.record(STORE_CALL_SECONDS, attributes)
        for attributes in counted:
            attempts.add(1, attributes)
            if tracer is not None:
                span = trace.get_current_span()
                span.set_attribute(names.OUTCOME, attributes[names.OUTCOME])
                span.set_attribute(names.KEY_HASH, "0" * 64)

    return calls


@dataclass
class Contender:
    name: str
    app: Any = None
    # An app per case, for a floor whose calls differ by case.
    by_case: dict[str, Any] = field(default_factory=dict)
    replay_key: bytes = b""
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def app_for(self, case: str) -> Any:
        return self.by_case.get(case, self.app)


# (hook, its baseline, the app alone under the same conditions, its libraries' floor)
PAIRS = [
    ("a hook doing nothing", "no hook", "app alone", None),
    ("Prometheus", "no hook", "app alone", "Prometheus's calls alone"),
    ("OpenTelemetry, metrics", "no hook", "app alone", "OpenTelemetry's calls alone"),
    (
        "OpenTelemetry, in a span",
        "no hook, in a span",
        "app alone, in a span",
        "OpenTelemetry's calls alone, in a span",
    ),
]


def contenders() -> list[Contender]:
    tracer_provider = TracerProvider()  # records spans, exports none
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otel = OpenTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    prometheus = Prometheus(registry=CollectorRegistry())
    floor_meters = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def middleware(hook: Any = None) -> Any:
        return IdempotencyMiddleware(order_app, store=MemoryStore(), on_event=hook)

    return [
        Contender("app alone", order_app),
        Contender("no hook", middleware()),
        Contender("a hook doing nothing", middleware(lambda event: None)),
        Contender("Prometheus", middleware(prometheus)),
        Contender("OpenTelemetry, metrics", middleware(otel)),
        Contender("app alone, in a span", in_server_span(order_app, tracer_provider)),
        Contender("no hook, in a span", in_server_span(middleware(), tracer_provider)),
        Contender("OpenTelemetry, in a span", in_server_span(middleware(otel), tracer_provider)),
        Contender(
            "Prometheus's calls alone",
            by_case={case: order_app_calling(prometheus_calls(case)) for case in CASES},
        ),
        Contender(
            "OpenTelemetry's calls alone",
            by_case={
                case: order_app_calling(opentelemetry_calls(case, floor_meters)) for case in CASES
            },
        ),
        Contender(
            "OpenTelemetry's calls alone, in a span",
            by_case={
                case: in_server_span(
                    order_app_calling(opentelemetry_calls(case, floor_meters, tracer_provider)),
                    tracer_provider,
                )
                for case in CASES
            },
        ),
    ]


def _keys(contender: Contender, case: str, count: int) -> list[bytes]:
    if case == REPLAY:
        return [contender.replay_key] * count
    return [uuid.uuid4().hex.encode() for _ in range(count)]


async def _requests(app: Any, name: str, case: str, keys: Sequence[bytes]) -> None:
    for key in keys:
        exchange = Exchange()
        await app(http_scope(order_headers(key)), exchange.receive, exchange.send)
        if exchange.status != 201:
            raise RuntimeError(f"{name} {case}: got {exchange.status}")


async def _batch(contender: Contender, case: str, count: int, timed: bool) -> None:
    keys = _keys(contender, case, count)
    gc.collect()
    cpu = time.process_time()
    await _requests(contender.app_for(case), contender.name, case, keys)
    cpu = time.process_time() - cpu
    if timed:
        contender.cpu.setdefault(case, []).append(cpu / count)


async def _prepare(contender: Contender) -> None:
    """A key completed for the replays, and each case's app called once."""
    contender.replay_key = uuid.uuid4().hex.encode()
    await _requests(contender.app_for(NEW), contender.name, NEW, [uuid.uuid4().hex.encode()])
    await _requests(contender.app_for(REPLAY), contender.name, REPLAY, [contender.replay_key])


async def measure(racing: list[Contender], rounds: int, requests: int) -> None:
    for contender in racing:
        await _prepare(contender)
    for round_index in range(-1, rounds):  # round -1 warms up, untimed
        order = racing if round_index % 2 == 0 else racing[::-1]
        for contender in order:
            for case in CASES:
                await _batch(contender, case, requests, timed=round_index >= 0)


def _rows(
    figures: dict[tuple[str, str], float], unit: Callable[[float, str], str]
) -> list[list[str]]:
    """The table's rows from a figure per (contender, case), seconds or instructions,
    written by ``unit(figure, sign)`` (``sign``: ``"+"`` for a difference, else ``""``)."""
    rows = []
    for case in CASES:
        for hook, baseline, alone, floor in PAIRS:
            base = figures[baseline, case]
            own = base - figures[alone, case]
            added = figures[hook, case] - base
            library = figures[floor, case] - figures[alone, case] if floor else 0.0
            share = added / own if own > 0 else float("nan")
            beyond = (added - library) / own if own > 0 else float("nan")
            rows.append(
                [
                    case,
                    hook,
                    unit(own, ""),
                    unit(added, "+"),
                    f"{share * 100:+.1f}%",
                    "yes" if share <= TARGET else "no",
                    unit(library, "") if floor else "-",
                    f"{beyond * 100:+.1f}%",
                ]
            )
    return rows


_HEADERS = [
    "case",
    "hook",
    "middleware's own",
    "hook adds",
    "of the middleware's own",
    f"within {TARGET:.0%}",
    "its library's calls alone",
    "beyond them, of the middleware's own",
]


def report(racing: list[Contender], rounds: int, requests: int) -> str:
    figures = {
        (contender.name, case): median(contender.cpu[case])
        for contender in racing
        for case in CASES
    }
    return "\n".join(
        [
            table(
                "Metrics and traces hooks: CPU per request, ASGI middleware on MemoryStore (µs)",
                _HEADERS,
                _rows(figures, _microseconds),
            ),
            "",
            f"Medians of {rounds} rounds x {requests} requests per case per contender, "
            "contenders alternating in order from round to round. The machine may be shared "
            "with other work: compare the columns of one run, not runs.",
        ]
    )


# --- instructions, counted by callgrind --------------------------------------------------

# The measured requests run inside functools.reduce, which nothing else calls on this path:
# callgrind then counts them alone (``--toggle-collect``), without imports nor warm-up.
_MEASURED = "functools_reduce"


async def _child(name: str, case: str, requests: int) -> None:
    """Under callgrind: warm up, then ``requests`` measured requests of one contender."""
    contender = {contender.name: contender for contender in contenders()}[name]
    await _prepare(contender)
    app = contender.app_for(case)
    await _requests(app, name, case, _keys(contender, case, WARM_UP_REQUESTS))
    keys = _keys(contender, case, requests)
    gc.collect()

    def measured(_: object, __: object) -> None:
        flow = _requests(app, name, case, keys)
        try:  # driven by hand: no request of this app suspends
            flow.send(None)
        except StopIteration:
            return
        flow.close()
        raise RuntimeError(f"{name} {case}: a request suspended")

    functools.reduce(measured, [None], None)


def _count(name: str, case: str, requests: int) -> int:
    completed = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--toggle-collect={_MEASURED}",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "benchmarks.observability",
            "--child",
            name,
            case,
            str(requests),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=False,
    )
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{name} {case}: {last_line}")
    return parse_collected(completed.stderr) // requests


def parse_collected(output: str) -> int:
    """The instructions callgrind collected (``==12== Collected : 1234``); an error when it
    collected none (a Python without its symbols: ``functools_reduce`` was not found)."""
    match = re.search(r"== Collected : (\d+)", output)
    if match is None or int(match.group(1)) == 0:
        raise RuntimeError(f"callgrind collected nothing inside {_MEASURED}")
    return int(match.group(1))


def instructions(requests: int) -> str:
    if shutil.which("valgrind") is None:
        return "SKIPPED: valgrind is not installed (apt install valgrind)."
    pairs = [(contender.name, case) for contender in contenders() for case in CASES]
    # Two cores: two callgrind processes at a time (counts do not depend on the load).
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = pool.map(lambda pair: _count(pair[0], pair[1], requests), pairs)
        counted = dict(zip(pairs, counts, strict=True))
    return "\n".join(
        [
            table(
                "Metrics and traces hooks: instructions per request, counted by callgrind",
                _HEADERS,
                _rows({pair: float(count) for pair, count in counted.items()}, _thousands),
            ),
            "",
            f"{requests} measured requests per contender and case, after {WARM_UP_REQUESTS} "
            "warm-up ones.",
        ]
    )


def _microseconds(seconds: float, sign: str) -> str:
    return f"{seconds * 1e6:{sign}.1f}"


def _thousands(count: float, sign: str) -> str:
    return f"{count:{sign},.0f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("CONTENDER", "CASE", "REQUESTS"))
    arguments = parser.parse_args(argv)
    if arguments.child:
        name, case, requests = arguments.child
        asyncio.run(_child(name, case, int(requests)))
        return
    heading("Metrics and traces hooks")
    print(machine_summary())
    if arguments.instructions:
        print(instructions(arguments.requests))
        return
    racing = contenders()
    asyncio.run(measure(racing, arguments.rounds, arguments.requests))
    print(report(racing, arguments.rounds, arguments.requests))


if __name__ == "__main__":
    main()
