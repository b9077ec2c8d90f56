"""The store contract: what every store guarantees, run against every store.

Kinds (tests/support/store_kinds.py): MemoryStore, SQLiteStore, RedisStore and PostgresStore (the
last two on real servers, tests/support/db_servers.py), each through its sync and its async methods,
and SQLiteStore on its changes() path too; DynamoDBStore (boto3) and AsyncDynamoDBStore
(aioboto3) on moto's server over real HTTP; and both DynamoDB stores on Amazon's DynamoDB
Local. The DynamoDB Local cases are always generated and reported as skipped unless
``IDEMPOTENCY_DYNAMODB_LOCAL_URL`` is set, which ``scripts/dynamodb-local.sh`` does (it
selects them with ``-k dynamodb-local``).

A store is done when it passes this module: claims, completions, releases, renewals,
takeovers, expiry, responses too large to keep, the operator interface (``get``,
``delete``, ``create_table`` and their ``a``-prefixed forms), deferred completion
(``complete_deferred``, ``release_deferred`` and their async twins), the one-winner race
(threads, tasks and processes, on the stores whose conditional writes are atomic) and
event-loop lifecycles. Time is the ``now`` each request carries, and the stores' clock is
a ``FakeClock``: lock timeouts, TTLs and token expiries are crossed by asking with a later
``now`` or advancing the clock, never by sleeping. Async stores are driven through an
adapter that runs each call on one event loop kept for the test, so the same test bodies
hold every store to the same contract.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import pytest

from examples.kv_store import KeyValueStore
from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore, MemoryStore, SQLiteStore
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.handler.deferred import new_token, parse_token
from idempotency_middleware.stores import (
    AsyncOperations,
    AsyncStore,
    Claimed,
    ClaimRequest,
    ClaimResult,
    Completion,
    Held,
    StoreUnavailable,
    SyncOperations,
    SyncStore,
)
from idempotency_middleware.stores.dynamodb.requests import (
    IN_PROGRESS_TTL_GRACE_SECONDS,
    MAX_ITEM_RESPONSE_BYTES,
)
from idempotency_middleware.stores.protocol import AsyncDeferrals, SyncDeferrals
from idempotency_middleware.stores.records import Record, Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION, table_creator
from tests.support.core_only import require_module
from tests.support.db_stores import location, open_db_store
from tests.support.ports import free_port
from tests.support.race_processes import RACES
from tests.support.race_worker import claim_in_a_process
from tests.support.store_kinds import (
    ATOMIC_KINDS,
    DYNAMODB_KINDS,
    LOCAL_KINDS,
    SDK_KINDS,
    STORE_KINDS,
    is_async,
    is_db_kind,
)

T = TypeVar("T")

LOCK = 5.0
TTL = 100.0
RESPONSE = StoredResponse(
    201,
    [(b"content-type", b"application/json"), (b"location", b"/orders/1"), (b"x-b", b"\xe9")],
    b'{"id": 1, "status": "created"}',
)
TOO_LARGE_BODY_SIZE = 600 * 1024


class Driver(Protocol):
    """The store operations the contract exercises, called synchronously."""

    @property
    def store(self) -> object:
        """The store under test itself."""
        ...

    def claim(self, request: ClaimRequest) -> ClaimResult: ...

    def complete(self, completion: Completion) -> bool: ...

    def release(self, key_hash: str, owner: str) -> bool: ...

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool: ...

    def get(self, key_hash: str) -> Record | None: ...

    def delete(self, key_hash: str) -> bool: ...

    def create_table(self) -> None: ...

    def check(self) -> None: ...

    def complete_deferred(
        self, token: Any, status: Any, headers: Any = (), body: Any = b""
    ) -> bool: ...

    def release_deferred(self, token: Any) -> bool: ...


class ContractSyncStore(SyncStore, SyncOperations, SyncDeferrals, Protocol):
    """A sync store: the store protocol, the operator interface and deferred completion."""


class ContractAsyncStore(AsyncStore, AsyncOperations, AsyncDeferrals, Protocol):
    """An async store: the store protocol, the operator interface and deferred completion."""


class SyncDriver:
    """Calls a sync store's methods as they are."""

    def __init__(self, store: ContractSyncStore) -> None:
        self.store = store

    def claim(self, request: ClaimRequest) -> ClaimResult:
        return self.store.claim(request)

    def complete(self, completion: Completion) -> bool:
        return self.store.complete(completion)

    def release(self, key_hash: str, owner: str) -> bool:
        return self.store.release(key_hash, owner)

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return self.store.renew(key_hash, owner, lock_expires_at)

    def get(self, key_hash: str) -> Record | None:
        return self.store.get(key_hash)

    def delete(self, key_hash: str) -> bool:
        return self.store.delete(key_hash)

    def create_table(self) -> None:
        return self.store.create_table()

    def check(self) -> None:
        return self.store.check()

    def complete_deferred(
        self, token: Any, status: Any, headers: Any = (), body: Any = b""
    ) -> bool:
        return self.store.complete_deferred(token, status, headers, body)

    def release_deferred(self, token: Any) -> bool:
        return self.store.release_deferred(token)


