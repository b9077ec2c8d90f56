"""The stores on replicated servers: Redis with a replica and Sentinels, a Redis Cluster, and
PostgreSQL with a streaming standby (``tests/support/replicated_servers.py``).

What must hold: ``RedisStore(replicas=N)`` returns a claim or a completion only once ``N``
replicas have it (``WAIT``), releases and refuses a claim they did not acknowledge in time
(cause ``not_replicated``) and keeps, logs and reports a completion they did not; a Sentinel
client and a Cluster client serve the store's essentials; ``PostgresStore(synchronous_commit=)``
is its connections' setting, and with a synchronous standby a completion is on the standby
when it returns; a multi-host DSN finds the promoted standby.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from idempotency_middleware.events import IdempotencyEvent, Reporter
from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.postgres.ops import Statement
from idempotency_middleware.stores.protocol import CLAIMED, Held, StoreUnavailable
from idempotency_middleware.stores.records import Status
from idempotency_middleware.stores.redis import RedisStore
from tests.contract.test_postgres_store import completion, key, request
from tests.support.replicated_servers import (
    ClusterSet,
    PostgresPair,
    SentinelSet,
    postgres_pair,
    redis_cluster_set,
    redis_sentinel_set,
    wait_for,
)
from tests.support.session_servers import session_server

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    yield from session_server("Redis Sentinel", redis_sentinel_set)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    yield from session_server("Redis Cluster", redis_cluster_set)


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    # The standby 0.2 s behind: an asynchronous commit is not on it when the call returns.
    yield from session_server("PostgreSQL standby", lambda: postgres_pair(lag_seconds=0.2))


def _primary(sentinels: SentinelSet) -> Any:
    return sentinels.sentinel().master_for("mymaster", socket_timeout=2.0)


def _sentinel_store(sentinels: SentinelSet, **options: Any) -> RedisStore:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    return RedisStore(client=_primary(sentinels), prefix=prefix, **options)


class Heard:
    """The events a door's reporter subscribed to a store's breaker hears."""

    def __init__(self, store: RedisStore) -> None:
        self.events: list[IdempotencyEvent] = []
        self.reporter = Reporter(self.events.append)  # (held: the breaker holds it weakly)
        store.breaker.subscribe(self.reporter)


def _essentials(store: Any) -> None:
    """The store contract's essentials: claim, held, renew, complete, replay, fencing."""
    key_hash = key()
    assert store.claim(request(key_hash)) is CLAIMED
    held = store.claim(request(key_hash, owner="b1-1"))
    assert isinstance(held, Held) and held.record.status is Status.IN_PROGRESS
    assert store.renew(key_hash, "a1-1", time.time() + 30)
    assert not store.release(key_hash, "b1-1")
    assert store.complete(completion(key_hash))
    replayed = store.claim(request(key_hash, owner="c1-1"))
    assert isinstance(replayed, Held) and replayed.record.status is Status.COMPLETED
    assert replayed.record.response is not None and replayed.record.response.status == 201


# --- Redis, replica and Sentinels ---------------------------------------------------------


def test_a_sentinel_client_serves_the_store_essentials_waiting_for_the_replica(
    sentinels: SentinelSet,
) -> None:
    with _sentinel_store(sentinels, replicas=1) as store:
        _essentials(store)


def test_a_sentinel_store_names_its_service_not_question_marks(sentinels: SentinelSet) -> None:
    with _sentinel_store(sentinels) as store:
        assert "sentinel:mymaster" in repr(store)


def test_a_waited_claim_is_on_the_replica_when_it_returns(sentinels: SentinelSet) -> None:
    import redis

    replica = redis.Redis(host="127.0.0.1", port=sentinels.replica_port)
    with _sentinel_store(sentinels, replicas=1) as store:
        key_hash = key()
        assert store.claim(request(key_hash)) is CLAIMED
        assert replica.hget(store.prefix + key_hash, "owner") == b"a1-1"


