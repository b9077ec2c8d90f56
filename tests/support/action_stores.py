"""``OneTimeActions`` on every store kind, driven synchronously, with the calls that reach
the wire counted on DynamoDB, Redis and PostgreSQL.

The kinds (``tests.support.store_kinds.STORE_KINDS``): MemoryStore and SQLiteStore (each through its
sync and its async methods), DynamoDBStore and AsyncDynamoDBStore on moto's server, and both on
Amazon's DynamoDB Local (ids containing ``dynamodb-local``: skipped unless
``scripts/dynamodb-local.sh`` runs them), RedisStore and PostgresStore through their sync and
async methods, on the session's real servers (tests/support/db_servers.py). ``calls()`` is what
reached the wire since the last call: a DynamoDB kind's store talks to its server through a
``FaultProxy``, which records every request it forwards; on Redis, the server's own ``INFO
commandstats`` counts (the commands a script runs left out); on PostgreSQL, libpq's protocol
trace of the store's connection (a one-connection pool the test gives it), each ``Execute`` or
simple ``Query`` a statement.

Time is a ``FakeClock`` given to the store (started at the real time, so DynamoDB Local's TTL
sweeper leaves the items alone): tests cross ``active_at`` and ``expires_at`` by advancing
it, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any, TypeVar

import boto3
import psycopg
import pytest
import redis
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from idempotency_middleware import (
    Action,
    AsyncDynamoDBStore,
    DynamoDBStore,
    MemoryStore,
    OneTimeActions,
    SQLiteStore,
)
from idempotency_middleware.actions import memory as memory_backend
from idempotency_middleware.actions import redis as redis_backend
from idempotency_middleware.actions.postgres import ActionStatements, PostgresActions
from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION, table_creator
from tests.support import db_stores
from tests.support.faultproxy import FaultProxy
from tests.support.ports import free_port
from tests.support.redis_helpers import calls_since, command_calls
from tests.support.store_kinds import (
    LOCAL_KINDS,
    is_db_kind,
)

T = TypeVar("T")


# What one step costs on the wire, by backend: a script call; a statement.
EVALSHA = "evalsha"
STATEMENT = "statement"

# Not counted: the commands the action scripts run inside Redis (INFO commandstats counts
# them too), and a new connection's handshake.
_UNCOUNTED = frozenset(
    {"hget", "hmget", "hset", "hgetall", "hincrby", "del", "pexpireat", "hello", "auth", "select"}
)

_TABLES: dict[str, str] = {}
_TABLES_LOCK = threading.Lock()


def actions_table(endpoint: str) -> str:
    """The table for actions on ``endpoint``, created once per run (tests use fresh ids)."""
    with _TABLES_LOCK:
        if endpoint not in _TABLES:
            name = f"idem-actions-{uuid.uuid4().hex[:10]}"
            with table_creator(name, endpoint) as creator:
                creator.create_table()
            _TABLES[endpoint] = name
        return _TABLES[endpoint]


def endpoint_for(request: pytest.FixtureRequest, kind: str) -> str:
    name = "dynamodb_local_endpoint" if kind in LOCAL_KINDS else "moto_endpoint"
    endpoint: str = request.getfixturevalue(name)
    return endpoint


class RedisWire:
    """Counts the commands a Redis server runs (``INFO commandstats``), the ones the action
    scripts run inside left out, so what remains is what clients sent. The session's server
    serves one test at a time."""

    unit = EVALSHA

    def __init__(self, url: str) -> None:
        self._admin = redis.Redis.from_url(url)
        # Loaded once beforehand: the first EVALSHA of a script new to the server would
        # otherwise answer NOSCRIPT, then cost a SCRIPT LOAD (counted on its own, in
        # tests/contract/test_actions_redis_postgres.py).
        for text in redis_backend.SCRIPTS.values():
            self._admin.script_load(text)
        self._mark = command_calls(self._admin)

    def since_mark(self) -> list[str]:
        sent = calls_since(self._admin, self._mark)
        self._mark = command_calls(self._admin)
        # (Redis 7 names subcommands: "script|load"; 6 does not: "script".)
        names = [(name.split("|")[0], count) for name, count in sent.items()]
        return sorted(
            name
            for name, count in names
            if name not in _UNCOUNTED and name != "client"
            for _ in range(count)
        )

    def raw(self, store: Any, action_id: str) -> str:
        key = f"{store.prefix}{redis_backend.KEY_INFIX}{action_id}"
        return repr(self._admin.hgetall(key))

    def close(self) -> None:
        self._admin.close()


class PostgresWire:
    """libpq's protocol trace of the connections of the pools it configures: one
    ``Execute`` (extended protocol) or ``Query`` (simple protocol) per statement."""

    unit = STATEMENT

    def __init__(self, dsn: str, directory: Path) -> None:
        self.dsn = dsn
        self.path = directory / f"trace-{uuid.uuid4().hex[:8]}.txt"
        self._file = self.path.open("w")
        self._mark = 0

    def _trace(self, connection: Any) -> None:
        # libpq writes through a stream of its own on this descriptor, never closed: on
        # the file's own it would outlive the file, and once a new connection's socket
        # took the number, a traced Terminate (a pool closing later) landed in that
        # socket ("server closed the connection unexpectedly"). A duplicate is libpq's.
        connection.pgconn.trace(os.dup(self._file.fileno()))
        flags = psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        connection.pgconn.set_trace_flags(flags)

    def configure(self, connection: psycopg.Connection[Any]) -> None:
        self._trace(connection)

    async def aconfigure(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._trace(connection)

    def since_mark(self) -> list[str]:
        self._file.flush()
        text = self.path.read_text()
        sent = [line.split("\t") for line in text[self._mark :].splitlines()]
        self._mark = len(text)
        messages = [fields[2] for fields in sent if fields[0] == "F" and len(fields) > 2]
        return [STATEMENT for name in messages if name in ("Execute", "Query")]

    def raw(self, store: Any, action_id: str) -> str:
        table = ActionStatements(store.table).table
        with psycopg.connect(self.dsn) as connection:
            rows = connection.execute(
                f"SELECT * FROM {table} WHERE action_id = %s", (action_id,)
            ).fetchall()
        return repr(rows)

    def close(self) -> None:
        self._file.close()


_PG_TABLES: dict[str, str] = {}


def postgres_table(dsn: str) -> str:
    """The store table the counted PostgreSQL kinds share (tests use fresh ids), made once
    per run: a table per test would cost each one its DDL."""
    with _TABLES_LOCK:
        if dsn not in _PG_TABLES:
            name = f"idem_actions_{uuid.uuid4().hex[:10]}"
            with PostgresStore(dsn, table=name) as creator:
                creator.create_table()
                PostgresActions(creator).create_table()
            _PG_TABLES[dsn] = name
        return _PG_TABLES[dsn]


Wire = RedisWire | PostgresWire


class ActionsUnderTest:
    """One store kind's ``OneTimeActions``, called synchronously whatever its flavour."""

    def __init__(
        self,
        kind: str,
        store: Any,
        clock: FakeClock,
        *,
        loop: asyncio.AbstractEventLoop | None,
        proxy: FaultProxy | None = None,
        endpoint: str | None = None,
        path: Path | None = None,
        wire: Wire | None = None,
    ) -> None:
        self.kind = kind
        self.wire = wire
        self.store = store
        self.clock = clock
        self.loop = loop
        self.proxy = proxy
        self.endpoint = endpoint
        self.path = path
        self.actions = OneTimeActions(store)

    def __repr__(self) -> str:
        return f"ActionsUnderTest({self.kind})"

    @property
    def on_dynamodb(self) -> bool:
        return self.proxy is not None

    def costs(self, dynamodb_operations: list[str]) -> list[str] | None:
        """What ``calls()`` answers after steps that cost ``dynamodb_operations`` on
        DynamoDB: the same on the other backends, one call or statement per operation
        (``None`` off the wire)."""
        if self.proxy is not None:
            return dynamodb_operations
        if self.wire is None:
            return None
        return [self.wire.unit] * len(dynamodb_operations)

    def run(self, awaitable: Coroutine[Any, Any, T]) -> T:
        assert self.loop is not None
        return self.loop.run_until_complete(awaitable)

    def create(self, **options: Any) -> Action:
        if self.loop is None:
            return self.actions.create(**options)
        return self.run(self.actions.acreate(**options))

    def consume(self, action_id: str, **options: Any) -> Action:
        if self.loop is None:
            return self.actions.consume(action_id, **options)
        return self.run(self.actions.aconsume(action_id, **options))

    def cancel(self, action_id: str) -> Action:
        if self.loop is None:
            return self.actions.cancel(action_id)
        return self.run(self.actions.acancel(action_id))

    def get(self, action_id: str) -> Action | None:
        if self.loop is None:
            return self.actions.get(action_id)
        return self.run(self.actions.aget(action_id))

    def calls(self) -> list[str] | None:
        """The DynamoDB operations, Redis commands or PostgreSQL statements sent since the
        last call of this (``None`` on MemoryStore and SQLite)."""
        if self.wire is not None:
            return self.wire.since_mark()
        if self.proxy is None:
            return None
        operations = self.proxy.operations()
        self.proxy.forget()
        return operations

    def raw(self, action_id: str) -> str:
        """What the backend holds for the action, as it holds it (row, item, record)."""
        if self.wire is not None:
            return self.wire.raw(self.store, action_id)
        if self.path is not None:
            connection = sqlite3.connect(self.path)
            try:
                rows = connection.execute(
                    "SELECT * FROM idempotency_records_actions WHERE action_id = ?", (action_id,)
                ).fetchall()
            finally:
                connection.close()
            return repr(rows)
        if self.endpoint is not None:
            client = boto3.client("dynamodb", endpoint_url=self.endpoint, region_name=REGION)
            try:
                item = client.get_item(
                    TableName=self.store.layout.table_name,
                    Key={"pk": {"S": f"action#{action_id}"}},
                    ConsistentRead=True,
                )
            finally:
                client.close()
            return repr(item.get("Item"))
        return repr(memory_backend._TABLES[self.store].records.get(action_id))