class AsyncDriver:
    """Runs an async store's ``a``-prefixed methods on one event loop, kept for the test."""

    def __init__(self, store: ContractAsyncStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop

    def run(self, awaitable: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def claim(self, request: ClaimRequest) -> ClaimResult:
        return self.run(self.store.aclaim(request))

    def complete(self, completion: Completion) -> bool:
        return self.run(self.store.acomplete(completion))

    def release(self, key_hash: str, owner: str) -> bool:
        return self.run(self.store.arelease(key_hash, owner))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return self.run(self.store.arenew(key_hash, owner, lock_expires_at))

    def get(self, key_hash: str) -> Record | None:
        return self.run(self.store.aget(key_hash))

    def delete(self, key_hash: str) -> bool:
        return self.run(self.store.adelete(key_hash))

    def create_table(self) -> None:
        return self.run(self.store.acreate_table())

    def check(self) -> None:
        return self.run(self.store.acheck())

    def complete_deferred(
        self, token: Any, status: Any, headers: Any = (), body: Any = b""
    ) -> bool:
        return self.run(self.store.acomplete_deferred(token, status, headers, body))

    def release_deferred(self, token: Any) -> bool:
        return self.run(self.store.arelease_deferred(token))


# Every kind is always generated: the DynamoDB Local ones skip (with the reason) when its URL
# is not set, through the dynamodb_local_endpoint fixture.


@pytest.fixture(scope="module")
def contract_table(moto_endpoint: str) -> str:
    """One table for the module: every test uses its own random keys, and creating a table
    per test would cost more than the tests themselves."""
    name = f"idem-contract-{uuid.uuid4().hex[:10]}"
    with table_creator(name, moto_endpoint) as creator:
        creator.create_table()
    return name


@pytest.fixture(scope="module")
def local_contract_table(dynamodb_local_endpoint: str) -> str:
    """``contract_table`` on DynamoDB Local."""
    name = f"idem-contract-{uuid.uuid4().hex[:10]}"
    with table_creator(name, dynamodb_local_endpoint) as creator:
        creator.create_table()
    return name


class Target(NamedTuple):
    """Where a DynamoDB kind's stores point: the endpoint and the module's table on it."""

    endpoint: str
    table: str


def endpoint_of(request: pytest.FixtureRequest, kind: str) -> str:
    fixture = "dynamodb_local_endpoint" if kind in LOCAL_KINDS else "moto_endpoint"
    endpoint: str = request.getfixturevalue(fixture)
    return endpoint


def target_of(request: pytest.FixtureRequest, kind: str) -> Target:
    fixture = "local_contract_table" if kind in LOCAL_KINDS else "contract_table"
    table: str = request.getfixturevalue(fixture)
    return Target(endpoint_of(request, kind), table)


@pytest.fixture(scope="module")
def sessions() -> tuple[Any, Any]:
    """boto3 and aioboto3 sessions shared by the module, so service models load once."""
    return require_module("boto3.session").Session(), require_module("aioboto3").Session()


def drive_async(store: ContractAsyncStore) -> Iterator[AsyncDriver]:
    """An ``AsyncDriver`` on a fresh event loop; the store is closed on that loop after."""
    loop = asyncio.new_event_loop()
    try:
        try:
            yield AsyncDriver(store, loop)
        finally:
            aclose = getattr(store, "aclose", None)
            if aclose is not None:
                loop.run_until_complete(aclose())
    finally:
        loop.close()


class Made(NamedTuple):
    """A store of a kind, and what another process needs to open the same one."""

    store: Any
    spec: tuple[str, ...]


def make_store(request: pytest.FixtureRequest, kind: str, **db_options: Any) -> Made:
    """A new store of ``kind`` on the test's ``clock``, in a namespace of its own (a Redis
    prefix, a PostgreSQL table, a SQLite file; random keys in the module's DynamoDB table).
    Memory, SQLite, Redis and PostgreSQL keep responses up to DynamoDB's item limit, so "too
    large" means the same thing everywhere."""
    clock: FakeClock = request.getfixturevalue("clock")
    base = kind.removesuffix("-async")
    if base == "memory":
        return Made(MemoryStore(max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock), ())
    if base == "kv":  # in-process, like memory: no spec for another process
        return Made(KeyValueStore(max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock), ())
    if is_db_kind(kind):
        db_store = open_db_store(
            request, base, max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock, **db_options
        )
        where = location(request, base)
        namespace = db_store.prefix if base == "redis" else db_store.table
        return Made(db_store, (base, where, namespace))
    if base in ("sqlite", SQLITE_CHANGES):
        tmp_path: Path = request.getfixturevalue("tmp_path")
        path = tmp_path / "contract.sqlite3"
        sqlite = SQLiteStore(path, max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock)
        if base == SQLITE_CHANGES:
            sqlite._ops.use_returning = False
        return Made(sqlite, ("sqlite", str(path)))
    endpoint, table = target_of(request, kind)
    sdk: dict[str, Any] = {}
    if kind in SDK_KINDS:
        sync_session, async_session = request.getfixturevalue("sessions")
        sdk = {"session": async_session if is_async(kind) else sync_session}
    store_class: Any = AsyncDynamoDBStore if is_async(kind) else DynamoDBStore
    made = store_class(table, endpoint_url=endpoint, region_name=REGION, clock=clock, **sdk)
    return Made(made, ("dynamodb", endpoint, table))


def open_driver(request: pytest.FixtureRequest, kind: str, **db_options: Any) -> Iterator[Driver]:
    """A driver of a new store of ``kind``, closed after (``db_options``: Redis's and
    PostgreSQL's own)."""
    store = make_store(request, kind, **db_options).store
    if is_async(kind):
        yield from drive_async(store)
        return
    try:
        yield SyncDriver(store)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


# SQLite before 3.35 has no RETURNING: there SQLiteStore tells a won claim by changes(), a
# path of its own that the contract holds to the same rules (forced on a newer SQLite).
SQLITE_CHANGES = "sqlite-changes"
# The minimal store of the docs (examples/kv_store.py), held to the same contract.
KV_KINDS = ["kv", "kv-async"]
CONTRACT_KINDS = [*STORE_KINDS, SQLITE_CHANGES, *KV_KINDS]


@pytest.fixture(params=CONTRACT_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def store(request: pytest.FixtureRequest, store_kind: str) -> Iterator[Driver]:
    yield from open_driver(request, store_kind)


@pytest.fixture(params=[*DYNAMODB_KINDS, *SDK_KINDS])
def dynamodb_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def dynamodb_store(request: pytest.FixtureRequest, dynamodb_kind: str) -> Iterator[Driver]:
    yield from open_driver(request, dynamodb_kind)


@pytest.fixture
def clock() -> FakeClock:
    """The stores' clock (what a deferral token expires by). Started at the real time, so a
    DynamoDB endpoint's TTL sweeper never takes these items for expired."""
    return FakeClock(start=time.time())


@pytest.fixture
def now(clock: FakeClock) -> float:
    """The time the test's requests carry, the stores' clock's start."""
    return clock.now()


@pytest.fixture
def key() -> str:
    return uuid.uuid4().hex


def claim_request(
    key: str, now: float, *, owner: str | None = None, fingerprint: str = "fp-1", lock: float = LOCK
) -> ClaimRequest:
    return ClaimRequest(
        key_hash=key,
        fingerprint=fingerprint,
        owner=owner or uuid.uuid4().hex,
        now=now,
        lock_timeout_seconds=lock,
    )


def completion(
    claim: ClaimRequest,
    now: float,
    *,
    ttl: float = TTL,
    response: StoredResponse = RESPONSE,
    owner: str | None = None,
) -> Completion:
    return Completion(
        key_hash=claim.key_hash,
        owner=owner or claim.owner,
        now=now,
        ttl_seconds=ttl,
        response=response,
    )


def held_record(result: ClaimResult) -> Record:
    assert isinstance(result, Held), result
    return result.record


# --- the protocols ----------------------------------------------------------------------


def test_store_implements_the_protocol_and_operator_interface_of_its_flavour(
    store: Driver, store_kind: str
) -> None:
    if is_async(store_kind):
        assert isinstance(store.store, AsyncStore)
        assert isinstance(store.store, AsyncOperations)
    else:
        assert isinstance(store.store, SyncStore)
        assert isinstance(store.store, SyncOperations)


# --- operators --------------------------------------------------------------------------


def test_get_of_an_absent_key_is_none(store: Driver, key: str) -> None:
    assert store.get(key) is None


def test_delete_removes_a_record_whoever_owns_it_and_says_so(
    store: Driver, key: str, now: float
) -> None:
    store.claim(claim_request(key, now))
    assert store.delete(key) is True
    assert store.get(key) is None
    assert store.claim(claim_request(key, now + 0.1)) == Claimed(taken_over=False)


def test_delete_of_an_absent_key_returns_false(store: Driver, key: str) -> None:
    assert store.delete(key) is False


def test_create_table_on_a_ready_store_keeps_its_records(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    store.create_table()
    record = store.get(key)
    assert record is not None
    assert record.owner == claim.owner


def test_check_of_a_ready_store_passes_and_changes_nothing(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    store.check()  # raises StoreUnavailableError when the store is not usable
    record = store.get(key)
    assert record is not None and record.owner == claim.owner


# --- claim ------------------------------------------------------------------------------


def test_claim_of_a_new_key_succeeds(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    assert store.claim(claim) == Claimed(taken_over=False)
    record = store.get(key)
    assert record is not None
    assert record.status is Status.IN_PROGRESS
    assert record.owner == claim.owner
    assert record.fingerprint == claim.fingerprint
    assert record.response is None
    assert record.lock_expires_at == pytest.approx(now + LOCK, abs=1e-5)


def test_second_claim_is_held_by_the_first(store: Driver, key: str, now: float) -> None:
    first = claim_request(key, now, fingerprint="fp-first")
    store.claim(first)
    record = held_record(store.claim(claim_request(key, now + 0.1, fingerprint="fp-second")))
    assert record.status is Status.IN_PROGRESS
    assert record.fingerprint == "fp-first"
    assert record.owner == first.owner
    assert record.response is None
    assert record.lock_expires_at == pytest.approx(now + LOCK, abs=1e-5)


def test_claims_of_different_keys_are_independent(store: Driver, now: float) -> None:
    assert isinstance(store.claim(claim_request(uuid.uuid4().hex, now)), Claimed)
    assert isinstance(store.claim(claim_request(uuid.uuid4().hex, now)), Claimed)


# --- complete ---------------------------------------------------------------------------


def test_owner_completes_and_a_claim_then_returns_the_response(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    assert store.complete(completion(claim, now + 1)) is True
    record = held_record(store.claim(claim_request(key, now + 2)))
    assert record.status is Status.COMPLETED
    assert record.fingerprint == claim.fingerprint
    assert record.response == RESPONSE
    assert record.response_not_stored is False
    assert record.response_size == len(RESPONSE.body)
    assert record.expires_at == pytest.approx(now + 1 + TTL, abs=1e-5)


def test_completed_record_within_its_ttl_is_held_even_past_the_old_lock(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    store.complete(completion(claim, now + 1))
    record = held_record(store.claim(claim_request(key, now + LOCK + 10)))
    assert record.status is Status.COMPLETED


def test_empty_response_round_trips(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    empty = StoredResponse(204, [], b"")
    assert store.complete(completion(claim, now, response=empty))
    assert held_record(store.claim(claim_request(key, now))).response == empty


def test_wrong_owner_cannot_complete(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    before = store.get(key)
    assert store.complete(completion(claim, now + 1, owner="intruder")) is False
    assert store.get(key) == before


def test_complete_of_an_absent_key_fails_and_creates_nothing(
    store: Driver, key: str, now: float
) -> None:
    assert store.complete(completion(claim_request(key, now), now)) is False
    assert store.get(key) is None


# --- release ----------------------------------------------------------------------------


def test_release_by_the_owner_lets_a_new_claim_succeed(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    assert store.release(key, claim.owner) is True
    assert store.get(key) is None
    assert store.claim(claim_request(key, now + 0.1)) == Claimed(taken_over=False)


def test_wrong_owner_cannot_release(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    before = store.get(key)
    assert store.release(key, "intruder") is False
    assert store.get(key) == before


def test_release_of_an_absent_key_fails(store: Driver, key: str) -> None:
    assert store.release(key, "nobody") is False


def test_release_of_a_completed_record_fails_and_keeps_its_response(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    assert store.complete(completion(claim, now)) is True
    assert store.release(key, claim.owner) is False  # no longer a claim to take back
    record = store.get(key)
    assert record is not None
    assert (record.status, record.response) == (Status.COMPLETED, RESPONSE)


def test_renew_of_an_absent_key_fails_and_creates_nothing(
    store: Driver, key: str, now: float
) -> None:
    assert store.renew(key, "nobody", now + LOCK) is False
    assert store.get(key) is None


# --- renew ------------------------------------------------------------------------------


def test_renew_extends_the_lock_so_it_is_not_taken_over(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    assert store.renew(key, claim.owner, now + 20) is True
    record = held_record(store.claim(claim_request(key, now + LOCK + 1)))
    assert record.owner == claim.owner
    assert record.lock_expires_at == pytest.approx(now + 20, abs=1e-5)
    assert store.claim(claim_request(key, now + 20.5)) == Claimed(taken_over=True)


def test_wrong_owner_cannot_renew(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    before = store.get(key)
    assert store.renew(key, "intruder", now + 1000) is False
    assert store.get(key) == before
    assert store.claim(claim_request(key, now + LOCK + 0.5)) == Claimed(taken_over=True)


def test_renew_of_a_completed_record_fails(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    store.complete(completion(claim, now + 1))
    before = store.get(key)
    assert store.renew(key, claim.owner, now + 1000) is False
    assert store.get(key) == before


# --- take-over --------------------------------------------------------------------------


def test_claim_within_the_lock_timeout_is_held(store: Driver, key: str, now: float) -> None:
    store.claim(claim_request(key, now))
    assert isinstance(store.claim(claim_request(key, now + LOCK - 0.01)), Held)


def test_stale_claim_is_taken_over_and_the_old_owner_is_fenced_out(
    store: Driver, key: str, now: float
) -> None:
    dead = claim_request(key, now)
    store.claim(dead)
    heir = claim_request(key, now + LOCK + 0.01, fingerprint="fp-heir")
    assert store.claim(heir) == Claimed(taken_over=True)

    assert store.complete(completion(dead, now + LOCK + 1)) is False
    assert store.release(key, dead.owner) is False
    assert store.renew(key, dead.owner, now + 1000) is False
    record = store.get(key)
    assert record is not None
    assert record.owner == heir.owner
    assert record.status is Status.IN_PROGRESS
    assert record.fingerprint == "fp-heir"

    assert store.complete(completion(heir, now + LOCK + 2)) is True
    assert store.complete(completion(dead, now + LOCK + 3)) is False
    final = held_record(store.claim(claim_request(key, now + LOCK + 4)))
    assert final.owner == heir.owner
    assert final.response == RESPONSE


def test_lock_deadline_has_sub_second_precision(store: Driver, key: str, now: float) -> None:
    store.claim(claim_request(key, now, lock=0.5))
    assert isinstance(store.claim(claim_request(key, now + 0.4)), Held)
    assert store.claim(claim_request(key, now + 0.6)) == Claimed(taken_over=True)


# --- expiry -----------------------------------------------------------------------------


def test_completed_record_past_its_ttl_is_claimable_while_still_stored(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    store.complete(completion(claim, now + 1, ttl=10))
    later = now + 11.5
    still_stored = store.get(key)
    assert still_stored is not None  # DynamoDB's TTL sweeper has not deleted it
    assert still_stored.status is Status.COMPLETED
    assert still_stored.is_expired(later)

    fresh = claim_request(key, later, fingerprint="fp-new")
    assert store.claim(fresh) == Claimed(taken_over=False)
    record = store.get(key)
    assert record is not None
    assert record.owner == fresh.owner
    assert record.status is Status.IN_PROGRESS
    assert record.fingerprint == "fp-new"
    assert record.response is None


def test_ttl_deadline_has_sub_second_precision(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    store.complete(completion(claim, now, ttl=2.5))
    assert isinstance(store.claim(claim_request(key, now + 2.4)), Held)
    assert isinstance(store.claim(claim_request(key, now + 2.6)), Claimed)


# --- responses too large to keep --------------------------------------------------------


def test_response_too_large_for_one_item_completes_without_its_body(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    large = StoredResponse(200, [(b"content-type", b"application/octet-stream")], os.urandom(
        TOO_LARGE_BODY_SIZE
    ))  # fmt: skip
    assert store.complete(completion(claim, now + 1, response=large)) is True
    record = held_record(store.claim(claim_request(key, now + 2)))
    assert record.status is Status.COMPLETED
    assert record.response is None
    assert record.response_not_stored is True
    assert record.response_size == TOO_LARGE_BODY_SIZE
    # Still completed: within the TTL the key is never claimable again.
    assert isinstance(store.claim(claim_request(key, now + TTL / 2)), Held)


def test_response_just_under_the_item_limit_is_kept(store: Driver, key: str, now: float) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    body = os.urandom(MAX_ITEM_RESPONSE_BYTES - 4096)
    response = StoredResponse(200, [(b"content-type", b"application/octet-stream")], body)
    assert store.complete(completion(claim, now + 1, response=response)) is True
    record = held_record(store.claim(claim_request(key, now + 2)))
    assert record.response == response
    assert record.response_not_stored is False


def test_a_claim_resent_by_its_own_owner_after_a_lost_answer_is_still_its_own(
    dynamodb_store: Driver, key: str, now: float
) -> None:
    # The transport retries a PutItem whose answer was lost (a read timeout, a cut
    # connection, a 5xx after the write): the retry fails its condition on its own claim.
    claim = claim_request(key, now)
    assert dynamodb_store.claim(claim) == Claimed(taken_over=False)

    assert dynamodb_store.claim(claim) == Claimed(taken_over=False)
    held = held_record(dynamodb_store.claim(claim_request(key, now + 0.5)))
    assert held.owner == claim.owner
    assert dynamodb_store.complete(completion(claim, now + 1)) is True
    # Once completed, the same owner's claim is a duplicate like any other.
    assert held_record(dynamodb_store.claim(claim)).status is Status.COMPLETED


def test_large_compressible_response_fits_in_one_item(
    dynamodb_store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    dynamodb_store.claim(claim)
    response = StoredResponse(200, [], b'{"row": "same"}\n' * 50_000)  # 800 KB, compresses
    assert dynamodb_store.complete(completion(claim, now + 1, response=response)) is True
    assert held_record(dynamodb_store.claim(claim_request(key, now + 2))).response == response


def test_streamed_completion_keeps_its_size_but_no_body(
    store: Driver, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    streamed = Completion(
        key_hash=key,
        owner=claim.owner,
        now=now,
        ttl_seconds=TTL,
        response=StoredResponse(200, [(b"content-type", b"text/event-stream")], b""),
        streamed=True,
        streamed_size=12345,
    )
    assert store.complete(streamed) is True
    record = held_record(store.claim(claim_request(key, now + 1)))
    assert record.status is Status.COMPLETED
    assert record.response is None
    assert record.response_not_stored is True
    assert record.response_size == 12345


def _not_kept(claim: ClaimRequest, now: float, how: str) -> Completion:
    """A completion by ``claim``'s owner whose body is not kept: streamed, or too large."""
    if how == "streamed":
        return Completion(
            key_hash=claim.key_hash,
            owner=claim.owner,
            now=now,
            ttl_seconds=TTL,
            response=StoredResponse(200, [(b"content-type", b"text/event-stream")], b""),
            streamed=True,
            streamed_size=12345,
        )
    large = StoredResponse(200, [], os.urandom(TOO_LARGE_BODY_SIZE))
    return completion(claim, now, response=large)


@pytest.mark.parametrize("how", ["streamed", "too_large"])
def test_a_second_completion_not_kept_leaves_no_earlier_body_behind(
    store: Driver, key: str, now: float, how: str
) -> None:
    # The same owner completing twice: the last one wins, so a replay never answers with
    # a body the last completion did not keep.
    claim = claim_request(key, now)
    store.claim(claim)
    assert store.complete(completion(claim, now + 1)) is True
    second = _not_kept(claim, now + 2, how)
    assert store.complete(second) is True
    record = held_record(store.claim(claim_request(key, now + 3)))
    assert record.status is Status.COMPLETED
    assert record.response is None
    assert record.response_not_stored is True
    assert record.response_size == second.body_size


@pytest.mark.parametrize("how", ["streamed", "too_large"])
def test_a_second_completion_kept_replaces_one_not_kept(
    store: Driver, key: str, now: float, how: str
) -> None:
    claim = claim_request(key, now)
    store.claim(claim)
    assert store.complete(_not_kept(claim, now + 1, how)) is True
    assert store.complete(completion(claim, now + 2)) is True
    record = held_record(store.claim(claim_request(key, now + 3)))
    assert record.response == RESPONSE
    assert record.response_not_stored is False
    assert record.response_size == len(RESPONSE.body)


def test_memory_store_without_a_limit_keeps_any_response(key: str, now: float) -> None:
    store = MemoryStore()
    claim = claim_request(key, now)
    store.claim(claim)
    large = StoredResponse(200, [], os.urandom(TOO_LARGE_BODY_SIZE))
    assert store.complete(completion(claim, now, response=large))
    assert held_record(store.claim(claim_request(key, now))).response == large


def test_memory_store_limit_is_on_the_body_size(key: str, now: float) -> None:
    store = MemoryStore(max_response_bytes=100)
    kept, dropped = claim_request(key, now), claim_request(uuid.uuid4().hex, now)
    store.claim(kept)
    store.claim(dropped)
    store.complete(completion(kept, now, response=StoredResponse(200, [], b"x" * 100)))
    store.complete(completion(dropped, now, response=StoredResponse(200, [], b"x" * 101)))
    assert held_record(store.claim(claim_request(kept.key_hash, now))).response is not None
    too_large = held_record(store.claim(claim_request(dropped.key_hash, now)))
    assert too_large.response is None
    assert too_large.response_not_stored
    assert too_large.response_size == 101


# --- DynamoDB specifics -----------------------------------------------------------------


def boto3_client(endpoint: str) -> Any:
    return require_module("boto3").client("dynamodb", endpoint_url=endpoint, region_name=REGION)


@pytest.mark.parametrize("kind", DYNAMODB_KINDS)
def test_create_table_twice_makes_an_on_demand_table_with_ttl(
    request: pytest.FixtureRequest, kind: str
) -> None:
    endpoint = endpoint_of(request, kind)
    name = f"idem-create-{uuid.uuid4().hex[:10]}"
    if is_async(kind):

        async def create_twice() -> None:
            async with AsyncDynamoDBStore(
                name, endpoint_url=endpoint, region_name=REGION
            ) as async_store:
                await async_store.acreate_table()
                await async_store.acreate_table()

        asyncio.run(create_twice())
    else:
        with DynamoDBStore(name, endpoint_url=endpoint, region_name=REGION) as sync_store:
            sync_store.create_table()
            sync_store.create_table()

    client = boto3_client(endpoint)
    ttl = client.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
    assert ttl["AttributeName"] == "ttl"
    table = client.describe_table(TableName=name)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_async_store_create_table_keeps_its_awaitable_name(moto_endpoint: str) -> None:
    name = f"idem-create-{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        async with AsyncDynamoDBStore(
            name, endpoint_url=moto_endpoint, region_name=REGION
        ) as async_store:
            await async_store.create_table()

    asyncio.run(create())
    status = boto3_client(moto_endpoint).describe_table(TableName=name)["Table"]["TableStatus"]
    assert status == "ACTIVE"


def test_ttl_attribute_is_whole_epoch_seconds_covering_the_deadline(
    dynamodb_store: Driver,
    dynamodb_kind: str,
    request: pytest.FixtureRequest,
    key: str,
    now: float,
) -> None:
    endpoint, table = target_of(request, dynamodb_kind)
    client = boto3_client(endpoint)

    def raw_item() -> dict[str, Any]:
        item: dict[str, Any] = client.get_item(
            TableName=table, Key={"pk": {"S": key}}, ConsistentRead=True
        )["Item"]
        return item

    claim = claim_request(key, now)
    dynamodb_store.claim(claim)
    # An in-progress claim's sweep waits a grace period past its lock (clock skew).
    assert raw_item()["ttl"]["N"] == str(math.ceil(now + LOCK + IN_PROGRESS_TTL_GRACE_SECONDS))
    dynamodb_store.complete(completion(claim, now + 1))
    item = raw_item()
    assert item["ttl"]["N"] == str(math.ceil(now + 1 + TTL))
    assert float(item["expires_at"]["N"]) == pytest.approx(now + 1 + TTL, abs=1e-5)


def test_unreachable_dynamodb_raises_store_unavailable_quickly(key: str, now: float) -> None:
    require_module("boto3")  # the store's default client
    endpoint = f"http://127.0.0.1:{free_port()}"
    with DynamoDBStore("idem", endpoint_url=endpoint, region_name=REGION) as unreachable:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            unreachable.claim(claim_request(key, now))
        assert time.monotonic() - started < 5


async def test_unreachable_dynamodb_raises_store_unavailable_quickly_async(
    key: str, now: float
) -> None:
    require_module("aioboto3")  # the store's default client
    endpoint = f"http://127.0.0.1:{free_port()}"
    async with AsyncDynamoDBStore("idem", endpoint_url=endpoint, region_name=REGION) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.aclaim(claim_request(key, now))
        assert time.monotonic() - started < 5


# --- round trips ------------------------------------------------------------------------


class CallCounter:
    """Records every DynamoDB API call (``before-call``) and HTTP attempt (``before-send``)."""

    def __init__(self, client: Any) -> None:
        self.calls: list[str] = []
        self.sends = 0
        client.meta.events.register("before-call.dynamodb", self._on_call)
        client.meta.events.register("before-send.dynamodb", self._on_send)

    def _on_call(self, **kwargs: Any) -> None:
        self.calls.append(kwargs["model"].name)

    def _on_send(self, **kwargs: Any) -> None:
        self.sends += 1

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        assert self.sends == len(calls), "a call was retried"
        self.sends = 0
        return calls


@pytest.fixture
def counter(dynamodb_store: Driver) -> CallCounter:
    if isinstance(dynamodb_store, AsyncDriver):
        assert isinstance(dynamodb_store.store, AsyncDynamoDBStore)
        return CallCounter(dynamodb_store.run(dynamodb_store.store.client()))
    assert isinstance(dynamodb_store.store, DynamoDBStore)
    return CallCounter(dynamodb_store.store.client)


def test_new_key_costs_one_claim_and_one_complete(
    dynamodb_store: Driver, counter: CallCounter, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    assert isinstance(dynamodb_store.claim(claim), Claimed)
    assert dynamodb_store.complete(completion(claim, now + 1))
    assert counter.take() == ["PutItem", "UpdateItem"]


def test_duplicate_of_an_in_progress_key_costs_one_call(
    dynamodb_store: Driver, counter: CallCounter, key: str, now: float
) -> None:
    dynamodb_store.claim(claim_request(key, now))
    counter.take()
    assert isinstance(dynamodb_store.claim(claim_request(key, now + 1)), Held)
    assert counter.take() == ["PutItem"]


def test_duplicate_of_a_completed_key_costs_one_call(
    dynamodb_store: Driver, counter: CallCounter, key: str, now: float
) -> None:
    claim = claim_request(key, now)
    dynamodb_store.claim(claim)
    dynamodb_store.complete(completion(claim, now + 1))
    counter.take()
    assert held_record(dynamodb_store.claim(claim_request(key, now + 2))).response == RESPONSE
    assert counter.take() == ["PutItem"]


def test_take_over_and_release_cost_one_call_each(
    dynamodb_store: Driver, counter: CallCounter, key: str, now: float
) -> None:
    dynamodb_store.claim(claim_request(key, now))
    counter.take()
    heir = claim_request(key, now + LOCK + 1)
    assert dynamodb_store.claim(heir) == Claimed(taken_over=True)
    assert counter.take() == ["PutItem"]
    assert dynamodb_store.release(key, heir.owner)
    assert counter.take() == ["DeleteItem"]


def test_operator_delete_costs_one_call_whether_or_not_there_was_a_record(
    dynamodb_store: Driver, counter: CallCounter, key: str, now: float
) -> None:
    dynamodb_store.claim(claim_request(key, now))
    counter.take()
    assert dynamodb_store.delete(key) is True
    assert dynamodb_store.delete(key) is False
    assert counter.take() == ["DeleteItem", "DeleteItem"]


def test_memory_store_drops_expired_records_so_memory_stays_bounded() -> None:
    store = MemoryStore(purge_interval_seconds=0)
    now = time.time()
    store.claim(ClaimRequest("old", "fp", "o1", now, 1.0))
    store.claim(ClaimRequest("live", "fp", "o2", now, 60.0))
    assert len(store) == 2
    # A later claim crosses the purge interval: the lapsed claim goes, the live one stays.
    store.claim(ClaimRequest("new", "fp", "o3", now + 5, 60.0))
    assert store.get("old") is None
    assert store.get("live") is not None
    assert len(store) == 2


# --- deferred completion: complete_deferred / release_deferred and their async twins ----
# A key claimed and completed as deferred holds its interim response until a worker finishes
# it by token. The DynamoDB stores run these on their SDK path too (a store given a session):
# its deferred writes are its own code. A token expires by advancing the stores' FakeClock.

DEFERRING_KINDS = [*STORE_KINDS, *SDK_KINDS]
DEFERRING = pytest.mark.parametrize("store_kind", DEFERRING_KINDS, indirect=True)
DEFERRAL_LOCK = 30.0
DEFERRAL_TTL = 3600.0
INTERIM = StoredResponse(
    202, [(b"content-type", b"application/json"), (b"location", b"/jobs/1")], b'{"job":1}'
)
# Sent by the worker: names in any case, hop-by-hop and Set-Cookie headers among them.
FINAL_HEADERS_SENT = [
    (b"Content-Type", b"application/json"),
    (b"Set-Cookie", b"session=abc; Path=/"),
    (b"Connection", b"close"),
    (b"X-Trace", b"trace-\xe9"),
    (b"transfer-encoding", b"chunked"),
]
# ... and what is kept of them: lower-cased names, in order, without the dropped ones.
FINAL_HEADERS_STORED = [(b"content-type", b"application/json"), (b"x-trace", b"trace-\xe9")]
FINAL_BODY = b'{"done":true,"total":12.5}'


def new_key_hash() -> str:
    """A key hash as the middleware stores it: 64 hex characters."""
    return hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def claim_for(now: float, key_hash: str | None = None, owner: str | None = None) -> ClaimRequest:
    return ClaimRequest(
        key_hash or new_key_hash(), "fp-deferred", owner or new_owner(), now, DEFERRAL_LOCK
    )


def interim_completion(claim: ClaimRequest, now: float) -> Completion:
    """What the engine stores when the handler deferred (``core.completion_for(...,
    deferred=True)``): the handler's response as the interim one."""
    return Completion(claim.key_hash, claim.owner, now, DEFERRAL_TTL, INTERIM, deferred=True)


def token_for(claim: ClaimRequest) -> str:
    """The token ``defer_completion()`` hands out for ``claim``: expiring with its DEFERRAL_TTL."""
    return new_token(claim.key_hash, claim.owner, claim.now + DEFERRAL_TTL)


def deferred_key(store: Driver, clock: FakeClock) -> tuple[ClaimRequest, str]:
    """A key claimed and completed as deferred; its claim and its token."""
    claim = claim_for(clock.now())
    assert store.claim(claim) == Claimed(taken_over=False)
    assert store.complete(interim_completion(claim, clock.now() + 0.25)) is True
    return claim, token_for(claim)


def retry_of(claim: ClaimRequest, now: float) -> ClaimRequest:
    """The same request again (same key and fingerprint), from another attempt."""
    return claim._replace(owner=new_owner(), now=now)


@DEFERRING
def test_a_deferred_key_holds_the_interim_response_until_its_token_completes_it(
    store: Driver, clock: FakeClock
) -> None:
    claim, token = deferred_key(store, clock)
    record = store.get(claim.key_hash)
    assert record is not None
    assert record.status is Status.DEFERRED
    assert record.response == INTERIM
    assert record.owner == claim.owner
    # A retry meanwhile is answered from the interim response, past the claim's lock too.
    clock.advance(DEFERRAL_LOCK + 1)
    waiting = held_record(store.claim(retry_of(claim, clock.now())))
    assert (waiting.status, waiting.response) == (Status.DEFERRED, INTERIM)

    assert store.complete_deferred(token, 200, FINAL_HEADERS_SENT, FINAL_BODY) is True

    final = store.get(claim.key_hash)
    assert final is not None
    assert final.status is Status.COMPLETED
    assert final.response == StoredResponse(200, FINAL_HEADERS_STORED, FINAL_BODY)
    assert final.response_not_stored is False
    assert final.owner == claim.owner
    assert final.fingerprint == claim.fingerprint
    assert final.expires_at == parse_token(token).expires_at == math.ceil(claim.now + DEFERRAL_TTL)
    assert held_record(store.claim(retry_of(claim, clock.now()))).response == final.response


@DEFERRING
@pytest.mark.parametrize("status", [503, 500, 404, 204, 100])
def test_any_final_status_is_stored_5xx_included(
    store: Driver, clock: FakeClock, status: int
) -> None:
    claim, token = deferred_key(store, clock)
    assert store.complete_deferred(token, status, [(b"x-status", str(status).encode())]) is True
    record = store.get(claim.key_hash)
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.response == StoredResponse(status, [(b"x-status", str(status).encode())], b"")


@DEFERRING
def test_a_body_of_any_bytes_like_type_is_stored_as_bytes(store: Driver, clock: FakeClock) -> None:
    claim, token = deferred_key(store, clock)
    assert store.complete_deferred(token, 200, (), memoryview(b"\x00\xffraw")) is True
    record = store.get(claim.key_hash)
    assert record is not None and record.response is not None
    assert record.response.body == b"\x00\xffraw"
    assert type(record.response.body) is bytes


@DEFERRING
def test_a_token_completes_its_key_once(store: Driver, clock: FakeClock) -> None:
    claim, token = deferred_key(store, clock)
    assert store.complete_deferred(token, 200, (), b"first") is True
    first = store.get(claim.key_hash)

    assert store.complete_deferred(token, 201, (), b"second") is False
    assert store.release_deferred(token) is False  # completed: the key is not forgotten

    assert store.get(claim.key_hash) == first


@DEFERRING
def test_release_deferred_forgets_the_key_so_a_retry_runs_again(
    store: Driver, clock: FakeClock
) -> None:
    claim, token = deferred_key(store, clock)
    assert store.release_deferred(token) is True
    assert store.get(claim.key_hash) is None
    # The token no longer applies to anything.
    assert store.release_deferred(token) is False
    assert store.complete_deferred(token, 200, (), b"late") is False
    assert store.get(claim.key_hash) is None
    assert store.claim(retry_of(claim, clock.now())) == Claimed(taken_over=False)


@DEFERRING
def test_a_token_of_another_owner_finishes_nothing(store: Driver, clock: FakeClock) -> None:
    claim, _ = deferred_key(store, clock)
    before = store.get(claim.key_hash)
    stranger = new_token(claim.key_hash, new_owner(), claim.now + DEFERRAL_TTL)

    assert store.complete_deferred(stranger, 200, (), b"not yours") is False
    assert store.release_deferred(stranger) is False

    assert store.get(claim.key_hash) == before


@DEFERRING
def test_a_token_of_an_owner_that_was_taken_over_finishes_nothing(
    store: Driver, clock: FakeClock
) -> None:
    # The first attempt stalled past its lock (it never stored its interim response); a
    # retry took the key over and is running now.
    claim = claim_for(clock.now())
    store.claim(claim)
    stale_token = token_for(claim)
    clock.advance(DEFERRAL_LOCK + 1)
    successor = retry_of(claim, clock.now())
    assert store.claim(successor) == Claimed(taken_over=True)

    assert store.complete_deferred(stale_token, 200, (), b"stale") is False
    assert store.release_deferred(stale_token) is False

    record = store.get(claim.key_hash)
    assert record is not None
    assert (record.status, record.owner) == (Status.IN_PROGRESS, successor.owner)


def taken_over_with_work_running(
    store: Driver, clock: FakeClock
) -> tuple[ClaimRequest, str, ClaimRequest]:
    """The orphan window: an attempt claimed a key and handed its work on (its token), then
    died before storing its interim response; a retry took the key over. The dead
    attempt's claim and token, and the retry's claim."""
    claim = claim_for(clock.now())
    assert store.claim(claim) == Claimed(taken_over=False)
    clock.advance(DEFERRAL_LOCK + 1)
    successor = retry_of(claim, clock.now())
    assert store.claim(successor) == Claimed(taken_over=True)
    return claim, token_for(claim), successor


def handed_to(successor: ClaimRequest, owner: str, now: float) -> Completion:
    """The retry's interim completion, handing the key to ``owner``'s running work."""
    return interim_completion(successor, now)._replace(deferred_to=owner)


@DEFERRING
def test_a_takeover_hands_its_deferred_key_to_the_work_still_running(
    store: Driver, clock: FakeClock
) -> None:
    claim, token, successor = taken_over_with_work_running(store, clock)

    assert store.complete(handed_to(successor, claim.owner, clock.now())) is True

    record = store.get(claim.key_hash)
    assert record is not None
    assert (record.status, record.owner, record.response) == (
        Status.DEFERRED,
        claim.owner,
        INTERIM,
    )
    assert record.expires_at == pytest.approx(clock.now() + DEFERRAL_TTL)
    # The retry's own token no longer applies; the running work's finishes the key.
    assert store.complete_deferred(token_for(successor), 200, (), b"not this one") is False
    assert store.complete_deferred(token, 200, FINAL_HEADERS_SENT, FINAL_BODY) is True
    final = store.get(claim.key_hash)
    assert final is not None
    assert (final.status, final.response) == (
        Status.COMPLETED,
        StoredResponse(200, FINAL_HEADERS_STORED, FINAL_BODY),
    )


@DEFERRING
def test_a_key_handed_over_is_released_by_the_running_work_token(
    store: Driver, clock: FakeClock
) -> None:
    claim, token, successor = taken_over_with_work_running(store, clock)
    assert store.complete(handed_to(successor, claim.owner, clock.now())) is True

    assert store.release_deferred(token_for(successor)) is False
    assert store.release_deferred(token) is True
    assert store.get(claim.key_hash) is None


@DEFERRING
def test_a_hand_over_sent_again_is_done_and_changes_nothing(
    store: Driver, clock: FakeClock
) -> None:
    # Its first answer lost (a timeout after the write): the finishing retry sends it again,
    # before and after the work finished the key.
    claim, token, successor = taken_over_with_work_running(store, clock)
    completion = handed_to(successor, claim.owner, clock.now())
    assert store.complete(completion) is True
    handed = store.get(claim.key_hash)

    assert store.complete(completion) is True
    assert store.get(claim.key_hash) == handed
    assert store.complete_deferred(token, 200, (), FINAL_BODY) is True
    final = store.get(claim.key_hash)
    assert store.complete(completion) is True
    assert store.get(claim.key_hash) == final


@DEFERRING
def test_an_owner_fenced_out_hands_nothing_over(store: Driver, clock: FakeClock) -> None:
    claim, _, successor = taken_over_with_work_running(store, clock)
    before = store.get(claim.key_hash)

    # The dead attempt's own interim completion, handing the key to anyone: not its key.
    assert store.complete(handed_to(claim, new_owner(), clock.now())) is False
    # A stranger handing it to the dead owner: not its key either.
    stranger = claim_for(clock.now(), claim.key_hash)
    assert store.complete(handed_to(stranger, claim.owner, clock.now())) is False

    assert store.get(claim.key_hash) == before
    assert before is not None and before.owner == successor.owner


@DEFERRING
def test_an_expired_token_completes_nothing(store: Driver, clock: FakeClock) -> None:
    claim, token = deferred_key(store, clock)
    before = store.get(claim.key_hash)
    clock.advance(parse_token(token).expires_at - clock.now())  # exactly at its expiry

    assert store.complete_deferred(token, 200, (), b"too late") is False

    assert store.get(claim.key_hash) == before


MALFORMED_TOKENS: list[object] = [
    "",
    "abc",
    "a" * 64,
    "a" * 64 + "." + "0" * 24 + "-1",  # two parts
    "a" * 64 + "." + "0" * 24 + "-1.1700000000.9",  # four parts
    "g" * 64 + "." + "0" * 24 + "-1.1700000000",  # key hash not hex
    "A" * 64 + "." + "0" * 24 + "-1.1700000000",  # hex, but not as written
    "a" * 63 + "." + "0" * 24 + "-1.1700000000",  # key hash too short
    "a" * 64 + "." + "0" * 24 + ".1700000000",  # owner without its counter
    "a" * 64 + "." + "0" * 24 + "-1.17e9",  # expiry not an integer
    "a" * 64 + "." + "0" * 24 + "-1.-1",
    " " + "a" * 64 + "." + "0" * 24 + "-1.1700000000",
    "a" * 64 + "." + "0" * 24 + "-1.1700000000\n",
    ("a" * 64 + "." + "0" * 24 + "-1.1700000000").encode(),  # bytes, not str
    None,
    1700000000,
]


@DEFERRING
@pytest.mark.parametrize("token", MALFORMED_TOKENS, ids=lambda token: repr(token)[:24])
def test_a_malformed_token_is_a_value_error(store: Driver, clock: FakeClock, token: object) -> None:
    claim, _ = deferred_key(store, clock)
    before = store.get(claim.key_hash)
    with pytest.raises(ValueError, match="token"):
        store.complete_deferred(token, 200, (), b"x")
    with pytest.raises(ValueError, match="token"):
        store.release_deferred(token)
    assert store.get(claim.key_hash) == before


class BadFinal(NamedTuple):
    status: object
    headers: object
    body: object
    error: type[Exception]


BAD_FINALS = [
    BadFinal(99, (), b"", ValueError),
    BadFinal(600, (), b"", ValueError),
    BadFinal(True, (), b"", ValueError),
    BadFinal("200", (), b"", ValueError),
    BadFinal(200.0, (), b"", ValueError),
    BadFinal(None, (), b"", ValueError),
    BadFinal(200, [("content-type", "text/plain")], b"", TypeError),
    BadFinal(200, [(b"content-type",)], b"", TypeError),
    BadFinal(200, [(b"a", b"b", b"c")], b"", TypeError),
    BadFinal(200, [[b"content-type", b"text/plain"]], b"", TypeError),
    BadFinal(200, [b"content-type: text/plain"], b"", TypeError),
    BadFinal(200, (), "text", TypeError),
    BadFinal(200, (), None, TypeError),
    BadFinal(200, (), {"done": True}, TypeError),
]


@DEFERRING
@pytest.mark.parametrize("bad", BAD_FINALS, ids=lambda bad: f"{bad.error.__name__}-{bad[:3]!r}")
def test_a_bad_final_response_is_refused_and_changes_nothing(
    store: Driver, clock: FakeClock, bad: BadFinal
) -> None:
    claim, token = deferred_key(store, clock)
    before = store.get(claim.key_hash)
    with pytest.raises(bad.error):
        store.complete_deferred(token, bad.status, bad.headers, bad.body)
    assert store.get(claim.key_hash) == before
    # The token still applies: nothing was used up by the refused call.
    assert store.complete_deferred(token, 200, (), b"ok") is True


@DEFERRING
def test_the_work_may_finish_before_the_interim_response_is_stored(
    store: Driver, clock: FakeClock
) -> None:
    """The race: a fast worker completes the key while its request still runs (the record
    is in progress, same owner). The interim completion that follows reports success and
    leaves the final response in place."""
    claim = claim_for(clock.now())
    store.claim(claim)
    token = token_for(claim)

    assert store.complete_deferred(token, 200, FINAL_HEADERS_SENT, FINAL_BODY) is True
    final = store.get(claim.key_hash)
    assert final is not None
    assert final.status is Status.COMPLETED

    assert store.complete(interim_completion(claim, clock.now() + 0.5)) is True
    # ... and again, as a finishing retry would send it.
    assert store.complete(interim_completion(claim, clock.now() + 0.6)) is True

    record = store.get(claim.key_hash)
    assert record == final
    assert record is not None
    assert record.response == StoredResponse(200, FINAL_HEADERS_STORED, FINAL_BODY)
    assert held_record(store.claim(retry_of(claim, clock.now() + 1))).response == record.response


@DEFERRING
def test_the_interim_completion_of_another_owner_stores_nothing(
    store: Driver, clock: FakeClock
) -> None:
    claim, _ = deferred_key(store, clock)
    before = store.get(claim.key_hash)
    other = claim._replace(owner=new_owner())
    assert store.complete(interim_completion(other, clock.now())) is False
    assert store.get(claim.key_hash) == before


@DEFERRING
def test_a_final_response_too_large_to_keep_still_completes_the_key(
    store: Driver, clock: FakeClock
) -> None:
    # Random bytes do not compress: over the item limit however they are encoded.
    body = os.urandom(MAX_ITEM_RESPONSE_BYTES + 1024)
    claim, token = deferred_key(store, clock)
    assert store.complete_deferred(token, 200, FINAL_HEADERS_SENT, body) is True
    record = store.get(claim.key_hash)
    assert record is not None
    assert (record.status, record.response) == (Status.COMPLETED, None)
    assert (record.response_not_stored, record.response_size) == (True, len(body))
    assert record.expires_at == parse_token(token).expires_at
    assert store.complete_deferred(token, 200, (), b"small") is False


@DEFERRING
def test_the_engine_release_keeps_a_key_the_work_completed(store: Driver, clock: FakeClock) -> None:
    """What the engine does when the handler fails after a fast worker finished: release
    its claim, fenced by its owner. The key is completed already (the work happened): the
    release must find nothing of its own to delete."""
    claim = claim_for(clock.now())
    store.claim(claim)
    assert store.complete_deferred(token_for(claim), 200, (), FINAL_BODY) is True
    final = store.get(claim.key_hash)

    released = store.release(claim.key_hash, claim.owner)

    assert store.get(claim.key_hash) == final
    assert released is False


@DEFERRING
def test_a_release_while_the_request_still_runs_forgets_the_key(
    store: Driver, clock: FakeClock
) -> None:
    """The worker gave up before the interim response was stored: the key is gone, the
    interim completion then stores nothing (its claim is no longer there), and a retry
    claims the key afresh."""
    claim = claim_for(clock.now())
    store.claim(claim)
    token = token_for(claim)

    assert store.release_deferred(token) is True
    assert store.get(claim.key_hash) is None
    assert store.complete(interim_completion(claim, clock.now() + 0.5)) is False

    assert store.get(claim.key_hash) is None
    assert store.claim(retry_of(claim, clock.now() + 1)) == Claimed(taken_over=False)


# --- the one-winner race ---------------------------------------------------------------
# Many claims of one new key at the same moment: exactly one is told it claimed it, and
# every other one is held by that winner's record, whatever the interleaving. Proven on the
# stores whose conditional writes are atomic (ATOMIC_KINDS): not on moto, whose threaded
# server can run two conditional writes on one item at once (tests/contract/test_moto_atomicity.py
# shows it), so a race there would prove nothing about the store. DynamoDB's race runs on
# DynamoDB Local.

CONTENDERS = 50
PROCESSES = 4
ROUNDS = 10  # keys, each raced for by every process at once
PROCESS_SECONDS = 60.0
# Another process opens the same store from its spec: every atomic kind but memory (which
# lives in one process), through its sync methods.
PROCESS_KINDS = [kind for kind in ATOMIC_KINDS if not is_async(kind) and kind != "memory"]


@pytest.fixture(params=[*ATOMIC_KINDS, *KV_KINDS])
def racing_store(request: pytest.FixtureRequest) -> Iterator[Driver]:
    # CONTENDERS connections opened at once, on a loaded machine: Redis's 1 s connect timeout
    # was crossed once (a 3.13 run beside the suite); what is raced here is the claim.
    kind: str = request.param
    options = {"socket_connect_timeout": PROCESS_SECONDS} if kind.startswith("redis") else {}
    yield from open_driver(request, kind, **options)


def claim_all_at_once(driver: Driver, requests: list[ClaimRequest]) -> list[ClaimResult]:
    """Every claim at the same moment: threads released by one barrier (sync stores), or
    tasks gathered on the driver's loop (async stores)."""
    if isinstance(driver, AsyncDriver):
        store = driver.store

        async def claim_all() -> list[ClaimResult]:
            return list(await asyncio.gather(*(store.aclaim(request) for request in requests)))

        return driver.run(claim_all())
    results: list[ClaimResult | None] = [None] * len(requests)
    start = threading.Barrier(len(requests), timeout=PROCESS_SECONDS)

    def claim(number: int) -> None:
        start.wait()
        results[number] = driver.claim(requests[number])

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PROCESS_SECONDS)
    assert all(result is not None for result in results), results
    return [result for result in results if result is not None]


def test_one_of_many_simultaneous_claims_wins_and_the_others_are_held_by_it(
    racing_store: Driver, key: str, now: float
) -> None:
    requests = [claim_request(key, now, owner=f"c{n}-{key[:6]}") for n in range(CONTENDERS)]

    results = claim_all_at_once(racing_store, requests)

    winners = [req.owner for req, res in zip(requests, results, strict=True) if res == Claimed()]
    assert len(winners) == 1, results
    holders = {held_record(result).owner for result in results if result != Claimed()}
    assert holders == set(winners)


@pytest.mark.parametrize("store_kind", PROCESS_KINDS, indirect=True)
def test_one_of_many_processes_claiming_at_once_wins_and_the_others_are_held_by_it(
    request: pytest.FixtureRequest, store_kind: str, now: float
) -> None:
    made = make_store(request, store_kind)
    made.store.close()  # made (and its table created); the processes open their own
    keys = [uuid.uuid4().hex for _ in range(ROUNDS)]
    context = RACES
    # Every wait bounded: a worker that fails before a start line breaks the barrier for
    # the others, and each reports what happened; one that never reports fails the test.
    start = context.Barrier(PROCESSES, timeout=PROCESS_SECONDS)
    results = context.Queue()
    workers = [
        context.Process(
            target=claim_in_a_process,
            args=(
                made.spec,
                [claim_request(key, now, owner=f"p{n}-{key[:6]}") for key in keys],
                start,
                results,
            ),
        )
        for n in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    try:
        batches = [results.get(timeout=2 * PROCESS_SECONDS) for _ in workers]
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()

    outcomes = [outcome.split() for batch in batches for outcome in batch]
    assert all(len(outcome) == 3 for outcome in outcomes), outcomes  # no "error: ..."
    for key in keys:
        round_outcomes = [(verb, owner) for each, verb, owner in outcomes if each == key]
        winners = [owner for verb, owner in round_outcomes if verb == "claimed"]
        assert len(round_outcomes) == PROCESSES and len(winners) == 1, round_outcomes
        assert round_outcomes.count(("held", winners[0])) == PROCESSES - 1, round_outcomes


# --- event-loop lifecycles -------------------------------------------------------------
# An async store is not tied to the loop it was first used on: each loop gets what it needs
# (a client, a pool), closed with that loop by aclose, and a loop closed without it does not
# strand the store. (That nothing is then reported unclosed is checked for DynamoDB in
# tests/contract/test_event_loops.py; RedisStore's redis.asyncio connection of such a loop is
# reported unclosed, at a garbage collection no test can place.)

ASYNC_KINDS = [kind for kind in STORE_KINDS if is_async(kind)]


async def aclose(store: Any) -> None:
    """Close what the store holds for the running loop (a store that holds nothing has no
    ``aclose``: MemoryStore)."""
    closing = getattr(store, "aclose", None)
    if closing is not None:
        await closing()


async def claim_complete_and_read(store: Any, key: str, now: float) -> None:
    """One claim, completion and read of ``key`` on the running loop."""
    claim = claim_request(key, now)
    assert await store.aclaim(claim) == Claimed()
    assert await store.acomplete(completion(claim, now)) is True
    record = await store.aget(key)
    assert record is not None and record.response == RESPONSE


@pytest.mark.parametrize("store_kind", ASYNC_KINDS, indirect=True)
def test_an_async_store_serves_event_loops_in_turn_each_closing_it_on_its_way_out(
    request: pytest.FixtureRequest, store_kind: str, now: float
) -> None:
    store = make_store(request, store_kind).store
    keys = [uuid.uuid4().hex for _ in range(3)]

    async def use_then_close(key: str) -> None:
        await claim_complete_and_read(store, key, now)
        await aclose(store)

    for key in keys:
        asyncio.run(use_then_close(key))  # asyncio.run closes its loop on its way out

    async def read_all() -> list[Record | None]:
        try:
            return [await store.aget(key) for key in keys]
        finally:
            await aclose(store)

    assert all(record is not None for record in asyncio.run(read_all()))


def use_on_a_loop_closed_without_closing_it(store: Any, key: str, now: float) -> None:
    loop = asyncio.new_event_loop()
    loop.run_until_complete(claim_complete_and_read(store, key, now))
    loop.close()  # no aclose, no shutdown_asyncgens: nothing closed what the loop used


@pytest.mark.parametrize("store_kind", ASYNC_KINDS, indirect=True)
def test_an_async_store_outlives_a_loop_closed_without_closing_it(
    request: pytest.FixtureRequest, store_kind: str, key: str, now: float
) -> None:
    store = make_store(request, store_kind).store
    use_on_a_loop_closed_without_closing_it(store, key, now)

    async def use_then_close() -> None:
        try:
            await claim_complete_and_read(store, uuid.uuid4().hex, now)
        finally:
            await aclose(store)

    asyncio.run(use_then_close())
