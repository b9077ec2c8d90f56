"""How soon a waiting duplicate (``wait_seconds``) answers after the first attempt finishes:
woken by the store's news (Redis pub/sub, PostgreSQL LISTEN/NOTIFY) or by its own polls.

    python -m benchmarks.wakeups [--rounds 5] [--samples 10] [--quick]

One sample: ``idempotent`` (sync) is called with a new key and its function holds; a
duplicate call starts waiting; a random 50-500 ms later (so a polling waiter is met at any
point of its backoff) the function returns. The latency is from the function's return (the
completion's write is still to be sent) to the duplicate's answer. "pushed" is the store as
it is; "polled" the same store with its wakeups switched off (``store.wakeups = None``), as
every other store waits. After one warm-up sample of each, each round takes ``samples``
samples of every (store, mode) pair in an order that rotates from round to round; p50 and
p99 are over all samples (nearest rank).
The servers are started here (tests/support/db_servers.py) unless ``--redis-url``/``--dsn``
is given.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._common import heading, machine_summary, quantile, table

Sample = Callable[[], float]


def _sampler(store: Any) -> Sample:
    """One timed completion -> waiter answer, on ``store``."""
    released = threading.Event()
    returned: list[float] = []

    def work(key: str) -> str:
        if not released.is_set():
            released.wait(10)
            returned.append(time.perf_counter())
        return key

    from idempotency_middleware import idempotent

    call = idempotent(store=store, key="key", wait_seconds=10, name="bench")(work)
    pool = ThreadPoolExecutor(2)

    def sample() -> float:
        released.clear()
        returned.clear()
        key = uuid.uuid4().hex
        first = pool.submit(call, key)
        time.sleep(0.01)  # the first claims before the duplicate arrives
        duplicate = pool.submit(call, key)
        time.sleep(random.uniform(0.05, 0.5))
        released.set()
        answered = duplicate.result(10)
        ended = time.perf_counter()
        assert first.result(10) == answered == key
        return ended - returned[0]

    return sample


@contextlib.contextmanager
def _servers(redis_url: str | None, dsn: str | None) -> Iterator[tuple[str, str]]:
    from tests.support.db_servers import run_postgres, run_redis

    with contextlib.ExitStack() as stack:
        redis_url = redis_url or stack.enter_context(run_redis())
        dsn = dsn or stack.enter_context(run_postgres())
        yield redis_url, dsn


def run(
    rounds: int = 5, samples: int = 10, redis_url: str | None = None, dsn: str | None = None
) -> str:
    from idempotency_middleware import PostgresStore, RedisStore

    with _servers(redis_url, dsn) as (redis_where, pg_where), contextlib.ExitStack() as stack:
        cells: dict[tuple[str, str], Sample] = {}
        for mode in ("pushed", "polled"):
            redis_store = stack.enter_context(RedisStore(redis_where, prefix="bench-wake:"))
            pg_store = stack.enter_context(PostgresStore(pg_where, table="bench_wakeups"))
            pg_store.create_table()
            for name, store in (("Redis", redis_store), ("PostgreSQL", pg_store)):
                if mode == "polled":
                    store.wakeups = None
                elif store.wakeups is not None:
                    store.wakeups.start()
                cells[(name, mode)] = _sampler(store)
        order = list(cells)
        for sample in cells.values():  # warm-up, not counted: pools filled, scripts loaded
            sample()
        found: dict[tuple[str, str], list[float]] = {cell: [] for cell in order}
        for number in range(rounds):
            for cell in order[number % len(order) :] + order[: number % len(order)]:
                found[cell].extend(cells[cell]() for _ in range(samples))
    rows = []
    for name in ("Redis", "PostgreSQL"):
        for mode in ("pushed", "polled"):
            values = sorted(found[(name, mode)])
            rows.append(
                [
                    name,
                    mode,
                    f"{quantile(values, 0.5) * 1000:.1f}",
                    f"{quantile(values, 0.99) * 1000:.1f}",
                    str(len(values)),
                ]
            )
    return table(
        "A waiting duplicate's answer after the first attempt's completion (ms)",
        ["store", "waiter", "p50 ms", "p99 ms", "samples"],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--redis-url", default=None, help="an existing server (default: start one)")
    parser.add_argument("--dsn", default=None, help="an existing PostgreSQL (default: start one)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 samples (a smoke run)")
    args = parser.parse_args(argv)
    rounds, samples = (1, 2) if args.quick else (args.rounds, args.samples)
    heading("Waiting duplicates: woken by the store's news (pushed) or by polling")
    print(run(rounds, samples, args.redis_url, args.dsn), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
