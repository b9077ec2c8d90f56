"""CPU instructions and L1 cache misses per request, counted by valgrind's cachegrind.

Time on a shared host moves from run to run (our new-key overhead by about 10%); an
instruction count moves by about 1% (memory addresses, and so garbage collection, differ
between runs), so this table is the figure to track a small change by. Each contender
runs twice under cachegrind with the same warm-up, once with no measured requests and once
with ``--requests``; the difference divided by the request count is the cost of one request
(imports and start-up cancel out). The L1 misses are cachegrind's simulation of this CPU's
caches: they show how much of the time per instruction goes to fetching code and data.

Needs valgrind; without it the table says so and nothing fails.

    python -m benchmarks.instructions [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from starlette.applications import Starlette

from benchmarks import floor, overhead
from benchmarks._apps import order_app
from benchmarks._common import call_once, heading, machine_summary, table

WARM_UP_REQUESTS = 50
FLOOR = "floor"  # benchmarks/floor.py with canonical JSON: the least a new key can cost
_COUNTERS = {"I refs": "instructions", "I1 misses": "i1_misses", "D1 misses": "d1_misses"}


class Counts(NamedTuple):
    instructions: int
    i1_misses: int
    d1_misses: int


class _Case(NamedTuple):
    label: str
    # a distribution in overhead.all_contenders(), FLOOR, or "" for the bare app
    contender: str
    mode: str  # "new" (a fresh key per request), "replay" (one completed key) or "bare"


CASES = [
    _Case("bare Starlette app", "", "bare"),
    _Case("idempotency-middleware (ours), new key", "idempotency-middleware", "new"),
    _Case("idempotency-middleware (ours), replay", "idempotency-middleware", "replay"),
    _Case("fastapi-idempotency-key, new key", "fastapi-idempotency-key", "new"),
    _Case("asgi-idempotency-header, new key", "asgi-idempotency-header", "new"),
    _Case("floor (benchmarks/floor.py), new key", FLOOR, "new"),
]


def _builder(contender: str) -> Callable[[], Starlette] | None:
    if contender == "":
        return order_app
    if contender == FLOOR:
        return lambda: floor.floor_app(canonical_json=True)
    for candidate in overhead.all_contenders():
        if candidate.distribution == contender:
            return None if candidate.error else candidate.build
    raise ValueError(f"unknown contender {contender!r}")


async def _drive(contender: str, mode: str, requests: int) -> None:
    """The child's work: warm up, then ``requests`` measured requests (status checked)."""
    build = _builder(contender)
    if build is None:
        raise SystemExit(f"{contender} is not installed")
    app = build()
    if mode == "replay":
        await call_once(app, b"replayed-key-0001")
        keys: list[bytes | None] = [b"replayed-key-0001"] * (WARM_UP_REQUESTS + requests)
    else:
        keys = [f"{mode}-{index:06d}".encode() for index in range(WARM_UP_REQUESTS + requests)]
    for batch in (keys[:WARM_UP_REQUESTS], keys[WARM_UP_REQUESTS:]):
        # Collected before each batch in both runs, so the difference between them holds
        # only what the measured requests collect.
        gc.collect()
        for key in batch:
            exchange = await call_once(app, key)
            if exchange.status != 201:
                raise SystemExit(f"{contender} {mode}: answered {exchange.status}, not 201")


def _cachegrind(case: _Case, requests: int) -> Counts:
    completed = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=yes",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            case.contender,
            case.mode,
            str(requests),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # same dict layouts in both runs
        check=False,
    )
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{case.label}: {last_line}")
    counts = parse_summary(completed.stderr)
    if counts is None:
        raise RuntimeError(f"{case.label}: no cachegrind summary in its output")
    return counts


def parse_summary(output: str) -> Counts | None:
    """The totals cachegrind prints on exit (``==123== I   refs:   1,234``), if all there."""
    found: dict[str, int] = {}
    for line in output.splitlines():
        match = re.search(r"== (I +refs|I1 +misses|D1 +misses): +([\d,]+)", line)
        if match:
            name = " ".join(match.group(1).split())
            found[_COUNTERS[name]] = int(match.group(2).replace(",", ""))
    return Counts(**found) if len(found) == len(_COUNTERS) else None


def _per_request(case: _Case, requests: int) -> Counts:
    base, measured = _cachegrind(case, 0), _cachegrind(case, requests)
    return Counts(*(round((b - a) / requests) for a, b in zip(base, measured, strict=True)))


def run(requests: int = 300) -> str:
    if shutil.which("valgrind") is None:
        return "SKIPPED: valgrind is not installed (apt install valgrind)."
    results: dict[_Case, Counts | str] = {}
    # Two cores: two cachegrind processes at a time (counts do not depend on the load).
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case: pool.submit(_per_request, case, requests) for case in CASES}
        for case, future in futures.items():
            try:
                results[case] = future.result()
            except Exception as error:
                results[case] = str(error)
    bare = results[CASES[0]]
    rows = []
    for case, counts in results.items():
        if isinstance(counts, str):
            rows.append([case.label, counts, "", "", ""])
            continue
        extra = (
            f"{counts.instructions - bare.instructions:+,}"
            if isinstance(bare, Counts) and case.mode != "bare"
            else "-"
        )
        rows.append(
            [
                case.label,
                f"{counts.instructions:,}",
                extra,
                f"{counts.i1_misses:,}",
                f"{counts.d1_misses:,}",
            ]
        )
    return "\n".join(
        [
            table(
                "Per request, counted by cachegrind (the bare app's own work included)",
                ["case", "instructions", "over bare", "L1i misses", "L1d misses"],
                rows,
            ),
            "",
            f"{requests} measured requests after {WARM_UP_REQUESTS} warm-up ones, minus the "
            "same run without them; in-memory backends; L1 caches as cachegrind detects them.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--child", nargs=3, metavar=("CONTENDER", "MODE", "REQUESTS"))
    args = parser.parse_args(argv)
    if args.child:
        contender, mode, requests = args.child
        asyncio.run(_drive(contender, mode, int(requests)))
        return
    heading("instructions: CPU work per request, counted by cachegrind")
    print(run(args.requests), flush=True)


if __name__ == "__main__":
    if "--child" not in sys.argv:
        print(machine_summary())
    main()
