"""PostgresStore under real concurrency, beyond the contract's one-winner race of a new key
(threads, tasks and processes: tests/contract/test_store_contract.py): many takeovers of one expired
record, one store serving several loops at once, a close while a call waits.

Exactly one claimer is told it claimed the key, every other one gets the holding record
(the winner's) from its own claim, whatever the interleaving under READ COMMITTED.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.protocol import CLAIMED, Claimed, ClaimResult, Held
from tests.contract.test_postgres_store import NOW, completion, key, request, table

WORKER_SECONDS = 60.0


def _one_winner(results: list[ClaimResult], owners: list[str]) -> None:
    winners = [owner for owner, result in zip(owners, results, strict=True) if result == CLAIMED]
    assert len(winners) == 1, results
    for result in results:
        if not isinstance(result, Claimed):
            assert isinstance(result, Held) and result.record.owner == winners[0]


def test_fifty_claimers_of_an_expired_record_take_it_over_once(postgres_dsn: str) -> None:
    with PostgresStore(postgres_dsn, table=table(), max_size=10) as store:
        store.create_table()
        held = key()
        assert store.claim(request(held)) == CLAIMED
        assert store.complete(completion(held))
        later = NOW + 500.0  # expired: every claimer sees a claimable row
        owners = [f"t{n}-1" for n in range(50)]
        results: list[Any] = [None] * 50
        barrier = threading.Barrier(50, timeout=60)

        def claim(number: int) -> None:
            barrier.wait()
            results[number] = store.claim(request(held, owner=owners[number], now=later))

        threads = [threading.Thread(target=claim, args=(n,)) for n in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        _one_winner(results, owners)


def test_one_store_serves_several_event_loops_at_once(postgres_dsn: str) -> None:
    """Two threads, each with its own loop, share the store (two uvicorn servers do)."""
    store = PostgresStore(postgres_dsn, table=table())
    store.create_table()
    held = key()
    results: list[Any] = []

    def serve(number: int) -> None:
        async def main() -> None:
            owners = [f"l{number}x{n}-1" for n in range(10)]
            results.extend(
                await asyncio.gather(*(store.aclaim(request(held, owner=o)) for o in owners))
            )

        asyncio.run(main())  # ends the loop: its pool is closed with it

    threads = [threading.Thread(target=serve, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(1 for result in results if result == CLAIMED) == 1
    # Both loops' pools were closed as their loops ended.
    assert store._transport.loop_pools.values() == []
    # A loop closed without asyncio.run's clean-up: its pool is let go at the next loop.
    loop = asyncio.new_event_loop()
    assert isinstance(loop.run_until_complete(store.aclaim(request(held))), Held)
    loop.close()
    assert asyncio.run(store.aget(held)) is not None
    store.close()


async def test_aclose_then_use_again_opens_a_new_pool(postgres_dsn: str) -> None:
    async with PostgresStore(postgres_dsn, table=table()) as store:
        await store.acreate_table()
        await store.aclose()
        await store.aclose()  # twice: nothing left to close
        held = key()
        assert await store.aclaim(request(held)) == CLAIMED
        assert await store.arenew(held, "a1-1", NOW + 30)
        assert await store.arelease(held, "a1-1")
        assert await store.adelete(held) is False


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_close_while_a_call_waits_for_a_connection(postgres_dsn: str, flavour: str) -> None:
    """A call that picked the pool just before close() gets a reopened one, not an error."""
    store = PostgresStore(postgres_dsn, table=table(), max_size=1)
    store.create_table()
    if flavour == "sync":
        pool = store._transport.pool()
        busy = pool.getconn()
        results: list[Any] = []
        waiter = threading.Thread(target=lambda: results.append(store.claim(request(key()))))
        waiter.start()
        while not pool.get_stats().get("requests_waiting"):
            pass
        closer = threading.Thread(target=store.close)
        closer.start()
        pool.putconn(busy)
        waiter.join(10)
        closer.join(10)
        assert results == [CLAIMED]
        store.close()
        return

    async def main() -> None:
        await store.aget(key())
        pool = await store._transport.loop_pools.get()
        busy = await pool.getconn(timeout=1)
        waiting = asyncio.ensure_future(store.aclaim(request(key())))
        for _ in range(5):  # the claim now waits for the one connection
            await asyncio.sleep(0)
        assert not waiting.done()
        await store.aclose()
        await pool.putconn(busy)
        assert await waiting == CLAIMED
        assert busy.closed  # given back to a closed pool: closed
        assert await store.aclaim(request(key())) == CLAIMED  # a new pool
        await store.aclose()

    asyncio.run(main())
