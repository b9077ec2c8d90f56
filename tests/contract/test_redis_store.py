"""RedisStore's own promises, on a real redis-server (the contract suite holds it to the
rest): one EVALSHA per operation, recovery from a flushed script cache, fencing, expiry
checked by the scripts (never by the server's sweeper or clock), the key layout, one key per
operation (MONITOR, and a cluster whose CROSSSLOT check would refuse anything else),
clients passed in used as they are, and one asyncio client per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from idempotency_middleware import RedisStore
from idempotency_middleware.handler.deferred import new_token
from idempotency_middleware.stores import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    Completion,
    Held,
    StoreUnavailable,
)
from idempotency_middleware.stores.records import StoredResponse, encode_response
from idempotency_middleware.stores.redis import ops
from tests.support.redis_helpers import CommandLog, PrivateRedis, single_node_cluster
from tests.unit.test_missing_extras import run_python

LOCK = 30.0
TTL = 3600.0
GRACE = 60.0
RESPONSE = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')


@pytest.fixture
def prefix() -> str:
    return f"idem-own-{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisStore]:
    with RedisStore(redis_url, prefix=prefix) as opened:
        opened.warm_up()
        yield opened


def new_key() -> str:
    """A key hash as the engine makes them (64 hex digits, as deferral tokens need)."""
    return uuid.uuid4().hex + uuid.uuid4().hex


def eventually(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within a few seconds (a closed connection takes a moment
    to leave the server's client list)."""
    deadline = time.monotonic() + 5
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def request(
    key: str, now: float, owner: str | None = None, lock: float = LOCK, skew: float = 0.0
) -> ClaimRequest:
    return ClaimRequest(key, "fp-1", owner or uuid.uuid4().hex, now, lock, skew)


def completion(claim: ClaimRequest, now: float, ttl: float = TTL, **extra: Any) -> Completion:
    return Completion(claim.key_hash, claim.owner, now, ttl, RESPONSE, **extra)


# --- round trips ------------------------------------------------------------------------


@pytest.fixture
def log(redis_url: str) -> Iterator[CommandLog]:
    with CommandLog(redis_url) as opened:
        yield opened


def test_every_operation_is_one_round_trip_and_a_duplicate_one_evalsha(
    store: RedisStore, log: CommandLog
) -> None:
    now = time.time()
    key = new_key()
    claim = request(key, now)
    owner = "ab" * 8 + "-" + "cd" * 4  # a token's owner part: hex-hex
    deferred = request(new_key(), now, owner=owner)
    token = new_token(deferred.key_hash, owner, now + TTL)
    steps: list[tuple[str, Callable[[], object], list[str]]] = [
        ("claim", lambda: store.claim(claim), ["evalsha"]),
        ("duplicate", lambda: store.claim(request(key, now + 1)), ["evalsha"]),
        ("renew", lambda: store.renew(key, claim.owner, now + 60), ["evalsha"]),
        ("complete", lambda: store.complete(completion(claim, now + 2)), ["evalsha"]),
        ("replay", lambda: store.claim(request(key, now + 3)), ["evalsha"]),
        ("get", lambda: store.get(key), ["hgetall"]),
        ("delete", lambda: store.delete(key), ["del"]),
        ("deferred claim", lambda: store.claim(deferred), ["evalsha"]),
        ("interim", lambda: store.complete(completion(deferred, now, deferred=True)), ["evalsha"]),
        ("final", lambda: store.complete_deferred(token, 200, (), b"done"), ["evalsha"]),
        ("forget", lambda: store.release_deferred(token), ["evalsha"]),
        ("release", lambda: store.release(deferred.key_hash, owner), ["evalsha"]),
        ("create_table", store.create_table, ["ping"]),
    ]
    for name, step, expected in steps:
        step()
        assert log.round_trips() == expected, name


async def test_the_async_methods_cost_the_same_single_evalsha(
    store: RedisStore, log: CommandLog
) -> None:
    now = time.time()
    await store.awarm_up()
    log.take()
    claim = request(new_key(), now)
    for step in (
        store.aclaim(claim),
        store.aclaim(request(claim.key_hash, now + 1)),
        store.arenew(claim.key_hash, claim.owner, now + 40),
        store.acomplete(completion(claim, now + 2)),
        store.aclaim(request(claim.key_hash, now + 3)),
        store.arelease(claim.key_hash, claim.owner),
    ):
        await step
        assert log.round_trips() == ["evalsha"]
    await store.aclose()


def test_a_flushed_script_cache_is_reloaded_once_and_the_claim_still_answers(
    store: RedisStore, admin: redis.Redis, log: CommandLog
) -> None:
    now = time.time()
    admin.script_flush()
    log.take()
    claim = request(new_key(), now)
    assert store.claim(claim) == CLAIMED
    # EVALSHA answered NOSCRIPT: SCRIPT LOAD, then EVALSHA again; once.
    assert log.round_trips() == ["evalsha", "script", "evalsha"]
    assert isinstance(store.claim(request(claim.key_hash, now + 1)), Held)
    assert log.round_trips() == ["evalsha"]


