"""The cost of the metrics and traces hooks per request: the ASGI middleware on
``MemoryStore`` with each hook against none, side by side in one run.

    python -m benchmarks.observability [--rounds 9] [--requests 300]

The app answers ``POST /orders`` with 201 and a small JSON document, driven in process over
raw ASGI. Contenders: the app alone (to measure the middleware's own overhead), the
middleware with no hook, with a hook doing nothing (what building the events costs, any
hook's floor), with ``Prometheus`` (a registry of its own), with
``OpenTelemetry`` on the SDK's meter provider (metrics only: no span is current), and the
middleware with no hook and with ``OpenTelemetry`` each inside a recording server span (the
SDK's tracer provider, no exporter), where the hook adds a child span per store call. Cases:
a new key every request (claim and complete) and a replay. Every round runs a batch of
``--requests`` requests per contender per case, in an order that alternates from round to
round; a figure is the median over the rounds of the batch's mean CPU per request
(``time.process_time``). A hook's cost is set against the middleware's own overhead (no
hook minus the app alone); the target is at most 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

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

NEW, REPLAY = "new key", "replay"
BODY = b'{"order": "created"}'
TARGET = 0.10


async def order_app(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    while message.get("more_body", False):
        message = await receive()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"20")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


def in_server_span(app: Any, tracer_provider: TracerProvider) -> Any:
    """``app`` inside a recording span per request, as the ASGI instrumentation runs it."""
    tracer = tracer_provider.get_tracer("benchmark")

    async def traced(scope: Any, receive: Any, send: Any) -> None:
        with tracer.start_as_current_span("POST /orders"):
            await app(scope, receive, send)

    return traced


@dataclass
class Contender:
    name: str
    app: Any
    replay_key: bytes = b""
    cpu: dict[str, list[float]] = field(default_factory=dict)


def contenders() -> list[Contender]:
    tracer_provider = TracerProvider()  # records spans, exports none
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otel = OpenTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    prometheus = Prometheus(registry=CollectorRegistry())

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
    ]


async def _batch(contender: Contender, case: str, count: int, timed: bool) -> None:
    keys = (
        [contender.replay_key] * count
        if case == REPLAY
        else [uuid.uuid4().hex.encode() for _ in range(count)]
    )
    gc.collect()
    cpu = time.process_time()
    for key in keys:
        exchange = Exchange()
        await contender.app(http_scope(order_headers(key)), exchange.receive, exchange.send)
        if exchange.status != 201:
            raise RuntimeError(f"{contender.name} {case}: got {exchange.status}")
    cpu = time.process_time() - cpu
    if timed:
        contender.cpu.setdefault(case, []).append(cpu / count)


async def measure(racing: list[Contender], rounds: int, requests: int) -> None:
    for contender in racing:
        contender.replay_key = uuid.uuid4().hex.encode()
        await _batch(contender, NEW, 1, timed=False)
        exchange = Exchange()
        await contender.app(
            http_scope(order_headers(contender.replay_key)), exchange.receive, exchange.send
        )
    for round_index in range(-1, rounds):  # round -1 warms up, untimed
        order = racing if round_index % 2 == 0 else racing[::-1]
        for contender in order:
            for case in (NEW, REPLAY):
                await _batch(contender, case, requests, timed=round_index >= 0)


def report(racing: list[Contender], rounds: int, requests: int) -> str:
    by_name = {contender.name: contender for contender in racing}
    # (hook, its baseline, the app alone under the same conditions)
    pairs = [
        ("a hook doing nothing", "no hook", "app alone"),
        ("Prometheus", "no hook", "app alone"),
        ("OpenTelemetry, metrics", "no hook", "app alone"),
        ("OpenTelemetry, in a span", "no hook, in a span", "app alone, in a span"),
    ]
    rows = []
    for case in (NEW, REPLAY):
        for hook, baseline, alone in pairs:
            cost = median(by_name[hook].cpu[case])
            base = median(by_name[baseline].cpu[case])
            own = base - median(by_name[alone].cpu[case])
            added = cost - base
            share = added / own if own > 0 else float("nan")
            rows.append(
                [
                    case,
                    hook,
                    f"{own * 1e6:.1f}",
                    f"{added * 1e6:+.1f}",
                    f"{share * 100:+.1f}%",
                    "yes" if share <= TARGET else "no",
                ]
            )
    return "\n".join(
        [
            table(
                "Metrics and traces hooks: CPU per request, ASGI middleware on MemoryStore (µs)",
                [
                    "case",
                    "hook",
                    "middleware's own",
                    "hook adds",
                    "of the middleware's own",
                    f"within {TARGET:.0%}",
                ],
                rows,
            ),
            "",
            f"Medians of {rounds} rounds x {requests} requests per case per contender, "
            "contenders alternating in order from round to round. The machine may be shared "
            "with other work: compare the columns of one run, not runs.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=300)
    arguments = parser.parse_args(argv)
    heading("Metrics and traces hooks")
    print(machine_summary())
    racing = contenders()
    asyncio.run(measure(racing, arguments.rounds, arguments.requests))
    print(report(racing, arguments.rounds, arguments.requests))


if __name__ == "__main__":
    main()
