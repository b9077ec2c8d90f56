"""A PostgreSQL server that stops answering cannot hold a request: every statement has a
deadline on the client (``PostgresStore.answer_within``), past which its connection is
broken off and the call answers ``timed_out``.

The server's backend process serving the store is stopped with SIGSTOP: its connection
stays open and acknowledged by the kernel, so neither TCP nor the server's own
``statement_timeout`` ends the wait. The deadline is real time (a socket read), about two
seconds here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from idempotency_middleware import PostgresStore
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest, StoreUnavailable

OPTIONS = {
    "min_size": 1,
    "max_size": 1,
    "statement_timeout_seconds": 0.5,
    "connect_timeout": 1.0,
    "breaker_threshold": 0,
}


def claim(key: str) -> ClaimRequest:
    return ClaimRequest(key, "fp", uuid.uuid4().hex, time.time(), 30.0)


def backend_pid(dsn: str, table: str) -> int:
    """The server process whose last statement named ``table`` (the store's connection)."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
            (f"%{table}%",),
        ).fetchone()
    assert row is not None, "the store's connection was not found"
    return int(row[0])


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """Backends to stop: each is let go again (SIGCONT) after the test, whatever happens."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_a_hung_server_answers_timed_out_within_the_deadline_then_the_store_recovers(
    postgres_dsn: str, stopped: list[int]
) -> None:
    table = f"deadline_{uuid.uuid4().hex[:10]}"
    with PostgresStore(postgres_dsn, table=table, **OPTIONS) as store:  # type: ignore[arg-type]
        store.create_table()
        assert store.claim(claim("first")) == Claimed(taken_over=False)
        pid = backend_pid(postgres_dsn, table)
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failed:
            store.claim(claim("second"))
        elapsed = time.monotonic() - started

        assert failed.value.cause == "timed_out"
        assert "no answer within" in failed.value.reason
        assert store.answer_within <= elapsed < store.answer_within + 2.0
        # The broken connection is gone: the next call gets a new one (another backend).
        assert store.claim(claim("third")) == Claimed(taken_over=False)


def test_an_async_call_on_a_hung_server_answers_timed_out_within_the_deadline(
    postgres_dsn: str, stopped: list[int]
) -> None:
    table = f"deadline_{uuid.uuid4().hex[:10]}"

    async def scenario() -> tuple[StoreUnavailable, float]:
        async with PostgresStore(postgres_dsn, table=table, **OPTIONS) as store:  # type: ignore[arg-type]
            await store.acreate_table()
            assert await store.aclaim(claim("first")) == Claimed(taken_over=False)
            pid = backend_pid(postgres_dsn, table)
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as failed:
                await store.aclaim(claim("second"))
            elapsed = time.monotonic() - started
            assert await store.aclaim(claim("third")) == Claimed(taken_over=False)
            return failed.value, elapsed

    error, elapsed = asyncio.run(scenario())

    assert error.cause == "timed_out"
    assert 1.5 <= elapsed < 3.5
