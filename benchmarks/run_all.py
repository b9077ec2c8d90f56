"""Run the seven benchmarks and print their tables, after the machine they ran on.

    python -m benchmarks.run_all        (what ``make bench`` runs)

A benchmark that fails prints its traceback and the others still run; the exit status is
then 1.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from benchmarks import (
    floor,
    instructions,
    memory,
    overhead,
    roundtrips,
    throughput,
    wsgi_overhead,
)
from benchmarks._common import machine_summary

BENCHMARKS: list[tuple[str, Callable[[Sequence[str] | None], None]]] = [
    ("overhead", overhead.main),
    ("roundtrips", roundtrips.main),
    ("throughput", throughput.main),
    ("memory", memory.main),
    ("wsgi_overhead", wsgi_overhead.main),
    ("instructions", instructions.main),
    ("floor", floor.main),
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
    for name, run in BENCHMARKS:
        section_started = time.perf_counter()
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
