"""``benchmarks/observability.py``: its contenders answer alike, and its table sets each
hook's cost against the middleware's own overhead, in both cases."""

from __future__ import annotations

import asyncio

from benchmarks.observability import contenders, measure, report


def test_the_table_sets_each_hook_against_the_middlewares_own_overhead() -> None:
    racing = contenders()
    asyncio.run(measure(racing, rounds=1, requests=3))
    table = report(racing, rounds=1, requests=3)

    assert "CPU per request, ASGI middleware on MemoryStore" in table
    for case in ("new key", "replay"):
        for hook in ("Prometheus", "OpenTelemetry, metrics", "OpenTelemetry, in a span"):
            assert f"| {case:<7} | {hook}" in table, table