def test_a_claim_too_few_replicas_acknowledge_is_released_and_refused_not_replicated(
    sentinels: SentinelSet,
) -> None:
    with _sentinel_store(sentinels, replicas=2, replica_timeout_seconds=0.2) as store:
        key_hash = key()
        with pytest.raises(StoreUnavailable) as refused:
            store.claim(request(key_hash))
        assert refused.value.cause == "not_replicated"
        assert store.get(key_hash) is None  # released: a retry claims afresh


def test_a_completion_too_few_replicas_acknowledge_is_kept_and_reported(
    sentinels: SentinelSet,
) -> None:
    with (
        _sentinel_store(sentinels, replicas=1) as claimer,
        RedisStore(
            client=_primary(sentinels),
            prefix=claimer.prefix,
            replicas=2,
            replica_timeout_seconds=0.2,
        ) as completer,
    ):
        heard = Heard(completer)
        key_hash = key()
        assert claimer.claim(request(key_hash)) is CLAIMED
        assert completer.complete(completion(key_hash))
        record = completer.get(key_hash)
        assert record is not None and record.status is Status.COMPLETED
        [event] = heard.events
        assert (event.kind, event.key_hash, event.cause) == (
            "not_replicated",
            key_hash,
            "not_replicated",
        )


def test_an_async_sentinel_client_waits_for_the_replica_too(sentinels: SentinelSet) -> None:
    from redis.asyncio.sentinel import Sentinel

    async def main() -> None:
        addresses = [("127.0.0.1", port) for port in sentinels.sentinel_ports]
        client = Sentinel(addresses).master_for("mymaster", socket_timeout=2.0)  # type: ignore[no-untyped-call]
        prefix = f"t{uuid.uuid4().hex[:8]}:"
        async with RedisStore(async_client=client, prefix=prefix, replicas=1) as store:
            key_hash = key()
            assert await store.aclaim(request(key_hash)) is CLAIMED
            assert await store.acomplete(completion(key_hash))
        async with RedisStore(
            async_client=client, prefix=prefix, replicas=2, replica_timeout_seconds=0.2
        ) as strict:
            with pytest.raises(StoreUnavailable) as refused:
                await strict.aclaim(request(key()))
            assert refused.value.cause == "not_replicated"
        await client.aclose()

    asyncio.run(main())


# --- Redis Cluster ------------------------------------------------------------------------


def test_a_cluster_client_serves_the_store_essentials_waiting_for_the_replicas(
    cluster: ClusterSet,
) -> None:
    with RedisStore(client=cluster.client(), prefix=f"c{uuid.uuid4().hex[:6]}:", replicas=1) as s:
        for _ in range(4):  # (keys on several nodes)
            _essentials(s)


def test_an_async_cluster_client_waits_for_the_replicas_and_refuses_when_too_few(
    cluster: ClusterSet,
) -> None:
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    async def main() -> None:
        nodes = [ClusterNode("127.0.0.1", port) for port in cluster.ports]
        client = RedisCluster(startup_nodes=nodes)
        prefix = f"c{uuid.uuid4().hex[:6]}:"
        async with RedisStore(async_client=client, prefix=prefix, replicas=1) as store:
            for _ in range(4):
                key_hash = key()
                assert await store.aclaim(request(key_hash)) is CLAIMED
                assert await store.acomplete(completion(key_hash))
        async with RedisStore(
            async_client=client, prefix=prefix, replicas=2, replica_timeout_seconds=0.2
        ) as strict:
            with pytest.raises(StoreUnavailable) as refused:
                await strict.aclaim(request(key()))
            assert refused.value.cause == "not_replicated"
        await client.aclose()

    asyncio.run(main())


def test_a_waited_claim_survives_its_cluster_primary_crashing(cluster: ClusterSet) -> None:
    # (Last of the cluster tests: one node stays down.)
    prefix = f"c{uuid.uuid4().hex[:6]}:"
    key_hash = key()
    with RedisStore(client=cluster.client(), prefix=prefix, replicas=1) as store:
        assert store.claim(request(key_hash)) is CLAIMED
        old = cluster.crash_primary_of(prefix + key_hash)
        cluster.wait_for_failover(prefix + key_hash, old)
    with RedisStore(client=cluster.client(), prefix=prefix) as after:
        held = after.claim(request(key_hash, owner="b1-1"))
        assert isinstance(held, Held) and held.record.owner == "a1-1"


