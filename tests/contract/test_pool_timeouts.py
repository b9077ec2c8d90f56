"""A full connection pool is a store that did not answer in time, on every Python version.

Before Python 3.11, ``asyncio.wait_for`` raises ``asyncio.TimeoutError``, a class of its own
(from 3.11 on, the builtin ``TimeoutError``). A store that caught only the builtin one let a
full pool's wait escape unclassified: a 500 instead of a 503, not counted by the circuit
breaker, ``on_store_error`` skipped. This file runs on 3.10 to 3.13 with only the ``postgres``
and ``redis`` extras and pytest, pytest-asyncio, pytest-timeout and hypothesis: it needs
nothing but ``postgres_dsn`` (``tests/support/db_servers.py``; without the rest of the dev tools,
``pytest --noconftest -p tests.support.db_servers tests/contract/test_pool_timeouts.py``).
"""

from __future__ import annotations

import uuid

import pytest

from idempotency_middleware import StoreUnavailableError
from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.protocol import ClaimRequest
from idempotency_middleware.testing import FakeClock

NOW = 1_700_000_000.0
POOL_WAIT_SECONDS = 0.2


def _claim() -> ClaimRequest:
    return ClaimRequest(uuid.uuid4().hex * 2, "f" * 64, "a1-1", NOW, 5.0, 1.0)


def _store(postgres_dsn: str) -> PostgresStore:
    """One connection at most, a short wait for it, and a breaker that opens on one outage
    (a fake clock: its cool-down never ends during the test)."""
    return PostgresStore(
        postgres_dsn,
        table=f"idem_{uuid.uuid4().hex[:12]}",
        max_size=1,
        pool_timeout_seconds=POOL_WAIT_SECONDS,
        breaker_threshold=1,
        clock=FakeClock(NOW),
    )


def _is_a_counted_timeout(error: StoreUnavailableError, store: PostgresStore) -> None:
    assert error.cause == "timed_out", error
    assert "did not answer in time" in error.reason
    assert store.breaker_state == "open"  # counted: one outage at threshold 1


async def test_an_async_claim_waiting_out_a_full_pool_is_a_counted_timeout(
    postgres_dsn: str,
) -> None:
    store = _store(postgres_dsn)
    try:
        await store.acreate_table()
        pool = await store._transport.loop_pools.get()
        held = await pool.getconn(timeout=1.0)  # the pool's only connection, held elsewhere
        try:
            with pytest.raises(StoreUnavailableError) as waited:
                await store.aclaim(_claim())
        finally:
            await pool.putconn(held)
        _is_a_counted_timeout(waited.value, store)
        with pytest.raises(StoreUnavailableError) as refused:
            await store.aclaim(_claim())
        assert refused.value.cause == "breaker_open"
    finally:
        await store.aclose()


def test_a_sync_claim_waiting_out_a_full_pool_is_a_counted_timeout(postgres_dsn: str) -> None:
    with _store(postgres_dsn) as store:
        store.create_table()
        pool = store._transport.pool()
        held = pool.getconn()
        try:
            with pytest.raises(StoreUnavailableError) as waited:
                store.claim(_claim())
        finally:
            pool.putconn(held)
        _is_a_counted_timeout(waited.value, store)
