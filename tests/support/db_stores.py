"""Redis and PostgreSQL stores for the shared suites, each on its real server.

The contract suite, the ``idempotent`` suites, the deferred-completion and clock-skew
suites and the HTTP behaviour suite all build these stores the same way, through
:func:`open_db_store`: a fresh namespace on the session's server (a Redis key prefix, a
PostgreSQL table), so tests never see each other's records. The servers come from the
``redis_url`` and ``postgres_dsn`` fixtures (tests/support/db_servers.py).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest

from idempotency_middleware.clock import SYSTEM_CLOCK, Clock


def location(request: pytest.FixtureRequest, kind: str) -> str:
    """The session server's URL or DSN for ``kind`` (starting it on first use)."""
    fixture = "redis_url" if kind.startswith("redis") else "postgres_dsn"
    found: str = request.getfixturevalue(fixture)
    return found


def new_store(kind: str, where: str, *, clock: Clock = SYSTEM_CLOCK, **options: Any) -> Any:
    """A store of ``kind`` on the server at ``where``, in a namespace of its own."""
    namespace = uuid.uuid4().hex[:12]
    if kind.startswith("redis"):
        from idempotency_middleware.stores.redis import RedisStore

        return RedisStore(where, prefix=f"idem-test-{namespace}:", clock=clock, **options)
    from idempotency_middleware.stores.postgres import PostgresStore

    store = PostgresStore(where, table=f"idem_{namespace}", clock=clock, **options)
    store.create_table()
    return store


def open_db_store(
    request: pytest.FixtureRequest, kind: str, *, clock: Clock = SYSTEM_CLOCK, **options: Any
) -> Any:
    """:func:`new_store` on the session's server for ``kind``."""
    return new_store(kind, location(request, kind), clock=clock, **options)


def unreachable_store(kind: str, port: int, *, clock: Clock = SYSTEM_CLOCK) -> Any:
    """A store of ``kind`` whose server is not there (``port`` on 127.0.0.1 is closed)."""
    if kind.startswith("redis"):
        from idempotency_middleware.stores.redis import RedisStore

        return RedisStore(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1, clock=clock)
    from idempotency_middleware.stores.postgres import PostgresStore

    return PostgresStore(
        f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=1, clock=clock
    )


def count_records(kind: str, store: Any, where: str) -> int:
    """How many records ``store`` holds (read on the server, not through the store)."""
    if kind.startswith("redis"):
        import redis

        client = redis.Redis.from_url(where)
        with contextlib.closing(client):
            return sum(1 for _ in client.scan_iter(match=f"{store.prefix}*", count=1000))
    import psycopg

    with psycopg.connect(where) as connection:
        row = connection.execute(f'SELECT count(*) FROM "{store.table}"').fetchone()
    assert row is not None
    return int(row[0])


def raw_record(kind: str, store: Any, where: str, key_hash: str) -> str:
    """Everything the server keeps for ``key_hash``, as text (for "never in clear" checks)."""
    if kind.startswith("redis"):
        import redis

        client = redis.Redis.from_url(where)
        with contextlib.closing(client):
            return repr(client.hgetall(f"{store.prefix}{key_hash}"))
    import psycopg

    with psycopg.connect(where) as connection:
        rows = connection.execute(
            f'SELECT * FROM "{store.table}" WHERE key = %s', (key_hash,)
        ).fetchall()
    return repr(rows)