# --- PostgreSQL, primary and standby ------------------------------------------------------


def _setting(store: PostgresStore, name: str) -> str:
    def flow() -> Any:
        answer = yield Statement(f"SHOW {name}", ())
        return answer.rows[0][0]

    value: str = store.run_flow("show", flow())
    return value


def _on_standby(pair: PostgresPair, table: str, key_hash: str) -> str | None:
    with psycopg.connect(pair.node_dsn(pair.standby_port), autocommit=True) as standby:
        row = standby.execute(f"SELECT status FROM {table} WHERE key = %s", (key_hash,)).fetchone()
    return None if row is None else str(row[0])


@pytest.mark.parametrize("value", ["on", "remote_write", "remote_apply"])
def test_synchronous_commit_is_the_store_connections_setting(
    pair: PostgresPair, value: str
) -> None:
    with PostgresStore(pair.dsn, synchronous_commit=value, purge_interval_seconds=None) as store:
        assert _setting(store, "synchronous_commit") == value


def test_with_a_synchronous_standby_a_completion_is_on_it_when_it_returns(
    pair: PostgresPair,
) -> None:
    table = f"idem_{uuid.uuid4().hex[:10]}"
    pair.set_synchronous_standby("standby")
    try:
        with PostgresStore(
            pair.dsn, table=table, synchronous_commit="remote_apply", purge_interval_seconds=None
        ) as store:
            store.create_table()
            key_hash = key()
            assert store.claim(request(key_hash)) is CLAIMED
            assert _on_standby(pair, table, key_hash) == "in_progress"
            assert store.complete(completion(key_hash))
            assert _on_standby(pair, table, key_hash) == "completed"
    finally:
        pair.set_synchronous_standby("")


def test_without_the_option_a_completion_can_be_missing_on_the_standby(
    pair: PostgresPair,
) -> None:
    # The counterpart: the lag the option waits out is real here.
    table = f"idem_{uuid.uuid4().hex[:10]}"
    with PostgresStore(pair.dsn, table=table, purge_interval_seconds=None) as store:
        store.create_table()
        wait_for(lambda: _on_standby_table(pair, table), "the table on the standby")
        key_hash = key()
        assert store.claim(request(key_hash)) is CLAIMED
        assert _on_standby(pair, table, key_hash) is None


def _on_standby_table(pair: PostgresPair, table: str) -> bool:
    with psycopg.connect(pair.node_dsn(pair.standby_port), autocommit=True) as standby:
        return standby.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,)


def test_an_unknown_synchronous_commit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="synchronous_commit must be one of on, remote_write"):
        PostgresStore("postgresql://app@db/app", synchronous_commit="local")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": -1}, "replicas must be a non-negative integer"),
        ({"replicas": True}, "replicas must be a non-negative integer"),
        ({"replica_timeout_seconds": 0}, "replica_timeout_seconds must be a positive"),
    ],
)
def test_bad_replica_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisStore("redis://127.0.0.1:1/0", **options)


def test_a_multi_host_dsn_reconnects_to_the_promoted_standby(pair: PostgresPair) -> None:
    # (Last: the primary stays down.)
    table = f"idem_{uuid.uuid4().hex[:10]}"
    with PostgresStore(
        pair.dsn, table=table, purge_interval_seconds=None, breaker_threshold=0
    ) as store:
        store.create_table()
        assert store.claim(request(key())) is CLAIMED
        wait_for(lambda: _on_standby_table(pair, table), "the table on the standby")
        pair.crash_primary()
        pair.promote()
        promoted = time.monotonic()
        claimed: list[object] = []

        def claims() -> bool:
            try:
                claimed.append(store.claim(request(key())))
            except StoreUnavailable:
                return False
            return True

        wait_for(claims, "a claim on the promoted standby")
        assert claimed == [CLAIMED]
        assert time.monotonic() - promoted < 15
