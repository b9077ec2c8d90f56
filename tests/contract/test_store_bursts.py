"""A burst of simultaneous claims on one event loop, on a fresh store and a healthy local
server: every claim is answered, and the store reuses a bounded set of connections rather
than opening one per concurrent claim.

redis-py's asyncio pool opened a connection per concurrent command, each under the 1 s
connect timeout while the loop was busiest with the burst (the ASGI burst test over Redis
failed so under a loaded ``make test``), and refused past 100 with "Too many connections":
503s, counted by the circuit breaker as an outage.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest
import redis

from idempotency_middleware import RedisStore
from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest
from idempotency_middleware.stores.redis.transport import ASYNC_CONNECTIONS

# Past redis-py's own pool limit (100): a burst that size was refused outright.
BURST = 150


def _claims(count: int) -> list[ClaimRequest]:
    now = time.time()
    return [
        ClaimRequest(uuid.uuid4().hex * 2, "f" * 64, "a1-1", now, 5.0, 1.0) for _ in range(count)
    ]


async def _burst(store: RedisStore | PostgresStore, count: int) -> list[object]:
    """Every claim at once on this loop; what each answered (or raised)."""
    return await asyncio.gather(*(store.aclaim(c) for c in _claims(count)), return_exceptions=True)


def _refusals(answers: list[object]) -> list[object]:
    return [answer for answer in answers if not isinstance(answer, Claimed)]


async def test_a_burst_on_a_fresh_redis_store_is_answered_on_a_bounded_set_of_connections(
    redis_url: str,
) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=f"{name}:", client_name=name, breaker_threshold=1)
    try:
        answers = await _burst(store, BURST)
        assert _refusals(answers) == []
        assert store.breaker_state == "closed"
        with redis.Redis.from_url(redis_url) as admin:
            opened = [c for c in admin.client_list() if c.get("name") == name]
        assert 1 <= len(opened) <= ASYNC_CONNECTIONS
    finally:
        await store.aclose()


async def test_a_burst_on_a_fresh_postgres_store_is_answered_within_its_pool(
    postgres_dsn: str,
) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    # (The DSN's application_name names the store's connections on the server.)
    dsn = psycopg.conninfo.make_conninfo(postgres_dsn, application_name=name)
    store = PostgresStore(dsn, table=f"idem_{uuid.uuid4().hex[:12]}", breaker_threshold=1)
    try:
        await store.acreate_table()
        answers = await _burst(store, BURST)
        assert _refusals(answers) == []
        assert store.breaker_state == "closed"
        with psycopg.connect(postgres_dsn) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        assert row is not None and 1 <= row[0] <= store.max_size
    finally:
        await store.aclose()


@pytest.mark.parametrize("limit", [1, 4])
async def test_max_connections_bounds_a_redis_burst(redis_url: str, limit: int) -> None:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=f"{name}:", client_name=name, max_connections=limit)
    try:
        assert _refusals(await _burst(store, 48)) == []
        with redis.Redis.from_url(redis_url) as admin:
            opened = [c for c in admin.client_list() if c.get("name") == name]
        assert 1 <= len(opened) <= limit
    finally:
        await store.aclose()