def _open_db_actions(
    request: pytest.FixtureRequest,
    kind: str,
    clock: FakeClock,
    loop: asyncio.AbstractEventLoop | None,
    stack: contextlib.ExitStack,
    counted: bool,
) -> ActionsUnderTest:
    """A Redis or PostgreSQL kind. ``counted``: with its wire calls counted (a PostgreSQL
    store then has one traced connection); otherwise the store's own pools."""
    where = db_stores.location(request, kind)
    store: Any
    wire: Wire | None = None
    if kind.startswith("redis") or not counted:
        store = db_stores.open_db_store(request, kind, clock=clock)
        if kind.startswith("redis") and counted:
            wire = RedisWire(where)
            stack.callback(wire.close)
    else:
        wire = traced = PostgresWire(where, request.getfixturevalue("tmp_path"))
        stack.callback(traced.close)
        pools: dict[str, Any] = {}
        if loop is None:
            pool: ConnectionPool[Any] = ConnectionPool(
                where, min_size=1, max_size=1, configure=traced.configure, open=True
            )
            stack.callback(pool.close)
            pools["pool"] = pool
        else:
            async_pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                where, min_size=1, max_size=1, configure=traced.aconfigure, open=False
            )
            loop.run_until_complete(async_pool.open())
            stack.callback(lambda: loop.run_until_complete(async_pool.close()))
            pools["async_pool"] = async_pool
        store = PostgresStore(
            where,
            table=postgres_table(where),
            clock=clock,
            purge_interval_seconds=None,
            **pools,
        )
    if loop is not None:
        stack.callback(lambda: loop.run_until_complete(store.aclose()))
    stack.callback(store.close)
    if wire is not None:
        wire.since_mark()  # the store's set-up is not the test's
    return ActionsUnderTest(kind, store, clock, loop=loop, wire=wire)


