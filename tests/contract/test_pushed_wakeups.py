"""Pushed completions: a duplicate waiting (``wait_seconds``) on ``RedisStore`` or
``PostgresStore`` is woken by the first attempt's completion or release itself.

On the real servers. The waiters' polls are pushed far apart (5 to 10 s), so a waiter
answered within the test's timeouts was woken by the store's news, and the store's claim
count proves it: one claim that found the key held, one after the news, none between. A
test waits for conditions (the claims the store saw), never for a length of time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis
import redis.cluster

from idempotency_middleware import PostgresStore, RedisStore, idempotent
from idempotency_middleware.engine import decisions
from idempotency_middleware.engine.drivers import _pushed_wait
from idempotency_middleware.engine.effects import Wait
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult
from idempotency_middleware.stores.wakeups import Wakeups
from tests.support.redis_helpers import single_node_cluster

# Redis and PostgreSQL only, a cluster of its own among them, which no fixture names: make
# check leaves these out (tests/support/in_process.py).
pytestmark = pytest.mark.servers


class Counted:
    """Counts the claims the store answered, per key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims: list[str] = []

    def claim(self, request: ClaimRequest) -> ClaimResult:
        answer: ClaimResult = super().claim(request)  # type: ignore[misc]
        self.claims.append(request.key_hash)  # (once answered: a waiter's found the key held)
        return answer

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        answer: ClaimResult = await super().aclaim(request)  # type: ignore[misc]
        self.claims.append(request.key_hash)
        return answer


class CountedRedis(Counted, RedisStore):
    pass


class CountedPostgres(Counted, PostgresStore):
    pass


@dataclass
class Backend:
    store: Any  # CountedRedis | CountedPostgres
    listeners: Callable[[], int]  # the server's count of the store's listening connections
    kill: Callable[[], None]  # breaks the listening connection off, server side


def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


