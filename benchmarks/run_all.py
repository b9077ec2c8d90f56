"""Run the benchmarks and print their tables, after the machine they ran on: the real-store
tables first (what users pay for), then the in-memory and adapter figures.

    scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.run_all   (``make bench``)
    python -m benchmarks.run_all        (without DynamoDB Local: its tables say skipped)

The DynamoDB floor (``benchmarks.dynamodb_floor``) is in this run, beside ours in
``dynamodb_requests``. The in-memory floor (``benchmarks.floor``), instruction counts
(``benchmarks.instructions``, valgrind) and the profiler (``benchmarks.profile_paths``) are
not in this run: they are tools for optimizing, with make targets of their own. A benchmark
that fails prints its traceback and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from benchmarks import (
    dynamodb_requests,
    encryption,
    failover,
    functions,
    memory,
    observability,
    overhead,
    postgres_peers,
    redis_peers,
    roundtrips,
    sqlite_peers,
    throughput,
    transport,
    wakeups,
    wsgi_overhead,
)
from benchmarks._common import machine_summary

DYNAMODB_LOCAL = "IDEMPOTENCY_DYNAMODB_LOCAL_URL"

# (name, entry point, needs DynamoDB Local), in the order printed.
BENCHMARKS: list[tuple[str, Callable[[Sequence[str] | None], None], bool]] = [
    ("dynamodb_requests", dynamodb_requests.main, True),
    ("functions", functions.main, True),
    ("transport", transport.main, False),
    ("redis_peers", redis_peers.main, False),
    ("postgres_peers", postgres_peers.main, False),
    ("wakeups", wakeups.main, False),
    ("sqlite_peers", sqlite_peers.main, False),
    ("throughput", throughput.main, False),
    ("overhead", overhead.main, False),
    ("wsgi_overhead", wsgi_overhead.main, False),
    ("roundtrips", roundtrips.main, False),
    ("memory", memory.main, False),
    # The failover option's latency price; the failover itself is make bench-failover.
    ("failover_price", failover.price_main, False),
    # Its DynamoDB Local table runs when the variable is set; the MemoryStore one always.
    ("encryption", encryption.main, False),
    ("observability", observability.main, False),
]


def main() -> int:
    started = time.perf_counter()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("# idempotency-middleware benchmarks")
    print()
    print(f"- when: {now}")
    print(f"- machine: {machine_summary()}")
    print(f"- idempotency-middleware {importlib.metadata.version('idempotency-middleware')}")
    failed: list[str] = []
    for name, run, needs_dynamodb_local in BENCHMARKS:
        section_started = time.perf_counter()
        if needs_dynamodb_local and not os.environ.get(DYNAMODB_LOCAL):
            print(f"\n## {name}: SKIPPED, no DynamoDB Local ({DYNAMODB_LOCAL} is not set; ")
            print("`make bench` runs this through scripts/dynamodb-local.sh --exec)")
            continue
        try:
            run([])
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"\n({name}: {time.perf_counter() - section_started:.0f} s)", flush=True)
    print(f"\nAll benchmarks: {time.perf_counter() - started:.0f} s.")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