def open_actions(
    request: pytest.FixtureRequest, kind: str, *, counted: bool = True
) -> Generator[ActionsUnderTest, None, None]:
    """An ``ActionsUnderTest`` of ``kind`` (a store kind), closed after the test.
    ``counted=False``: a Redis or PostgreSQL store as an application makes it (its own
    pools), its calls not counted."""
    is_async = kind.endswith("-async")
    clock = FakeClock(start=time.time())
    loop = asyncio.new_event_loop() if is_async else None
    with contextlib.ExitStack() as stack:
        store: Any
        if kind.startswith("memory"):
            under = ActionsUnderTest(kind, MemoryStore(clock=clock), clock, loop=loop)
        elif kind.startswith("sqlite"):
            path: Path = request.getfixturevalue("tmp_path") / "actions.sqlite3"
            store = SQLiteStore(path, clock=clock)
            stack.callback(store.close)
            under = ActionsUnderTest(kind, store, clock, loop=loop, path=path)
        elif is_db_kind(kind):
            under = _open_db_actions(request, kind, clock, loop, stack, counted)
        else:
            endpoint = endpoint_for(request, kind)
            table = actions_table(endpoint)
            proxy = stack.enter_context(FaultProxy(endpoint))
            store_class: Any = AsyncDynamoDBStore if is_async else DynamoDBStore
            store = store_class(table, endpoint_url=proxy.url, region_name=REGION, clock=clock)
            if is_async:
                assert loop is not None
                stack.callback(lambda: loop.run_until_complete(store.aclose()))
            else:
                stack.callback(store.close)
            under = ActionsUnderTest(kind, store, clock, loop=loop, proxy=proxy, endpoint=endpoint)
        try:
            yield under
        finally:
            stack.close()
            if loop is not None:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()


def unreachable_store(kind: str, tmp_path: Path) -> Any:
    """A store of ``kind`` that cannot be reached (nothing listens; a missing directory)."""
    if kind.startswith("sqlite"):
        return SQLiteStore(tmp_path / "missing" / "actions.sqlite3")
    if kind.startswith("redis"):
        return db_stores.unreachable_store(kind, free_port())
    if kind.startswith("postgres"):
        # (Waiting no longer than a refused connection takes to tell.)
        return PostgresStore(
            f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
            connect_timeout=0.2,
            pool_timeout_seconds=0.2,
        )
    store_class: Any = AsyncDynamoDBStore if kind.endswith("-async") else DynamoDBStore
    return store_class(
        "idem-actions",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name=REGION,
        max_attempts=1,
        connect_timeout=1,
    )
