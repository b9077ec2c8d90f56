"""A caller cancelled while its finished handler's completion is on the wire: the completion
is still stored, so a retry replays instead of running the handler a second time.

A real Redis server holds the completion back: ``CLIENT PAUSE ... WRITE`` (sent from inside
the handler, by another connection) stalls every write for a moment, so the caller's
``asyncio.wait_for`` deadline falls while the completion waits in the server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from idempotency_middleware import RedisStore, idempotent
from idempotency_middleware.testing import FakeClock

PAUSE_MS = 600
LOCK_TIMEOUT = 5.0


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


async def test_a_caller_timed_out_during_the_completion_gets_it_stored(
    redis_url: str, admin: redis.Redis
) -> None:
    clock = FakeClock(start=time.time())
    runs: list[str] = []
    async with RedisStore(redis_url, prefix=f"cancel-{uuid.uuid4().hex}:", clock=clock) as store:

        @idempotent(store=store, key="order_id", lock_timeout_seconds=LOCK_TIMEOUT, clock=clock)
        async def charge(order_id: str) -> dict[str, str]:
            runs.append(order_id)
            # Every write stalls from here on for a moment: the completion among them.
            admin.client_pause(PAUSE_MS, all=False)
            return {"charged": order_id}

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(charge("o-1"), timeout=PAUSE_MS / 3000)
        # Long past the lock timeout: a claim left in progress would be taken over now.
        clock.advance(LOCK_TIMEOUT * 10)
        assert await charge("o-1") == {"charged": "o-1"}
        assert runs == ["o-1"]


async def test_a_caller_cancelled_during_the_completion_gets_it_stored(
    redis_url: str, admin: redis.Redis
) -> None:
    clock = FakeClock(start=time.time())
    runs: list[str] = []
    async with RedisStore(redis_url, prefix=f"cancel-{uuid.uuid4().hex}:", clock=clock) as store:
        handler_done = asyncio.Event()

        @idempotent(store=store, key="order_id", lock_timeout_seconds=LOCK_TIMEOUT, clock=clock)
        async def charge(order_id: str) -> dict[str, str]:
            runs.append(order_id)
            admin.client_pause(PAUSE_MS, all=False)
            handler_done.set()
            return {"charged": order_id}

        call = asyncio.ensure_future(charge("o-2"))
        await handler_done.wait()
        # (The call ran on from its handler's return to its first wait: the completion,
        # stalled in the server.)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        clock.advance(LOCK_TIMEOUT * 10)
        assert await charge("o-2") == {"charged": "o-2"}
        assert runs == ["o-2"]
