"""RedisStore when Redis fails: each failure a ``StoreUnavailable`` with a precise cause, fed
to the circuit breaker, and never a double run. Servers whose state a test changes (a
password, a pause, a restart) are private to that test (tests/support/redis_helpers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from idempotency_middleware import RedisStore
from idempotency_middleware.stores import (
    CLAIMED,
    ClaimRequest,
    Completion,
    Held,
    StoreUnavailable,
)
from idempotency_middleware.stores.records import StoredResponse
from idempotency_middleware.stores.redis.errors import classify, describe, translate
from idempotency_middleware.testing import FakeClock
from tests.support.ports import free_port
from tests.support.redis_helpers import PrivateRedis, private_redis

# Redis servers of their own, which no fixture names: make check leaves these out
# (tests/support/in_process.py).
pytestmark = pytest.mark.servers

LOCK = 30.0
RESPONSE = StoredResponse(200, [], b"ok")


def request(key: str | None = None, now: float | None = None) -> ClaimRequest:
    return ClaimRequest(
        key or uuid.uuid4().hex, "fp", uuid.uuid4().hex, now or time.time(), LOCK, 1.0
    )


def breaker(store: RedisStore) -> str:
    """The breaker's state, read anew (not narrowed by an earlier assert)."""
    return store.breaker_state


def failure(call: Any) -> StoreUnavailable:
    with pytest.raises(StoreUnavailable) as raised:
        call()
    return raised.value


def test_a_closed_port_is_unreachable_at_once_and_counts_on_the_breaker() -> None:
    store = RedisStore(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1, breaker_threshold=2
    )
    started = time.monotonic()
    error = failure(lambda: store.claim(request()))
    assert time.monotonic() - started < 2
    assert error.cause == "unreachable"
    assert "127.0.0.1" in error.reason
    assert failure(lambda: store.release("k", "o")).cause == "unreachable"
    assert store.breaker_state == "open"
    assert failure(lambda: store.claim(request())).cause == "breaker_open"


async def test_a_closed_port_is_unreachable_for_the_async_methods_too() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    with pytest.raises(StoreUnavailable) as raised:
        await store.aclaim(request())
    assert raised.value.cause == "unreachable"
    await store.aclose()


def test_a_paused_server_times_out_then_answers_again() -> None:
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        store = RedisStore(server.url, socket_timeout=0.3, breaker_threshold=0)
        store.warm_up()
        # Every client waits 0.8 s (redis 6.2 pauses the pausing client too: no UNPAUSE).
        admin.client_pause(800, all=True)
        claim = request()
        error = failure(lambda: store.claim(claim))
        assert error.cause == "timed_out"
        assert error.retry_after is None
        # The timed-out claim reported nothing (the engine answers 503: nothing ran). A
        # retry either claims the key or finds that claim, never a second claim of its own.
        with RedisStore(server.url) as patient:
            retry = patient.claim(request(claim.key_hash))
        assert retry == CLAIMED or (isinstance(retry, Held) and retry.record.owner == claim.owner)
        store.close()
        admin.close()


def test_a_missing_or_wrong_password_is_bad_credentials() -> None:
    with private_redis("--requirepass", "s3cret") as server:
        for url in (server.url, server.url.replace("redis://", "redis://:n0tThePassword@")):
            store = RedisStore(url, breaker_threshold=1)
            error = failure(lambda store=store: store.claim(request()))
            assert error.cause == "bad_credentials", error
            assert error.misconfigured
            assert store.breaker_state == "closed"  # a misconfiguration is no outage
            assert "n0tThePassword" not in error.reason + str(error)
            store.close()
        good = RedisStore(server.url.replace("redis://", "redis://:s3cret@"))
        assert good.claim(request()) == CLAIMED
        good.close()


def test_an_acl_user_without_the_scripts_is_access_denied() -> None:
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser(
            "reader", enabled=True, passwords=["+pw"], keys=["*"], commands=["+hgetall"]
        )
        url = server.url.replace("redis://", "redis://reader:pw@")
        with RedisStore(url) as store:
            error = failure(lambda: store.claim(request()))
            assert (error.cause, error.code) == ("access_denied", "NOPERM")
            assert store.get("absent") is None  # what the user may do still works
        admin.close()


def test_a_replica_refusing_writes_after_a_failover_is_unreachable() -> None:
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.replicaof("127.0.0.1", free_port())  # a primary that is not there
        with RedisStore(server.url, breaker_threshold=1) as store:
            error = failure(lambda: store.claim(request()))
            assert (error.cause, error.code) == ("unreachable", "READONLY"), error
            assert store.breaker_state == "open"
        admin.replicaof("NO", "ONE")
        admin.close()


def test_a_server_out_of_memory_is_a_server_error() -> None:
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        with RedisStore(server.url) as store:
            store.warm_up()
            admin.config_set("maxmemory", 1)
            error = failure(lambda: store.claim(request()))
            assert (error.cause, error.code) == ("server_error", "OOM"), error
            admin.config_set("maxmemory", 0)
            assert store.claim(request()) == CLAIMED
        admin.close()


