"""``benchmarks/observability.py``: its contenders answer alike, its table sets each hook's
cost against the middleware's own overhead and its library's calls alone, and those calls
are the ones the hook makes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from benchmarks._common import call_once
from benchmarks.observability import (
    CASES,
    NEW,
    contenders,
    measure,
    opentelemetry_calls,
    order_app,
    parse_collected,
    prometheus_calls,
    report,
)
from idempotency_middleware import IdempotencyMiddleware, MemoryStore
from idempotency_middleware.observability import OpenTelemetry, Prometheus


def test_the_table_sets_each_hook_against_the_middlewares_own_overhead() -> None:
    racing = contenders()
    asyncio.run(measure(racing, rounds=1, requests=3))
    table = report(racing, rounds=1, requests=3)

    assert "CPU per request, ASGI middleware on MemoryStore" in table
    assert "its library's calls alone" in table
    for case in ("new key", "replay"):
        for hook in ("Prometheus", "OpenTelemetry, metrics", "OpenTelemetry, in a span"):
            assert f"| {case:<7} | {hook}" in table, table


def _made_by_one_request(
    hook: Any, case: str, counts: Callable[[], dict[Any, float]]
) -> dict[Any, float]:
    """What one request of ``case`` adds to the hook's counts (a replay: the second)."""
    app = IdempotencyMiddleware(order_app, store=MemoryStore(), on_event=hook)
    before: dict[Any, float] = {}
    if case != NEW:
        asyncio.run(call_once(app, b"first-request-key"))
        before = counts()
    asyncio.run(call_once(app, b"first-request-key"))
    made = {series: value - before.get(series, 0.0) for series, value in counts().items()}
    return {series: value for series, value in made.items() if value}


def _prometheus_counts(registry: CollectorRegistry) -> dict[Any, float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.endswith(("_total", "_count")) and sample.value
    }


@pytest.mark.parametrize("case", CASES)
def test_prometheus_floor_makes_the_calls_the_hook_makes_for_a_request(case: str) -> None:
    hooked, floor = CollectorRegistry(), CollectorRegistry()
    made = _made_by_one_request(
        Prometheus(registry=hooked), case, lambda: _prometheus_counts(hooked)
    )
    prometheus_calls(case, floor)()

    assert made == _prometheus_counts(floor)


def _otel_counts(reader: InMemoryMetricReader) -> dict[Any, float]:
    data = reader.get_metrics_data()
    assert data is not None
    counts: dict[Any, float] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "idempotency.breaker.open":
                    continue  # read from the breaker at collection: no call per request
                for point in metric.data.data_points:
                    value = getattr(point, "count", getattr(point, "value", 0))
                    counts[metric.name, frozenset((point.attributes or {}).items())] = value
    return counts


@pytest.mark.parametrize("case", CASES)
def test_opentelemetry_floor_makes_the_calls_the_hook_makes_for_a_request(case: str) -> None:
    hooked, floor = InMemoryMetricReader(), InMemoryMetricReader()
    hook = OpenTelemetry(meter_provider=MeterProvider(metric_readers=[hooked]))
    made = _made_by_one_request(hook, case, lambda: _otel_counts(hooked))
    opentelemetry_calls(case, MeterProvider(metric_readers=[floor]))()

    assert made == _otel_counts(floor)


def test_collected_instructions_are_read_from_callgrinds_summary() -> None:
    assert parse_collected("==12== Events    : Ir\n==12== Collected : 5044845\n") == 5044845


@pytest.mark.parametrize("output", ["==12== Collected : 0", "valgrind: command not found"])
def test_nothing_collected_is_an_error_not_a_zero(output: str) -> None:
    with pytest.raises(RuntimeError, match="collected nothing"):
        parse_collected(output)
