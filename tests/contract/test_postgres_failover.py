"""PostgresStore through a failover, on a server of its own the test stops and restarts.

What must hold: a call whose connection breaks answers ``StoreUnavailable`` (a claim: 503),
never a second run of the work; the broken connections are discarded; once the server is
back, the store works again without being rebuilt. Also the password checks, which the
session server (trust authentication) cannot make.
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

from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.protocol import CLAIMED, Held, StoreUnavailable
from tests.contract.test_postgres_store import completion, key, request, table
from tests.support.pg_instance import (
    SECRET_PASSWORD,
    SECRET_ROLE,
    PostgresInstance,
    postgres_instance,
)
from tests.support.session_servers import session_server

# A PostgreSQL server of its own, which no fixture names: make check leaves these out
# (tests/support/in_process.py).
pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def own() -> Iterator[PostgresInstance]:
    yield from session_server("PostgreSQL", postgres_instance)


def _terminate_clients(dsn: str) -> int:
    """``pg_terminate_backend`` every other client connection; how many."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _outcomes(store: PostgresStore, key_hash: str, attempts: int) -> list[str]:
    """Claim ``key_hash`` ``attempts`` times (new owners), each outcome's name."""
    found = []
    for number in range(attempts):
        try:
            result = store.claim(request(key_hash, owner=f"o{number}-1"))
        except StoreUnavailable as error:
            found.append(error.cause)
        else:
            found.append("held" if isinstance(result, Held) else "claimed")
    return found


def test_killed_connections_answer_503_then_the_store_recovers(own: PostgresInstance) -> None:
    with PostgresStore(own.dsn, table=table(), min_size=3, max_size=3) as store:
        store.create_table()
        # Three connections open and idle in the pool.
        barrier = threading.Barrier(3, timeout=60)

        def warm() -> None:
            barrier.wait()
            store.get(key())

        threads = [threading.Thread(target=warm) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # The pool opens its connections in the background: one may have served all three
        # gets while the others were still connecting (a loaded machine), so wait for all.
        store._transport.pool().wait(timeout=30)
        assert _terminate_clients(own.dsn) >= 3
        held = key()
        with pytest.raises(StoreUnavailable) as killed:
            store.claim(request(held))
        assert killed.value.cause == "unreachable"  # 57P01 admin_shutdown, or reset
        # The pool was drained: the other dead connections never serve a call.
        # Never a double run: of every later claim of the key, exactly one wins.
        assert _outcomes(store, held, 4) == ["claimed", "held", "held", "held"]
        assert store.breaker_state == "closed"


async def test_killed_connections_answer_503_then_recover_async(own: PostgresInstance) -> None:
    store = PostgresStore(own.dsn, table=table(), min_size=2, max_size=2)
    await store.acreate_table()
    await asyncio.gather(*(store.aget(key()) for _ in range(4)))
    assert _terminate_clients(own.dsn) >= 1
    held = key()
    with pytest.raises(StoreUnavailable) as killed:
        await store.aclaim(request(held))
    assert killed.value.cause == "unreachable"
    outcomes: list[str] = []
    for number in range(4):
        try:
            result = await store.aclaim(request(held, owner=f"o{number}-1"))
            outcomes.append("held" if isinstance(result, Held) else "claimed")
        except StoreUnavailable as error:
            outcomes.append(error.cause)
    assert outcomes == ["claimed", "held", "held", "held"]
    await store.aclose()


def test_a_restarted_server_answers_503_while_down_then_serves(own: PostgresInstance) -> None:
    with PostgresStore(own.dsn, table=table(), connect_timeout=1, breaker_threshold=0) as store:
        store.create_table()
        first = key()
        assert store.claim(request(first)) == CLAIMED
        own.stop()
        try:
            started = time.monotonic()
            down = _outcomes(store, key(), 3)
            assert down == ["unreachable"] * 3
            assert time.monotonic() - started < 8  # each fails within about a second
            with pytest.raises(StoreUnavailable) as finishing:
                store.complete(completion(first))
            assert finishing.value.cause == "unreachable"
        finally:
            own.start()
        # Back: the pool, deep in its reconnection backoff, is replaced at once.
        started = time.monotonic()
        assert store.complete(completion(first))  # the engine's retried completion lands
        assert time.monotonic() - started < 5
        replay = store.claim(request(first, owner="again-1"))
        assert isinstance(replay, Held) and replay.record.response is not None


async def test_a_restarted_server_async(own: PostgresInstance) -> None:
    store = PostgresStore(own.dsn, table=table(), connect_timeout=1, breaker_threshold=0)
    await store.acreate_table()
    own.restart()
    held = key()
    with pytest.raises(StoreUnavailable) as broken:
        await store.aclaim(request(held))  # its idle connection died with the server
    assert broken.value.cause == "unreachable"
    assert await store.aclaim(request(held, owner="b1-1")) == CLAIMED
    await store.aclose()


def test_a_wrong_password_is_bad_credentials(own: PostgresInstance) -> None:
    wrong = own.dsn.replace("postgres@", f"{SECRET_ROLE}:wrong@")
    store = PostgresStore(wrong, table=table(), connect_timeout=1)
    with store, pytest.raises(StoreUnavailable) as refused:
        store.claim(request(key()))
    assert refused.value.cause == "bad_credentials" and refused.value.code == "28P01"
    assert refused.value.misconfigured
    assert "wrong" not in refused.value.reason and "wrong" not in str(refused.value)
    right = own.dsn.replace("postgres@", f"{SECRET_ROLE}:{SECRET_PASSWORD}@")
    with PostgresStore(right, table=table()) as store:
        store.create_table()
        assert store.claim(request(key())) == CLAIMED
        assert SECRET_PASSWORD not in repr(store)


def test_a_missing_database_is_said_so(own: PostgresInstance) -> None:
    dsn = own.dsn.rsplit("/", 1)[0] + f"/nodb_{uuid.uuid4().hex[:6]}"
    store = PostgresStore(dsn, connect_timeout=1)
    with store, pytest.raises(StoreUnavailable) as missing:
        store.get(key())
    assert missing.value.cause == "cannot_open" and missing.value.code == "3D000"


def test_operations_during_an_outage_never_leave_a_half_claim(own: PostgresInstance) -> None:
    """Claims racing a server restart: each key is claimed at most once, whatever failed."""
    with PostgresStore(
        own.dsn, table=table(), connect_timeout=1, breaker_threshold=0, max_size=4
    ) as store:
        store.create_table()
        keys = [key() for _ in range(6)]
        won: dict[str, list[str]] = {k: [] for k in keys}
        stop = threading.Event()

        def claimer(number: int) -> None:
            while not stop.is_set():
                for key_hash in keys:
                    owner = f"t{number}-{uuid.uuid4().hex[:8]}"
                    try:
                        if store.claim(request(key_hash, owner=owner)) == CLAIMED:
                            won[key_hash].append(owner)
                    except StoreUnavailable:
                        pass

        threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.3)
            own.restart()
            time.sleep(0.3)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        rows: dict[str, Any] = {}
        with psycopg.connect(own.dsn) as connection:
            for key_hash, owner in connection.execute(
                f'SELECT key, owner FROM "{store.table}"'
            ).fetchall():
                rows[key_hash] = owner
        # Claims went through before the restart (or after it): the check below saw some.
        assert any(won.values()), "no claim won at all: the scenario proved nothing"
        for key_hash in keys:
            # A claim that failed may still have committed (its owner then holds the key and
            # nobody ran); but no two claimers were ever told "yours".
            assert len(won[key_hash]) <= 1
            if won[key_hash]:
                assert rows[key_hash] == won[key_hash][0]
