"""Real concurrency on one key of a real Redis: 50 threads, 50 asyncio tasks and several
processes claim at once, and exactly one wins; every other claim is held by that winner
(the claim script runs atomically on the server, whatever the clients do)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import uuid

from idempotency_middleware import RedisStore
from idempotency_middleware.stores import Claimed, ClaimRequest, ClaimResult, Held

CONTENDERS = 50
PROCESSES = 4
CLAIMS_PER_PROCESS = 10


def claim_request(key: str, now: float) -> ClaimRequest:
    return ClaimRequest(key, "fp", uuid.uuid4().hex, now, 30.0, 1.0)


def one_winner(results: list[ClaimResult], expected: int) -> None:
    assert len(results) == expected
    winners = [result for result in results if isinstance(result, Claimed)]
    assert winners == [Claimed(taken_over=False)]
    assert all(isinstance(result, Held) for result in results if result not in winners)


def test_fifty_threads_claiming_one_key_one_wins(redis_url: str) -> None:
    key, now = uuid.uuid4().hex, time.time()
    results: list[ClaimResult] = []
    start = threading.Barrier(CONTENDERS, timeout=60)
    with RedisStore(redis_url, prefix=f"conc-{key}:", max_connections=CONTENDERS) as store:
        store.warm_up()

        def contend() -> None:
            request = claim_request(key, now)
            start.wait()
            results.append(store.claim(request))

        threads = [threading.Thread(target=contend) for _ in range(CONTENDERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        one_winner(results, CONTENDERS)
        owners = {result.record.owner for result in results if isinstance(result, Held)}
        assert len(owners) == 1  # every loser saw the one winner


async def test_fifty_tasks_claiming_one_key_one_wins(redis_url: str) -> None:
    key, now = uuid.uuid4().hex, time.time()
    store = RedisStore(redis_url, prefix=f"conc-{key}:")
    await store.awarm_up()
    results = await asyncio.gather(
        *(store.aclaim(claim_request(key, now)) for _ in range(CONTENDERS))
    )
    one_winner(list(results), CONTENDERS)
    await store.aclose()


def _claim_in_a_process(url: str, prefix: str, key: str, now: float, go: float) -> list[bool]:
    with RedisStore(url, prefix=prefix) as store:
        store.warm_up()
        requests = [claim_request(key, now) for _ in range(CLAIMS_PER_PROCESS)]
        time.sleep(max(0.0, go - time.time()))  # every process starts at the same moment
        return [isinstance(store.claim(request), Claimed) for request in requests]


def test_several_processes_claiming_one_key_one_wins(redis_url: str) -> None:
    key, now = uuid.uuid4().hex, time.time()
    go = time.time() + 1.5
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        # Bounded: a worker lost on the way fails the test instead of holding it for ever.
        answers = pool.starmap_async(
            _claim_in_a_process,
            [(redis_url, f"conc-{key}:", key, now, go)] * PROCESSES,
        ).get(timeout=120)
    claimed = [won for each in answers for won in each]
    assert len(claimed) == PROCESSES * CLAIMS_PER_PROCESS
    assert claimed.count(True) == 1