def test_a_server_busy_running_a_script_is_a_server_error() -> None:
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.config_set("lua-time-limit", 50)
        with RedisStore(server.url) as store:
            store.warm_up()
            spinner = redis.Redis.from_url(server.url)
            spinning = threading.Thread(
                target=lambda: _swallow(lambda: spinner.eval("while true do end", 0)),
                daemon=True,
            )
            spinning.start()
            _wait_until_busy(admin)  # the script ran past lua-time-limit
            error = failure(lambda: store.claim(request()))
            assert (error.cause, error.code) == ("server_error", "BUSY"), error
            admin.script_kill()
            spinning.join(5)
            assert store.claim(request()) == CLAIMED
            spinner.close()
        admin.close()


def _swallow(call: Any) -> None:
    with contextlib.suppress(redis.RedisError):
        call()


def test_a_server_restarted_mid_run_answers_503_never_a_double_run_then_works_again() -> None:
    # Append-only file, fsync on every write: what a claim wrote survives the crash.
    server = PrivateRedis(("--appendonly", "yes", "--appendfsync", "always"))
    server.start()
    try:
        clock = FakeClock()
        store = RedisStore(server.url, breaker_threshold=2, clock=clock)
        now = time.time()
        first = request(now=now)
        assert store.claim(first) == CLAIMED
        server.kill()
        assert failure(lambda: store.claim(request(first.key_hash, now + 1))).cause == (
            "unreachable"
        )
        completion = Completion(first.key_hash, first.owner, now + 2, 60.0, RESPONSE)
        assert failure(lambda: store.complete(completion)).cause == "unreachable"
        assert store.breaker_state == "open"
        server.start()  # same port, same data
        clock.advance(5.0)  # the breaker's cool-down: the next claim probes
        # The pooled connections died with the old server: the first call reconnects.
        held = store.claim(request(first.key_hash, now + 3))
        assert isinstance(held, Held) and held.record.owner == first.owner
        assert breaker(store) == "closed"
        assert store.complete(completion) is True
        replay = store.claim(request(first.key_hash, now + 4))
        assert isinstance(replay, Held) and replay.record.response == RESPONSE
        store.close()
    finally:
        server.stop()


async def test_the_async_client_reconnects_after_a_restart() -> None:
    server = PrivateRedis()
    server.start()
    try:
        clock = FakeClock()
        store = RedisStore(server.url, breaker_threshold=1, clock=clock)
        assert await store.aclaim(request()) == CLAIMED
        server.kill()
        with pytest.raises(StoreUnavailable) as raised:
            await store.aclaim(request())
        assert raised.value.cause == "unreachable"
        assert store.breaker_state == "open"
        server.start()
        clock.advance(5.0)
        assert await store.aclaim(request()) == CLAIMED
        assert breaker(store) == "closed"
        await store.aclose()
    finally:
        server.stop()


# --- classification of what the servers above do not produce ---------------------------


@pytest.mark.parametrize(
    ("error", "cause", "code"),
    [
        (
            redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
            "server_error",
            "BusyLoadingError",
        ),
        (
            redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
            "server_error",
            "CLUSTERDOWN",
        ),
        (
            redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
            "server_error",
            "MASTERDOWN",
        ),
        (
            redis.exceptions.ResponseError(
                "Error running script: @user_script:1: -TRYAGAIN Multiple keys"
            ),
            "server_error",
            "TRYAGAIN",
        ),
        (
            redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
            "unreachable",
            "READONLY",
        ),
        (
            redis.exceptions.AuthorizationError("this user has no permissions"),
            "access_denied",
            "NOPERM",
        ),
        (
            redis.exceptions.MaxConnectionsError("Too many connections"),
            "throttled",
            "MaxConnectionsError",
        ),
        (
            redis.exceptions.TimeoutError("Timeout connecting to server"),
            "unreachable",
            "TimeoutError",
        ),
        (redis.exceptions.TimeoutError("Timeout reading from socket"), "timed_out", "TimeoutError"),
        (asyncio.TimeoutError(), "timed_out", "TimeoutError"),
        (
            ConnectionResetError(104, "Connection reset by peer"),
            "unreachable",
            "ConnectionResetError",
        ),
        (RuntimeError("Event loop is closed"), "loop_closed", "RuntimeError"),
        (
            redis.exceptions.ResponseError("WRONGTYPE Operation against a key"),
            "unknown",
            "ResponseError",
        ),
    ],
)
def test_each_failure_has_its_cause(error: BaseException, cause: str, code: str) -> None:
    assert classify(error) == (cause, code)


def test_errors_name_where_the_server_is_never_its_password() -> None:
    assert describe(redis.Redis(unix_socket_path="/run/redis.sock")) == "unix:/run/redis.sock"
    assert describe(redis.Redis.from_url("redis://:pw@10.0.0.1:6380/2")) == "10.0.0.1:6380"


def test_a_runtime_error_that_is_not_about_loops_is_a_bug_raised_as_it_is() -> None:
    bug = RuntimeError("something else")
    with pytest.raises(RuntimeError, match="something else"):
        translate("claim", bug, "here")


def _wait_until_busy(admin: redis.Redis) -> None:
    """Until the server answers BUSY (a script running past lua-time-limit), polled."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            admin.ping()
        except redis.exceptions.ResponseError as error:
            if str(error).startswith("BUSY"):
                return
            raise
        time.sleep(0.02)
    pytest.fail("the server never became busy with the script")
