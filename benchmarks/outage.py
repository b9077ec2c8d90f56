"""Time to 503 during a DynamoDB outage, with the circuit breaker and without it.

Each door serves a small app behind the middleware on 127.0.0.1 (ASGI: uvicorn with
``AsyncDynamoDBStore``; WSGI: waitress with ``DynamoDBStore``), its store on moto through
the tests' fault proxy (tests/support/faultproxy.py). After one warm-up request the proxy hangs:
it reads every DynamoDB request and never answers, as a store behind a dead load balancer
or a black-holed route does. An httpx client then sends covered POSTs one after the other,
each with a new key, and times each 503.

The stores keep their defaults (``connect_timeout`` 1 s, ``read_timeout`` 2 s,
``max_attempts`` 2; the breaker's ``breaker_threshold`` 5 and ``breaker_cooldown_seconds``
5 s); the comparison runs them with ``breaker_threshold=0`` (no breaker). The four runs go
at once, each with its own proxy and server (they wait on sockets, not on the CPU), so the
whole takes about as long as the slowest run. A failed claim is followed by a background
release of the claim in case it landed; those releases fail too and count toward the
breaker, which can therefore open a request or two before the fifth: the table says which
requests were refused by the open breaker (``breaker_open``) and which waited for the store
(``timed_out``).

    python -m benchmarks.outage [--requests 20] [--requests-without-breaker 7]
    python benchmarks/outage.py   (the same)
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: import the benchmarks and the tests' fault proxy from the repository.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import logging
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from benchmarks._common import (
    create_table,
    heading,
    machine_summary,
    moto_in_thread,
    table,
)
from tests.support.faultproxy import Adapter, FaultProxy, serve_through_proxy

BEFORE = 5  # requests 1..5: the default breaker_threshold
DOORS: dict[Adapter, str] = {
    "asgi": "ASGI: uvicorn + AsyncDynamoDBStore",
    "wsgi": "WSGI: waitress + DynamoDBStore",
}


@dataclass
class Run:
    """One door with one breaker setting: every request's time to 503 and why it failed."""

    adapter: Adapter
    threshold: int  # breaker_threshold; 0: no breaker
    requests: int
    seconds: list[float] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    retry_after: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        return "off (0)" if self.threshold == 0 else f"on ({self.threshold})"


def measure(run: Run, moto_url: str, table_name: str) -> None:
    """Send ``run.requests`` covered POSTs through a hanging store; fills in ``run``."""
    try:
        with (
            FaultProxy(moto_url) as proxy,
            serve_through_proxy(
                run.adapter,
                table_name,
                proxy,
                store_kwargs={"breaker_threshold": run.threshold},
            ) as served,
        ):
            proxy.set("hang")
            for _ in range(run.requests):
                started = time.perf_counter()
                response = served.post("/ok", f"outage-{uuid.uuid4().hex}")
                elapsed = time.perf_counter() - started
                if response.status_code != 503:
                    raise RuntimeError(f"expected 503, got {response.status_code}")
                failure = served.events.of("store_error", "claim")[-1]
                run.seconds.append(elapsed)
                run.causes.append(failure.cause or "?")
                run.retry_after.append(response.headers.get("retry-after", "-"))
            # The background releases of the failed claims still hang: let them fail at once.
            proxy.set("refuse")
    except Exception as error:  # reported in the table, not raised: the other runs go on
        run.error = repr(error)


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _rows(run: Run) -> list[list[str]]:
    if run.error:
        return [[DOORS[run.adapter], run.label, "-", "-", "-", "-", run.error]]
    rows = []
    for first, last in ((1, min(BEFORE, run.requests)), (BEFORE + 1, run.requests)):
        if first > last:
            continue
        seconds = run.seconds[first - 1 : last]
        causes = Counter(run.causes[first - 1 : last])
        retry_after = sorted(set(run.retry_after[first - 1 : last]))
        rows.append(
            [
                DOORS[run.adapter],
                run.label,
                f"{first}-{last}",
                _duration(statistics.median(seconds)),
                f"{_duration(min(seconds))} / {_duration(max(seconds))}",
                ", ".join(retry_after),
                ", ".join(f"{count} {cause}" for cause, count in sorted(causes.items())),
            ]
        )
    return rows


def run(requests: int, requests_without_breaker: int) -> str:
    # Every failed claim logs an ERROR, and the proxy's hanging connections are cancelled
    # noisily when it stops: the point here is the timings.
    for name in ("idempotency_middleware", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    started = time.perf_counter()
    runs = [
        Run(adapter, threshold, requests if threshold else requests_without_breaker)
        for threshold in (5, 0)
        for adapter in DOORS
    ]
    with moto_in_thread() as moto_url:
        table_name = f"outage-{uuid.uuid4().hex[:8]}"
        create_table(moto_url, table_name)
        with ThreadPoolExecutor(len(runs)) as pool:
            for finished in [pool.submit(measure, each, moto_url, table_name) for each in runs]:
                finished.result()
    lines = [
        table(
            "Time to 503 per request while DynamoDB hangs (store defaults: connect 1 s, "
            "read 2 s, 2 attempts)",
            [
                "door",
                "breaker",
                "requests",
                "median",
                "min / max",
                "Retry-After",
                "answered by",
            ],
            [row for each in runs for row in _rows(each)],
        ),
        "",
        "Per request, in order (seconds):",
    ]
    for each in runs:
        if not each.error:
            timings = " ".join(f"{seconds:.3f}" for seconds in each.seconds)
            lines.append(f"- {DOORS[each.adapter]}, breaker {each.label}: {timings}")
    lines.append("")
    lines.append(f"({time.perf_counter() - started:.0f} s in all)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Time to 503 during a hanging store outage")
    parser.add_argument("--requests", type=int, default=20, help="per door, with the breaker")
    parser.add_argument(
        "--requests-without-breaker",
        type=int,
        default=7,
        help="per door, with breaker_threshold=0 (each waits out the store: ~4-5 s)",
    )
    args = parser.parse_args(argv)
    heading("outage: time to 503 while the store hangs, with and without the circuit breaker")
    print(run(args.requests, args.requests_without_breaker), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