async def auntil(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.fixture(params=["redis", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        admin = redis.Redis.from_url(url)
        store: Any = CountedRedis(url, prefix=f"idem-push-{uuid.uuid4().hex[:8]}:")
        channel = store._ops.channel

        def listeners() -> int:
            return int(admin.pubsub_numsub(channel)[0][1])

        def kill() -> None:
            assert admin.client_kill_filter(_type="pubsub") >= 1

        try:
            yield Backend(store, listeners, kill)
        finally:
            store.close()
            admin.close()
        return
    dsn = request.getfixturevalue("postgres_dsn")
    store = CountedPostgres(dsn, table=f"idem_push_{uuid.uuid4().hex[:10]}")
    store.create_table()
    listening = f'LISTEN "{store._ops.sql.channel}"'
    with psycopg.connect(dsn, autocommit=True) as connection:

        def listeners() -> int:
            query = "SELECT count(*) FROM pg_stat_activity WHERE query = %s"
            row = connection.execute(query, (listening,)).fetchone()
            return int(row[0]) if row else 0

        def kill() -> None:
            query = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s"
            assert len(connection.execute(query, (listening,)).fetchall()) == 1

        try:
            yield Backend(store, listeners, kill)
        finally:
            store.close()


@pytest.fixture
def slow_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls 5 to 10 s apart: only the store's news can answer a waiter sooner."""
    monkeypatch.setattr(decisions, "MIN_POLL_INTERVAL", 5.0)
    monkeypatch.setattr(decisions, "MAX_POLL_INTERVAL", 10.0)


def subscribed(backend: Backend) -> None:
    """The store listens (the first waiter would otherwise start it, and be woken once by
    the subscription: news sent before it could have been missed)."""
    backend.store.wakeups.start()
    until(lambda: backend.store.wakeups.subscribed and backend.listeners() == 1)


class Gate:
    """The first call of each key blocks until opened; it raises when told to."""

    def __init__(self, raises: bool = False) -> None:
        self.opened = threading.Event()
        self.raises = raises
        self.runs: list[str] = []

    def run(self, key: str) -> str:
        self.runs.append(key)
        if self.runs.count(key) == 1:
            assert self.opened.wait(10)
            if self.raises:
                raise RuntimeError("declined")
        return f"{key}-{self.runs.count(key)}"


def waiting(store: Any, claims: int) -> Callable[[], bool]:
    return lambda: len(store.claims) >= claims


@pytest.mark.usefixtures("slow_polls")
def test_a_waiter_is_answered_by_the_completion_without_polling(backend: Backend) -> None:
    subscribed(backend)
    store, gate = backend.store, Gate()
    charge = idempotent(store=store, key="key", wait_seconds=30, name="charge")(
        lambda key: gate.run(key)
    )
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(charge, "k")
        until(lambda: gate.runs == ["k"])
        duplicate = pool.submit(charge, "k")
        until(waiting(store, 2))
        gate.opened.set()
        assert first.result(5) == "k-1"
        assert duplicate.result(4) == "k-1"  # well before its first poll (5 s at least)
    assert len(store.claims) == 3  # first, duplicate held, duplicate after the news
    assert gate.runs == ["k"]


@pytest.mark.usefixtures("slow_polls")
def test_a_release_lets_the_waiter_claim_and_run(backend: Backend) -> None:
    subscribed(backend)
    store, gate = backend.store, Gate(raises=True)
    charge = idempotent(store=store, key="key", wait_seconds=30, name="charge")(
        lambda key: gate.run(key)
    )
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(charge, "k")
        until(lambda: gate.runs == ["k"])
        duplicate = pool.submit(charge, "k")
        until(waiting(store, 2))
        gate.opened.set()
        with pytest.raises(RuntimeError, match="declined"):
            first.result(5)
        assert duplicate.result(4) == "k-2"  # claimed after the release, and ran
    assert len(store.claims) == 3
    assert gate.runs == ["k", "k"]


@pytest.mark.usefixtures("slow_polls")
async def test_an_async_waiter_is_woken_on_its_loop(backend: Backend) -> None:
    await asyncio.to_thread(subscribed, backend)
    store, opened = backend.store, asyncio.Event()
    runs: list[str] = []

    @idempotent(store=store, key="key", wait_seconds=30)
    async def charge(key: str) -> str:
        runs.append(key)
        if len(runs) == 1:
            await opened.wait()
        return f"{key}-{len(runs)}"

    first = asyncio.ensure_future(charge("k"))
    duplicate = asyncio.ensure_future(charge("k"))
    await auntil(lambda: len(store.claims) >= 2 and runs == ["k"])
    opened.set()
    assert await asyncio.wait_for(first, 5) == "k-1"
    assert await asyncio.wait_for(duplicate, 4) == "k-1"
    assert len(store.claims) == 3
    assert runs == ["k"]


def test_a_lost_channel_falls_back_to_polling_and_is_listened_to_again(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscribed(backend)
    store, gate = backend.store, Gate()
    charge = idempotent(store=store, key="key", wait_seconds=30, name="charge")(
        lambda key: gate.run(key)
    )
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(charge, "k")
        until(lambda: gate.runs == ["k"])
        duplicate = pool.submit(charge, "k")
        until(waiting(store, 2))
        backend.kill()  # mid-wait
        gate.opened.set()
        assert first.result(5) == "k-1"
        assert duplicate.result(5) == "k-1"  # by a poll, or by the channel back up
    until(lambda: store.wakeups.subscribed and backend.listeners() == 1)
    # Listened to again: the next waiter is pushed (its polls now far apart).
    monkeypatch.setattr(decisions, "MIN_POLL_INTERVAL", 5.0)
    monkeypatch.setattr(decisions, "MAX_POLL_INTERVAL", 10.0)
    gate2 = Gate()
    charge2 = idempotent(store=store, key="key", wait_seconds=30, name="charge")(
        lambda key: gate2.run(key)
    )
    before = len(store.claims)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(charge2, "k2")
        until(lambda: gate2.runs == ["k2"])
        duplicate = pool.submit(charge2, "k2")
        until(waiting(store, before + 2))
        gate2.opened.set()
        assert duplicate.result(4) == "k2-1"
    assert len(store.claims) == before + 3


@pytest.mark.usefixtures("slow_polls")
def test_many_waiters_on_one_key_and_on_many_keys_share_one_listener(
    backend: Backend,
) -> None:
    subscribed(backend)
    store, gate = backend.store, Gate()
    charge = idempotent(store=store, key="key", wait_seconds=30, name="charge")(
        lambda key: gate.run(key)
    )
    keys = [f"k{n}" for n in range(6)]
    with ThreadPoolExecutor(24) as pool:
        firsts = [pool.submit(charge, key) for key in keys]
        until(lambda: sorted(gate.runs) == keys)
        # 6 waiters on k0, and 2 on each of the others.
        waiters = [pool.submit(charge, "k0") for _ in range(5)]
        waiters += [pool.submit(charge, key) for key in keys for _ in range(2)]
        until(waiting(store, len(keys) + len(waiters)))
        assert backend.listeners() == 1
        gate.opened.set()
        assert [first.result(5) for first in firsts] == [f"{key}-1" for key in keys]
        assert all(waiter.result(4).endswith("-1") for waiter in waiters)
    assert len(store.claims) == len(keys) + 2 * len(waiters)
    assert sorted(gate.runs) == keys


@pytest.mark.usefixtures("slow_polls")
def test_a_waiter_on_a_redis_cluster_is_woken_through_plain_pub_sub() -> None:
    with single_node_cluster() as node:
        cluster = redis.cluster.RedisCluster(host="127.0.0.1", port=node.port)
        store: Any = CountedRedis(client=cluster, prefix="idem-push:")
        admin = redis.Redis(host="127.0.0.1", port=node.port)
        channel = store._ops.channel
        backend = Backend(store, lambda: int(admin.pubsub_numsub(channel)[0][1]), lambda: None)
        try:
            test_a_waiter_is_answered_by_the_completion_without_polling(backend)
        finally:
            store.close()
            cluster.close()
            admin.close()


# --- the async driver's pause, on a channel driven by the test -----------------------------


def silent_channel(
    ready: Callable[[], None], changed: Callable[[str], None], stopping: threading.Event
) -> None:
    stopping.wait()  # subscribed to nothing: the test announces the changes itself


async def test_a_doors_pause_ends_on_the_keys_news_or_when_its_client_left() -> None:
    wakeups = Wakeups(silent_channel, "test")
    never = asyncio.Event()
    paused: list[float] = []

    async def door(seconds: float) -> bool:  # the ASGI door's pause: until the client leaves
        paused.append(seconds)
        await never.wait()
        return True

    async def gone(seconds: float) -> bool:
        return False

    try:
        mark = wakeups.mark()
        pausing = asyncio.ensure_future(_pushed_wait(wakeups, mark, Wait(30.0, "k"), door))
        await auntil(lambda: paused == [30.0])
        await asyncio.to_thread(wakeups.changed, "other")
        assert not pausing.done()
        await asyncio.to_thread(wakeups.changed, "k")  # from the listener's thread
        assert await asyncio.wait_for(pausing, 2) is True
        # News heard between the claim (the mark) and the pause: no pause at all.
        assert await _pushed_wait(wakeups, mark, Wait(30.0, "k"), door) is True
        assert paused == [30.0]
        # A client gone while waiting ends the wait, as without news.
        assert await _pushed_wait(wakeups, wakeups.mark(), Wait(30.0, "k"), gone) is False
        assert wakeups._waiting == {}  # nobody left registered
    finally:
        wakeups.close()


def test_a_lost_channel_is_a_warning_once_and_its_return_is_logged(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, a lost channel was logged at DEBUG only: waiters slowed down to their polls
    # (seconds apart) with nothing in an ordinary log saying why.
    subscribed(backend)
    store = backend.store
    with caplog.at_level(logging.INFO, logger="idempotency_middleware"):
        caplog.clear()
        backend.kill()
        until(lambda: any(r.message.endswith("pushed again") for r in caplog.records))
        until(lambda: store.wakeups.subscribed and backend.listeners() == 1)
    lines = [
        (record.levelno, record.message)
        for record in caplog.records
        if "wake-up channel" in record.message
    ]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
    lost, back = (message for _, message in lines)
    assert repr(store) in lost and "waiters poll the store until it is back" in lost
    assert back == f"wake-up channel of {store!r} is back: waiters are pushed again"