def test_warm_up_loads_every_script(store: RedisStore, admin: redis.Redis) -> None:
    admin.script_flush()
    store.warm_up()
    shas = [redis_scripts_sha(script.text) for script in ops.SCRIPTS.values()]
    assert admin.script_exists(*shas) == [True] * len(shas)


def redis_scripts_sha(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode()).hexdigest()


# --- fencing ----------------------------------------------------------------------------


def test_a_claim_sent_twice_by_its_owner_is_still_its_own(store: RedisStore) -> None:
    """A claim retried after its answer was lost (a dropped connection) finds its own record
    and is claimed, not held by itself until its lock expires."""
    claim = request(new_key(), time.time())
    assert store.claim(claim) == CLAIMED
    assert store.claim(claim) == CLAIMED
    assert isinstance(store.claim(request(claim.key_hash, claim.now)), Held)


# --- expiry: the scripts decide, by the request's clock ---------------------------------


def test_a_completed_record_without_any_ttl_is_claimable_once_past_expires_at(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    now = time.time()
    claim = request(new_key(), now)
    store.claim(claim)
    store.complete(completion(claim, now, ttl=10))
    admin.persist(prefix + claim.key_hash)  # no TTL at all: the sweeper will never act
    assert admin.pttl(prefix + claim.key_hash) == -1
    assert isinstance(store.claim(request(claim.key_hash, now + 9.999)), Held)
    assert store.claim(request(claim.key_hash, now + 10)) == CLAIMED


def test_an_in_progress_claim_whose_key_ttl_has_not_fired_is_taken_over_past_its_lock(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    now = time.time()
    claim = request(new_key(), now)
    store.claim(claim)
    assert admin.pttl(prefix + claim.key_hash) > LOCK * 1000  # the key lives on
    late = request(claim.key_hash, now + LOCK + 1.0, skew=1.0)
    assert store.claim(late) == TAKEN_OVER


def test_the_key_ttl_is_relative_so_a_clock_far_from_the_servers_still_keeps_records(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    # Times a year behind and a year ahead of the server's clock: PEXPIREAT of our own
    # deadlines would delete the first key at once and keep the second a year too long.
    for offset in (-365 * 86400.0, 365 * 86400.0):
        now = time.time() + offset
        claim = request(new_key(), now)
        store.claim(claim)
        key = prefix + claim.key_hash
        assert (LOCK + GRACE) * 1000 - 2000 < admin.pttl(key) <= (LOCK + GRACE) * 1000
        store.complete(completion(claim, now + 5))
        assert (TTL + GRACE) * 1000 - 2000 < admin.pttl(key) <= (TTL + GRACE) * 1000


def test_a_renewal_moves_the_key_ttl_by_as_much_as_the_lock(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    now = time.time()
    claim = request(new_key(), now)
    store.claim(claim)
    before = admin.pttl(prefix + claim.key_hash)
    assert store.renew(claim.key_hash, claim.owner, now + LOCK + 100)
    moved = admin.pttl(prefix + claim.key_hash) - before
    assert 100_000 - 2000 < moved <= 100_000


def test_the_ttl_grace_is_configurable(redis_url: str, prefix: str, admin: redis.Redis) -> None:
    with RedisStore(redis_url, prefix=prefix, ttl_grace_seconds=0) as store:
        claim = request(new_key(), time.time())
        store.claim(claim)
        assert LOCK * 1000 - 2000 < admin.pttl(prefix + claim.key_hash) <= LOCK * 1000
    with pytest.raises(ValueError, match="ttl_grace_seconds"):
        RedisStore(redis_url, ttl_grace_seconds=-1)


# --- the key layout ---------------------------------------------------------------------


def test_a_record_is_one_hash_at_prefix_plus_key_hash_with_exact_times(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    now = 1_764_000_000.123456
    claim = request(new_key(), now, owner="owner-1")
    store.claim(claim)
    key = prefix + claim.key_hash
    assert admin.type(key) == b"hash"
    assert admin.hgetall(key) == {
        b"status": b"in_progress",
        b"fingerprint": b"fp-1",
        b"owner": b"owner-1",
        b"lock_expires_at": repr(now + LOCK).encode(),
        b"expires_at": repr(now + LOCK).encode(),
        b"response_size": b"0",
        b"too_large": b"0",
    }
    store.complete(completion(claim, now + 1))
    fields = admin.hgetall(key)
    assert fields[b"status"] == b"completed"
    assert fields[b"expires_at"] == repr(now + 1 + TTL).encode()
    assert fields[b"response"] == encode_response(RESPONSE)
    record = store.get(claim.key_hash)
    assert record is not None
    assert record.lock_expires_at == now + LOCK  # exactly: no rounding on the way
    assert record.expires_at == now + 1 + TTL
    assert record.response == RESPONSE
    assert admin.keys(prefix + "*") == [key.encode()]


def test_a_response_over_max_response_bytes_is_not_stored_at_all(
    redis_url: str, prefix: str, admin: redis.Redis
) -> None:
    with RedisStore(redis_url, prefix=prefix, max_response_bytes=5) as store:
        claim = request(new_key(), time.time())
        store.claim(claim)
        assert store.complete(completion(claim, claim.now))
        fields = admin.hgetall(prefix + claim.key_hash)
        assert b"response" not in fields
        assert fields[b"too_large"] == b"1"
        assert fields[b"response_size"] == str(len(RESPONSE.body)).encode()
        record = store.get(claim.key_hash)
        assert record is not None and record.response_not_stored and record.response is None


def test_a_foreign_value_at_a_records_key_is_an_error_not_a_claim(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    key = new_key()
    admin.set(prefix + key, "not a hash")
    with pytest.raises(StoreUnavailable) as raised:
        store.claim(request(key, time.time()))
    assert raised.value.cause == "unknown"
    assert "WRONGTYPE" in str(raised.value)


# --- one key per operation --------------------------------------------------------------


def every_operation(store: RedisStore, now: float) -> list[str]:
    """Runs every operation once (sync); the key hashes it used."""
    key, other = new_key(), "ef" * 32
    owner = "12" * 8 + "-" + "34" * 4
    claim = request(key, now)
    store.claim(claim)
    store.claim(request(key, now + 1))
    store.renew(key, claim.owner, now + 60)
    store.complete(completion(claim, now + 2))
    store.get(key)
    store.release(key, claim.owner)
    store.delete(key)
    deferred = request(other, now, owner=owner)
    store.claim(deferred)
    store.complete(completion(deferred, now, deferred=True))
    token = new_token(other, owner, now + TTL)
    store.complete_deferred(token, 200, (), b"final")
    store.release_deferred(token)
    store.delete(other)
    store.create_table()
    return [key, other]


def test_every_command_of_every_operation_touches_its_one_key(
    store: RedisStore, log: CommandLog, prefix: str
) -> None:
    keys = every_operation(store, time.time())
    allowed = {prefix + key for key in keys}
    commands = log.take()
    assert len(commands) >= 30  # the scripts' own commands are in the log too
    for command in commands:
        if command.words[0].upper() == "PING":
            continue
        # (The news channel of completions and releases is a channel, not a key.)
        named = [w for w in command.words if w.startswith(prefix) and w != prefix + "changes"]
        assert len(named) == 1 and named[0] in allowed, command
        if command.words[0].upper() == "EVALSHA":
            assert command.words[2] == "1", command  # numkeys: exactly one, declared


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[PrivateRedis]:
    with single_node_cluster() as node:
        yield node


@pytest.mark.servers  # a Redis cluster of its own
def test_every_operation_works_on_a_cluster_client_sync_and_async(
    cluster_node: PrivateRedis,
) -> None:
    node = cluster_node
    cluster = redis.cluster.RedisCluster(host="127.0.0.1", port=node.port)
    with RedisStore(client=cluster, prefix="idem:") as store:
        assert len(every_operation(store, time.time())) == 2
        claim = request(new_key(), time.time())
        assert store.claim(claim) == CLAIMED
        assert isinstance(store.claim(request(claim.key_hash, claim.now)), Held)
    cluster.close()

    async def run() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=node.port)
        store = RedisStore(client=client, prefix="idem:")
        claim = request(new_key(), time.time())
        assert await store.aclaim(claim) == CLAIMED
        assert await store.acomplete(completion(claim, claim.now))
        held = await store.aclaim(request(claim.key_hash, claim.now + 1))
        assert isinstance(held, Held) and held.record.response == RESPONSE
        assert await store.arelease(claim.key_hash, claim.owner) is False
        await store.aclose()  # the caller's client: left open
        await client.aclose()

    asyncio.run(run())


@pytest.mark.servers  # a Redis cluster of its own
def test_a_cluster_refuses_commands_across_slots_so_the_check_above_can_fail(
    cluster_node: PrivateRedis,
) -> None:
    client = redis.Redis(host="127.0.0.1", port=cluster_node.port)
    with contextlib.closing(client), pytest.raises(redis.ResponseError, match="same slot"):
        client.delete("idem:a", "idem:b")


# --- clients ----------------------------------------------------------------------------


def client_names(admin: redis.Redis) -> list[str]:
    return [entry.get("name", "") for entry in admin.client_list()]


def test_a_client_passed_in_is_used_as_is_and_left_open(
    redis_url: str, prefix: str, admin: redis.Redis
) -> None:
    name = f"app-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url, client_name=name)
    with RedisStore(client=client, prefix=prefix) as store:
        assert store.claim(request(new_key(), time.time())) == CLAIMED
        mine = [e for e in admin.client_list() if e.get("name") == name]
        assert len(mine) == 1 and mine[0]["cmd"] == "evalsha"
    assert client.ping() is True  # not closed by the store
    assert name in client_names(admin)
    client.close()


def test_from_url_options_reach_the_clients(
    redis_url: str, prefix: str, admin: redis.Redis
) -> None:
    name = f"opt-{uuid.uuid4().hex[:8]}"
    with RedisStore(redis_url, prefix=prefix, client_name=name) as store:
        store.create_table()
        assert name in client_names(admin)
    assert eventually(lambda: name not in client_names(admin))  # closed with the store


async def test_a_sync_client_only_store_says_so_when_used_async(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client=client)
    with pytest.raises(TypeError, match="sync redis client only"):
        await store.aclaim(request(new_key(), time.time()))
    client.close()


async def test_an_async_client_only_store_says_so_when_used_sync(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = RedisStore(client=client)
    with pytest.raises(TypeError, match="asyncio client only"):
        store.claim(request(new_key(), time.time()))
    assert await store.aclaim(request(new_key(), time.time())) == CLAIMED
    await client.aclose()


async def test_a_store_with_both_clients_uses_each_for_its_flavour(redis_url: str) -> None:
    sync_client, async_client = redis.Redis.from_url(redis_url), redis.asyncio.from_url(redis_url)
    store = RedisStore(client=sync_client, async_client=async_client, prefix="both:")
    claim = request(new_key(), time.time())
    assert store.claim(claim) == CLAIMED
    assert await store.acomplete(completion(claim, claim.now))
    assert store.delete(claim.key_hash)
    sync_client.close()
    await async_client.aclose()


def test_wrong_clients_and_settings_are_refused_at_construction(redis_url: str) -> None:
    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses=False"):
        RedisStore(client=decoding)
    decoding.close()
    with pytest.raises(TypeError, match="redis-py client"):
        RedisStore(client=object())
    with pytest.raises(TypeError, match=r"redis\.asyncio client"):
        RedisStore(client=redis.Redis(), async_client=redis.Redis())
    with pytest.raises(ValueError, match="not both"):
        RedisStore(redis_url, client=redis.Redis())
    with pytest.raises(ValueError, match="retries="):
        RedisStore(redis_url, retry=None)


def test_without_a_url_or_client_the_store_points_at_localhost() -> None:
    assert repr(RedisStore(prefix="p:")) == "RedisStore('localhost:6379', prefix='p:')"


# --- one asyncio client per event loop --------------------------------------------------


def test_one_store_serves_several_event_loops_each_with_its_own_client(
    redis_url: str, prefix: str, admin: redis.Redis
) -> None:
    name = f"loops-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_url, prefix=prefix, client_name=name)
    now = time.time()
    results: list[object] = []

    def serve(index: int) -> None:
        async def claims() -> None:
            for attempt in range(5):
                results.append(await store.aclaim(request(f"{index}-{attempt}", now)))

        asyncio.run(claims())

    threads = [threading.Thread(target=serve, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [CLAIMED] * 10
    # asyncio.run shut each loop down, and each loop's client was closed with it.
    assert eventually(lambda: name not in client_names(admin))
    assert asyncio.run(store.aclaim(request("after", now))) == CLAIMED
    store.close()


def test_a_loop_closed_without_shutdown_leaves_nothing_behind(redis_url: str, prefix: str) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(store.aclaim(request(new_key(), time.time()))) == CLAIMED
    loop.run_until_complete(store.aclose())
    loop.run_until_complete(store.aclose())  # twice: nothing left to close
    other = asyncio.new_event_loop()
    other.run_until_complete(store.aget(new_key()))
    other.close()  # without shutting its async generators down
    assert asyncio.run(store.aget(new_key())) is None  # the closed loop's client is dropped
    loop.close()


# --- the extra --------------------------------------------------------------------------


def test_without_redis_the_package_imports_and_the_store_names_its_extra() -> None:
    result = run_python(
        """
        import sys
        import idempotency_middleware
        from idempotency_middleware import RedisStore
        print("redis" in sys.modules)
        try:
            RedisStore("redis://127.0.0.1:6379/0")
        except ModuleNotFoundError as error:
            print(error.name, error)
        """,
        refused=("redis",),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "False",
        "redis RedisStore needs redis, which is not installed: "
        'pip install "idempotency-middleware[redis]"',
    ]


def test_importing_the_package_does_not_import_redis() -> None:
    code = "import sys, idempotency_middleware; print('redis' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
        check=False,
    )
    assert result.stdout.strip() == "False", result.stderr
