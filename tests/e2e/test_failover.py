"""A Redis primary SIGKILLed and replaced by Sentinel, under the ``idempotent`` door.

What must hold: a completion whose handler finished outlasts the failover (retried with
backoff, fenced by its owner, for its lease and at most ``decisions.FINISH_SECONDS``), so
the key is completed on the new primary and a retry replays it instead of running it again;
and a circuit breaker opened by the crash lets claims through as soon as the new primary
answers, long before its cool-down ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotency_middleware import idempotent
from idempotency_middleware.events import IdempotencyEvent
from idempotency_middleware.stores.protocol import CLAIMED, StoreUnavailable
from idempotency_middleware.stores.redis import RedisStore
from tests.contract.test_postgres_store import key, request
from tests.support.replicated_servers import SentinelSet, redis_sentinel_set, wait_for
from tests.support.session_servers import session_server

pytestmark = pytest.mark.servers


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    yield from session_server("Redis Sentinel", redis_sentinel_set)


def _store(sentinels: SentinelSet, **options: Any) -> RedisStore:
    client = sentinels.sentinel().master_for(
        "mymaster", socket_timeout=1.0, socket_connect_timeout=0.5
    )
    return RedisStore(client=client, prefix=f"f{uuid.uuid4().hex[:8]}:", **options)


def test_a_finished_handlers_completion_outlasts_the_failover_and_is_replayed(
    sentinels: SentinelSet,
) -> None:
    events: list[IdempotencyEvent] = []
    runs: list[str] = []
    with _store(sentinels, replicas=1, breaker_threshold=0) as store:

        @idempotent(store=store, key="order_id", on_event=events.append)
        def place(order_id: str) -> dict[str, str]:
            runs.append(order_id)
            if len(runs) == 1:
                sentinels.crash_primary()  # the completion meets the failover
            return {"order": order_id}

        assert place("o-1") == {"order": "o-1"}
        assert place("o-1") == {"order": "o-1"}
    assert runs == ["o-1"]
    kinds = [event.kind for event in events]
    assert "completed" in kinds and "replayed" in kinds and "store_error" not in kinds


def test_an_open_breaker_lets_claims_through_once_the_new_primary_answers(
    sentinels: SentinelSet,
) -> None:
    cooldown = 120.0
    with _store(sentinels, breaker_threshold=1, breaker_cooldown_seconds=cooldown) as store:
        assert store.claim(request(key())) is CLAIMED
        crashed_at = time.monotonic()
        old = sentinels.crash_primary()
        with pytest.raises(StoreUnavailable):
            store.claim(request(key()))
        assert store.breaker_state == "open"
        sentinels.wait_for_failover(old)
        answered: list[object] = []

        def claims() -> bool:
            try:
                answered.append(store.claim(request(key())))
            except StoreUnavailable as refused:
                assert refused.cause in ("breaker_open", "unreachable")
                return False
            return True

        wait_for(claims, "a claim let through by the breaker", timeout=60)
        assert answered == [CLAIMED]
        assert str(store.breaker_state) == "closed"
        assert time.monotonic() - crashed_at < cooldown / 2
