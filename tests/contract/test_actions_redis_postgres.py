"""One-time actions on Redis and PostgreSQL: what only these backends have.

Redis: where an action lives (one hash at ``<prefix>action:<id>``, expiring past its
retention, judged by the store's clock and never the server's), a script cache flushed
under the store, a Redis Cluster. PostgreSQL: the actions table made on first use (sync
and async) and by a create path safe to run twice and at once, a consume racing a write
committed while it waited for the row (READ COMMITTED), the piggybacked purge.

The behaviour every backend shares is in tests/contract/test_actions.py, on these stores too.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
import redis.asyncio.cluster
import redis.cluster

from idempotency_middleware import (
    ActionAlreadyUsedError,
    ActionState,
    OneTimeActions,
    StoreUnavailableError,
)
from idempotency_middleware.actions import postgres as pg_backend
from idempotency_middleware.actions.model import ActionRecord
from idempotency_middleware.actions.postgres import (
    ActionStatements,
    PostgresActions,
    step_flow,
)
from idempotency_middleware.actions.redis import KEY_INFIX
from idempotency_middleware.actions.steps import Consume, Insert, Written
from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.postgres.ops import Answer
from idempotency_middleware.stores.redis import RedisStore
from idempotency_middleware.testing import FakeClock
from tests.support.action_stores import ActionsUnderTest, open_actions
from tests.support.db_stores import open_db_store
from tests.support.redis_helpers import PrivateRedis, single_node_cluster

# Redis and PostgreSQL only, a cluster of its own among them, which no fixture names: make
# check leaves these out (tests/support/in_process.py).
pytestmark = pytest.mark.servers

TTL = 600.0
DAY = 86400.0


@pytest.fixture(params=["redis", "redis-async"])
def on_redis(request: pytest.FixtureRequest) -> Iterator[ActionsUnderTest]:
    yield from open_actions(request, request.param)


@pytest.fixture(params=["postgres", "postgres-async"])
def on_postgres(request: pytest.FixtureRequest) -> Iterator[ActionsUnderTest]:
    yield from open_actions(request, request.param)


# -- Redis -------------------------------------------------------------------------------------


def test_an_action_is_one_hash_beside_the_records_expiring_past_its_retention(
    on_redis: ActionsUnderTest, redis_url: str
) -> None:
    store: RedisStore = on_redis.store
    action = on_redis.create(expires_in=TTL, data={"n": 1})
    admin = redis.Redis.from_url(redis_url)
    try:
        key = f"{store.prefix}{KEY_INFIX}{action.action_id}"
        assert admin.type(key) == b"hash"
        assert admin.hget(key, "data") == b'{"n":1}'
        assert admin.keys(f"{store.prefix}*") == [key.encode()]
        # PEXPIREAT: the end of the retention plus the store's grace, by the store's clock.
        retention = OneTimeActions(store).retention_seconds
        expected = (TTL + retention + store.ttl_grace_seconds) * 1000
        assert expected - 5000 < admin.pttl(key) <= expected
    finally:
        admin.close()


def test_the_scripts_judge_by_the_store_clock_never_the_servers(
    on_redis: ActionsUnderTest, redis_url: str
) -> None:
    action = on_redis.create(expires_in=TTL)
    on_redis.clock.advance(TTL + 8 * DAY)  # by our clock, past its retention
    admin = redis.Redis.from_url(redis_url)
    try:
        key = f"{on_redis.store.prefix}{KEY_INFIX}{action.action_id}"
        assert admin.exists(key) == 1  # the server's clock has not moved: the key is there
    finally:
        admin.close()
    assert on_redis.get(action.action_id) is None  # answered as forgotten all the same
    assert on_redis.create(expires_in=TTL, action_id=action.action_id).state is ActionState.ACTIVE


def test_a_flushed_script_cache_costs_one_script_load_then_the_step_runs(
    on_redis: ActionsUnderTest, redis_url: str
) -> None:
    action = on_redis.create(expires_in=TTL)
    admin = redis.Redis.from_url(redis_url)
    try:
        admin.script_flush()
    finally:
        admin.close()
    on_redis.calls()
    assert on_redis.consume(action.action_id).state is ActionState.CONSUMED
    # EVALSHA answered NOSCRIPT: SCRIPT LOAD, then EVALSHA again.
    assert on_redis.calls() == ["evalsha", "evalsha", "script"]
    with pytest.raises(ActionAlreadyUsedError):
        on_redis.consume(action.action_id)
    assert on_redis.calls() == ["evalsha"]


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[PrivateRedis]:
    with single_node_cluster() as node:
        yield node


def test_actions_work_on_a_redis_cluster_sync_and_async(cluster_node: PrivateRedis) -> None:
    cluster = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster_node.port)
    with RedisStore(client=cluster, prefix="idem:") as store:
        actions = OneTimeActions(store)
        action = actions.create(expires_in=TTL, pin="1234")
        assert actions.consume(action.action_id, pin="1234").state is ActionState.CONSUMED
        with pytest.raises(ActionAlreadyUsedError):
            actions.consume(action.action_id, pin="1234")
    cluster.close()

    async def run() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster_node.port)
        actions = OneTimeActions(RedisStore(client=client, prefix="idem:"))
        action = await actions.acreate(expires_in=TTL)
        assert (await actions.acancel(action.action_id)).state is ActionState.CANCELED
        got = await actions.aget(action.action_id)
        assert got is not None and got.state is ActionState.CANCELED
        await client.aclose()

    asyncio.run(run())


# -- PostgreSQL ----------------------------------------------------------------------------------


def _table_exists(dsn: str, store: PostgresStore) -> bool:
    with psycopg.connect(dsn) as connection:
        row = connection.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (ActionStatements(store.table).table,)
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_the_actions_table_is_made_on_first_use(
    request: pytest.FixtureRequest, postgres_dsn: str
) -> None:
    store = open_db_store(request, "postgres")
    try:
        assert not _table_exists(postgres_dsn, store)
        actions = OneTimeActions(store)
        action = actions.create(expires_in=TTL)
        assert _table_exists(postgres_dsn, store)
        assert actions.get(action.action_id) == action
    finally:
        store.close()


def test_the_actions_table_is_made_on_first_use_of_the_async_methods(
    request: pytest.FixtureRequest, postgres_dsn: str
) -> None:
    store = open_db_store(request, "postgres-async")

    async def run() -> None:
        actions = OneTimeActions(store)
        assert await actions.aget("never-created") is None  # the read made the table
        action = await actions.acreate(expires_in=TTL)
        assert (await actions.aconsume(action.action_id)).state is ActionState.CONSUMED
        await store.aclose()

    try:
        asyncio.run(run())
        assert _table_exists(postgres_dsn, store)
    finally:
        store.close()


def test_creating_the_actions_table_is_safe_twice_and_at_once(
    request: pytest.FixtureRequest, postgres_dsn: str
) -> None:
    store = open_db_store(request, "postgres")
    # Two stores on one table (as two processes would have), eight creators at one instant.
    same = PostgresStore(postgres_dsn, table=store.table)
    creators = [PostgresActions(each) for each in (store, same) for _ in range(4)]
    barrier = threading.Barrier(len(creators), timeout=60)
    failures: list[BaseException] = []

    def create(backend: PostgresActions) -> None:
        barrier.wait(30)
        try:
            backend.create_table()
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=create, args=(creator,)) for creator in creators]
    try:
        assert not _table_exists(postgres_dsn, store)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert failures == []
        assert _table_exists(postgres_dsn, store)
        PostgresActions(store).create_table()  # once more: it exists, nothing to do
        action = OneTimeActions(same).create(expires_in=TTL)
        assert OneTimeActions(store).get(action.action_id) == action
    finally:
        store.close()
        same.close()


def test_a_consume_that_waited_for_a_concurrent_consume_says_already_used(
    postgres_dsn: str, request: pytest.FixtureRequest
) -> None:
    # The statement's snapshot predates the other consume: its sibling SELECT would see the
    # action still open. The step runs once more, on a new snapshot.
    opened = open_actions(request, "postgres")
    under = next(opened)
    try:
        action = under.create(expires_in=TTL)
        table = ActionStatements(under.store.table).table
        outcome: list[Any] = []
        with psycopg.connect(postgres_dsn) as other:
            other.execute(
                f"UPDATE {table} SET consumed_at = %s, consumed_reason = 'other' "
                "WHERE action_id = %s",
                (under.clock.now(), action.action_id),
            )  # (in a transaction, not committed yet: it holds the row)
            under.calls()

            def consume() -> None:
                try:
                    under.consume(action.action_id)
                except ActionAlreadyUsedError as error:
                    outcome.append(error)

            consumer = threading.Thread(target=consume)
            consumer.start()
            _wait_for_a_lock_wait(postgres_dsn)
            other.commit()
            consumer.join(30)
        (error,) = outcome
        assert error.action is not None and error.action.consumed_reason == "other"
        assert under.calls() == ["statement", "statement"]
    finally:
        opened.close()


def _wait_for_a_lock_wait(dsn: str) -> None:
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            time.sleep(0.01)
    raise AssertionError("the consume never waited for the row")


def _record(**changes: Any) -> tuple[Any, ...]:
    record = ActionRecord("x", 1.0, 1.0, 100.0, 200.0, **changes)
    return tuple(getattr(record, column) for column in pg_backend.COLUMNS)


def test_a_step_whose_every_run_raced_a_write_gives_up_as_a_write_conflict() -> None:
    flow = step_flow(ActionStatements("t"), Consume("x", 10.0, None, None))
    next(flow)
    stale = Answer([(False, *_record())], 1)  # open, active, no PIN: as if it had applied
    with pytest.raises(StoreUnavailableError) as raised:
        for _ in range(pg_backend.STEP_ATTEMPTS):
            flow.send(stale)
    assert raised.value.cause == "write_conflict"


def test_an_insert_that_found_no_row_in_its_snapshot_runs_again() -> None:
    record = ActionRecord("x", 10.0, 10.0, 100.0, 200.0)
    flow = step_flow(ActionStatements("t"), Insert(record, 10.0))
    next(flow)
    again = flow.send(Answer([], 0))  # the conflicting row came after the snapshot
    assert again.query == ActionStatements("t").insert
    with pytest.raises(StopIteration) as done:
        flow.send(Answer([(False, *_record())], 1))
    assert done.value.value == Written(False, ActionRecord("x", 1.0, 1.0, 100.0, 200.0))


def test_a_schema_qualified_store_table_gets_its_actions_table_in_that_schema(
    postgres_dsn: str,
) -> None:
    schema = f"actions_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    with PostgresStore(postgres_dsn, table=f"{schema}.idem") as store:
        sql = ActionStatements(store.table)
        assert sql.table == f'"{schema}"."idem_actions"'
        actions = OneTimeActions(store)
        action = actions.create(expires_in=TTL)
        assert actions.consume(action.action_id).state is ActionState.CONSUMED
        assert _table_exists(postgres_dsn, store)
        with psycopg.connect(postgres_dsn) as connection:
            row = connection.execute("SELECT to_regclass(%s)", (sql.schema_names[1],)).fetchone()
        assert row is not None and row[0] is not None  # its purge index, beside it


def test_forgotten_actions_are_purged_in_batches_on_later_creates(
    request: pytest.FixtureRequest, postgres_dsn: str
) -> None:
    clock = FakeClock(start=time.time())
    store = open_db_store(request, "postgres", clock=clock, purge_batch_size=2)
    table = ActionStatements(store.table).table

    def rows() -> int:
        with psycopg.connect(postgres_dsn) as connection:
            row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row is not None
        return int(row[0])

    try:
        actions = OneTimeActions(store, retention_seconds=0)
        for _ in range(3):
            actions.create(expires_in=10)  # the first create purged (nothing yet)
        clock.advance(30)
        actions.create(expires_in=TTL)  # within the interval: no purge
        assert rows() == 4
        clock.advance(31)
        actions.create(expires_in=TTL)  # a purge: a full batch of 2...
        assert rows() == 3
        actions.create(expires_in=TTL)  # ...so the next create goes on at once
        assert rows() == 3  # the last forgotten one went, the new one came
        assert all(actions.get(f"missing-{uuid.uuid4().hex}") is None for _ in range(2))
    finally:
        store.close()


def test_a_postgres_actions_table_of_an_earlier_version_gains_the_nonce_columns(
    postgres_dsn: str,
) -> None:
    table = f"idem_old_{uuid.uuid4().hex[:10]}"
    with PostgresStore(postgres_dsn, table=table) as store:
        sql = ActionStatements(store.table)
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            # The layout before created_by and consumed_by, with its index.
            admin.execute(sql.create_table.replace(", created_by text, consumed_by text", ""))
            admin.execute(sql.create_index)
            admin.execute(
                f"INSERT INTO {sql.table} (action_id, created_at, active_at, expires_at, "
                "purge_at, data) VALUES ('old-one', 1, 1, 4e9, 5e9, '7')"
            )
        actions = OneTimeActions(store)
        assert actions.consume("old-one").data == 7  # a row written before: no nonces
        action = actions.create(expires_in=TTL)
        assert actions.consume(action.action_id).state is ActionState.CONSUMED
        with psycopg.connect(postgres_dsn) as connection:
            rows = connection.execute(
                f"SELECT created_by IS NOT NULL, consumed_by IS NOT NULL FROM {sql.table} "
                "WHERE action_id = %s",
                (action.action_id,),
            ).fetchall()
        assert rows == [(True, True)]
