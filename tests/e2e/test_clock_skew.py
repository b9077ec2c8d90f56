"""The clock-skew takeover margin (``clock_skew_seconds``, README "Clock skew").

A stale in-progress claim is taken over only once its lock expired at least
``clock_skew_seconds`` ago by the claimer's clock: a host whose clock runs ahead of the
owner's by less than the margin cannot take over a live owner early. Completed and deferred
records expire at their ``expires_at`` whatever the margin. Shown:

1. at the store: every store with atomic claims (MemoryStore, SQLiteStore, both DynamoDB
   stores on moto and on Amazon's DynamoDB Local: ids with ``dynamodb-local``, run by
   ``scripts/dynamodb-local.sh -k "dynamodb-local and test_clock_skew"``), through its sync
   and its async methods, holds an in-progress claim until lock + margin and no longer; the
   memory and SQLite purges keep an in-progress record inside the margin;
2. over HTTP: two doors (ASGI on uvicorn, WSGI on waitress) sharing one store, each on its
   own ``FakeClock``, door B's ahead of door A's;
3. for ``idempotent`` functions, sync and async, on two clocks sharing a store;
4. the option's validation on both middlewares and ``idempotent``.

Time is the ``now`` a request carries, or a ``FakeClock``: deadlines are crossed by asking
later, never by sleeping. Door A's clock stays frozen, so its lease renewals (due by that
clock) never move its lock while a test runs; the tests check the lock did not move.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    KeyInProgressError,
    MemoryStore,
    SQLiteStore,
    idempotent,
)
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS
from idempotency_middleware.stores.protocol import (
    Claimed,
    ClaimRequest,
    ClaimResult,
    Completion,
    Held,
)
from idempotency_middleware.stores.records import Record, Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from idempotency_middleware.web.asgi_messages import Receive, Scope, Send
from idempotency_middleware.web.wsgi_environ import Environ, StartResponse
from tests.conftest import REGION, new_table
from tests.contract.test_store_contract import Driver, SyncDriver, drive_async
from tests.e2e.test_behaviour import assert_problem, replayed
from tests.support.apps import POST_SLOW, AppState
from tests.support.db_stores import open_db_store
from tests.support.function_stores import Events, FunctionStore, open_function_store
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, Adapter
from tests.support.skew_apps import SHARED_KINDS, SharedKind, serve_door, shared_stores
from tests.support.store_kinds import LOCAL_KINDS, STORE_KINDS, is_db_kind

# A lock well in the real future: DynamoDB Local's TTL sweeper deletes items whose ``ttl`` is
# in the real past, and ``ttl`` follows the lock of an in-progress claim.
LOCK = 30.0
TTL = 100.0
# Well above the microsecond DynamoDB keeps of a deadline, well below any margin tested.
EPSILON = 0.01
SKEWS = [0.0, 1.0, 2.5]
RESPONSE = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')


def skew_id(skew: float) -> str:
    return f"skew-{skew:g}"


def new_key() -> str:
    return f"skew-{uuid.uuid4().hex}"


@pytest.fixture
def t0() -> float:
    """Now, as whole seconds and a half: every deadline below (``t0 + 30 + 2.5 - 0.01``...) is
    then computed the same way by the test and the store, so "at the boundary" is exactly at
    it in every store."""
    return math.floor(time.time()) + 0.5


def claim_request(key: str, now: float, *, skew: float = 0.0) -> ClaimRequest:
    return ClaimRequest(key, "fp", uuid.uuid4().hex, now, LOCK, skew)


def completion(
    claim: ClaimRequest, now: float, *, ttl: float = TTL, deferred: bool = False
) -> Completion:
    return Completion(claim.key_hash, claim.owner, now, ttl, RESPONSE, deferred=deferred)


def held_record(result: ClaimResult) -> Record:
    assert isinstance(result, Held), result
    return result.record


def stored(store: Driver | MemoryStore | SQLiteStore, key: str) -> Record:
    record = store.get(key)
    assert record is not None, key
    return record


# --- 1. the stores -----------------------------------------------------------------------

# Every kind is always generated: the DynamoDB Local ones skip (with the reason) when its URL
# is not set, through the dynamodb_local_endpoint fixture.


@pytest.fixture(scope="module")
def sessions() -> tuple[Any, Any]:
    """boto3 and aioboto3 sessions for the module, so service models load once."""
    import aioboto3

    return boto3.session.Session(region_name=REGION), aioboto3.Session(region_name=REGION)


@pytest.fixture(scope="module")
def moto_skew_table(moto_endpoint: str) -> str:
    """One table for the module on moto (every test uses its own keys)."""
    return new_table(moto_endpoint, "skew")


@pytest.fixture(scope="module")
def local_skew_table(dynamodb_local_endpoint: str) -> str:
    """``moto_skew_table`` on DynamoDB Local."""
    return new_table(dynamodb_local_endpoint, "skew")


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    """One store kind, driven through its sync methods or (``-async``) its async ones."""
    kind: str = request.param
    is_async = kind.endswith("-async")
    backend: Any
    if kind.startswith("memory"):
        backend = MemoryStore()
    elif kind.startswith("sqlite"):
        backend = SQLiteStore(tmp_path / "skew.sqlite3")
    elif is_db_kind(kind):
        backend = open_db_store(request, kind.removesuffix("-async"))
    else:
        local = kind in LOCAL_KINDS
        endpoint: str = request.getfixturevalue(
            "dynamodb_local_endpoint" if local else "moto_endpoint"
        )
        table: str = request.getfixturevalue("local_skew_table" if local else "moto_skew_table")
        sync_session, async_session = request.getfixturevalue("sessions")
        if is_async:
            backend = AsyncDynamoDBStore(
                table, endpoint_url=endpoint, region_name=REGION, session=async_session
            )
        else:
            backend = DynamoDBStore(
                table, endpoint_url=endpoint, region_name=REGION, session=sync_session
            )
    if is_async:
        yield from drive_async(backend)
        return
    with contextlib.ExitStack() as closing:
        if not isinstance(backend, MemoryStore):
            closing.callback(backend.close)
        yield SyncDriver(backend)


@pytest.mark.parametrize("skew", SKEWS, ids=skew_id)
def test_in_progress_claim_is_held_until_lock_plus_margin_then_taken_over(
    store: Driver, skew: float, t0: float
) -> None:
    key = new_key()
    owner = claim_request(key, t0)
    assert store.claim(owner) == Claimed(taken_over=False)
    lock = owner.lock_expires_at

    early = store.claim(claim_request(key, lock + skew - EPSILON, skew=skew))
    assert held_record(early).owner == owner.owner
    assert held_record(early).status is Status.IN_PROGRESS

    heir = claim_request(key, lock + skew, skew=skew)
    assert store.claim(heir) == Claimed(taken_over=True)
    assert stored(store, key).owner == heir.owner
    # The owner that was taken over is fenced out; the heir completes.
    assert store.complete(completion(owner, lock + skew)) is False
    assert store.complete(completion(heir, lock + skew)) is True


@pytest.mark.parametrize("deferred", [False, True], ids=["completed", "deferred"])
@pytest.mark.parametrize("skew", SKEWS, ids=skew_id)
def test_finished_record_is_claimable_at_its_expiry_whatever_the_margin(
    store: Driver, skew: float, deferred: bool, t0: float
) -> None:
    key = new_key()
    owner = claim_request(key, t0)
    store.claim(owner)
    finished = completion(owner, t0 + 1, deferred=deferred)
    assert store.complete(finished) is True
    expiry = finished.expires_at
    status = Status.DEFERRED if deferred else Status.COMPLETED

    before = held_record(store.claim(claim_request(key, expiry - EPSILON, skew=skew)))
    assert before.status is status
    assert before.owner == owner.owner

    fresh = claim_request(key, expiry, skew=skew)
    # Not a take-over: nobody was running it.
    assert store.claim(fresh) == Claimed(taken_over=False)
    record = stored(store, key)
    assert record.owner == fresh.owner
    assert record.status is Status.IN_PROGRESS


# The purges. A claim of another key inside the margin runs one; a completed record that
# expired earlier shows it ran, and an in-progress claim past the margin shows what it drops.


class PurgeKeys:
    """Three records written at ``t0``: ``live`` and ``dead`` in progress (lock
    ``t0 + LOCK``), ``expired`` completed and expired long before that lock."""

    def __init__(self, t0: float) -> None:
        self.live = claim_request("live", t0)
        self.dead = claim_request("dead", t0)
        self.expired = claim_request("expired", t0)
        self.lock = self.live.lock_expires_at

    def write(self, store: MemoryStore | SQLiteStore) -> None:
        for claim in (self.live, self.dead, self.expired):
            assert store.claim(claim) == Claimed(taken_over=False)
        assert store.complete(completion(self.expired, self.expired.now, ttl=1)) is True


def _late_claim_is_held_and_the_owner_completes(
    store: MemoryStore | SQLiteStore, keys: PurgeKeys, now: float, skew: float
) -> None:
    late = store.claim(claim_request("live", now, skew=skew))
    assert held_record(late).owner == keys.live.owner
    assert store.complete(completion(keys.live, now)) is True
    assert stored(store, "live").status is Status.COMPLETED


@pytest.mark.parametrize("skew", [1.0, 2.5], ids=skew_id)
def test_memory_purge_keeps_an_in_progress_claim_inside_the_margin(skew: float, t0: float) -> None:
    store = MemoryStore(purge_interval_seconds=0, clock=FakeClock(t0))  # every claim purges
    keys = PurgeKeys(t0)
    keys.write(store)
    inside = keys.lock + skew - EPSILON

    store.claim(claim_request("other-1", inside, skew=skew))
    assert store.get("expired") is None  # the purge ran
    assert stored(store, "dead").status is Status.IN_PROGRESS
    _late_claim_is_held_and_the_owner_completes(store, keys, inside, skew)

    store.claim(claim_request("other-2", keys.lock + skew, skew=skew))
    assert store.get("dead") is None  # past the margin, the purge drops it
    assert stored(store, "live").owner == keys.live.owner


PURGE_INTERVAL = 60.0


@pytest.mark.parametrize("skew", [1.0, 2.5], ids=skew_id)
def test_sqlite_purge_after_a_claim_keeps_an_in_progress_claim_inside_the_margin(
    tmp_path: Path, skew: float, t0: float
) -> None:
    # The store's clock only says when a purge is due; what it deletes follows the claims.
    purge_clock = FakeClock(t0)
    path = tmp_path / "purge.sqlite3"
    with SQLiteStore(path, purge_interval_seconds=PURGE_INTERVAL, clock=purge_clock) as store:
        keys = PurgeKeys(t0)
        keys.write(store)  # the first write purged (nothing); the next is due in an interval
        inside = keys.lock + skew - EPSILON

        purge_clock.advance(PURGE_INTERVAL)
        store.claim(claim_request("other-1", inside, skew=skew))
        assert store.get("expired") is None  # the purge ran
        assert stored(store, "dead").status is Status.IN_PROGRESS
        _late_claim_is_held_and_the_owner_completes(store, keys, inside, skew)

        purge_clock.advance(PURGE_INTERVAL)
        store.claim(claim_request("other-2", keys.lock + skew, skew=skew))
        assert store.get("dead") is None  # past the margin, the purge drops it
        assert stored(store, "live").owner == keys.live.owner


def test_sqlite_purge_after_a_completion_keeps_an_in_progress_claim_inside_the_margin(
    tmp_path: Path, t0: float
) -> None:
    skew = DEFAULT_CLOCK_SKEW_SECONDS
    purge_clock = FakeClock(t0)
    path = tmp_path / "purge.sqlite3"
    with SQLiteStore(path, purge_interval_seconds=PURGE_INTERVAL, clock=purge_clock) as store:
        keys = PurgeKeys(t0)
        keys.write(store)
        inside = keys.lock + skew - EPSILON
        other = claim_request("other", inside, skew=skew)
        store.claim(other)

        # Another host, its clock inside the margin past the lock, completes its own key.
        purge_clock.advance(PURGE_INTERVAL)
        assert store.complete(completion(other, inside)) is True
        assert store.get("expired") is None  # the purge ran
        assert store.get("live") is not None, "the live owner's claim was purged"
        _late_claim_is_held_and_the_owner_completes(store, keys, inside, skew)


# --- 2. two doors over HTTP, on clocks that disagree --------------------------------------

DOOR_PAIRS: list[tuple[Adapter, Adapter]] = [("asgi", "wsgi"), ("wsgi", "asgi")]
ORDER = {"item": "book"}
AHEAD = 0.5  # door B's first retry: at A's lock + this, by B's clock


def pair_id(pair: tuple[Adapter, Adapter]) -> str:
    return f"A-{pair[0]}-B-{pair[1]}"


class TwoDoors:
    """Door A (frozen clock) and door B (its clock at A's lock + ``AHEAD``), one app state
    (one call counter for both), one store's records."""

    def __init__(self, stack: contextlib.ExitStack, store_a: Any, store_b: Any) -> None:
        self.state = AppState()
        self.clock_a = FakeClock()
        self.claimed_at = self.clock_a.now()  # A's claim: A's clock never moves
        self.lock = self.claimed_at + LOCK
        self.clock_b = FakeClock(self.lock + AHEAD)
        self.events_a = Events()
        self.events_b = Events()
        self.store_a = store_a
        self.store_b = store_b
        self._stack = stack

    def open(self, pair: tuple[Adapter, Adapter], b_skew: float) -> tuple[str, str]:
        common = {"lock_timeout_seconds": LOCK}
        url_a = self._stack.enter_context(
            serve_door(
                pair[0],
                self.state,
                self.store_a,
                clock=self.clock_a,
                on_event=self.events_a,
                **common,
            )
        )
        url_b = self._stack.enter_context(
            serve_door(
                pair[1],
                self.state,
                self.store_b,
                clock=self.clock_b,
                on_event=self.events_b,
                clock_skew_seconds=b_skew,
                **common,
            )
        )
        return url_a, url_b

    def client(self, url: str) -> httpx.Client:
        client = httpx.Client(base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS)
        self._stack.callback(client.close)
        return client

    def a_holds(self, url_a: str, key: str) -> tuple[threading.Event, Future[httpx.Response]]:
        """Door A's request for ``key``, its handler running (blocked at a gate); the gate
        and the future of A's response."""
        gate = self.state.arm_gate()
        pool = ThreadPoolExecutor(max_workers=1)
        self._stack.callback(pool.shutdown)
        self._stack.callback(gate.set)  # (a failing test must not leave A's handler blocked)
        future = pool.submit(
            self.client(url_a).post, "/slow", json=ORDER, headers={"Idempotency-Key": key}
        )
        assert self.state.wait_for_calls(POST_SLOW, 1), "door A's handler did not start"
        return gate, future

    def assert_a_still_holds(self) -> None:
        """A's record: its owner's, in progress, its lock where A's claim put it (A's lease
        renewals, due by A's frozen clock, never moved it)."""
        claimed = [event.key_hash for event in self.events_a.of("claimed")]
        assert len(claimed) == 1, self.events_a.kinds()
        record = self.store_a.get(claimed[0])
        assert record is not None
        assert record.status is Status.IN_PROGRESS
        assert record.lock_expires_at == self.lock


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as opened:
        yield opened


@pytest.fixture(params=SHARED_KINDS)
def doors(request: pytest.FixtureRequest, stack: contextlib.ExitStack, tmp_path: Path) -> TwoDoors:
    kind: SharedKind = request.param
    # Entered first, so the stores close after the servers that use them stop.
    store_a, store_b = stack.enter_context(shared_stores(kind, tmp_path))
    return TwoDoors(stack, store_a, store_b)


@pytest.mark.parametrize("pair", DOOR_PAIRS, ids=pair_id)
def test_door_ahead_by_less_than_the_margin_gets_409_and_takes_over_a_second_later(
    doors: TwoDoors, pair: tuple[Adapter, Adapter]
) -> None:
    url_a, url_b = doors.open(pair, DEFAULT_CLOCK_SKEW_SECONDS)
    client_b = doors.client(url_b)
    key = new_key()
    gate, first = doors.a_holds(url_a, key)
    doors.assert_a_still_holds()

    # B's clock says A's lock expired 0.5 s ago: inside the margin, A may be alive.
    early = client_b.post("/slow", json=ORDER, headers={"Idempotency-Key": key})
    assert_problem(early, 409)
    assert doors.state.calls(POST_SLOW) == 1
    doors.assert_a_still_holds()

    # 1 s after A's lock by B's clock: an owner that is still silent is taken over.
    doors.clock_b.advance(DEFAULT_CLOCK_SKEW_SECONDS - AHEAD)
    takeover = client_b.post("/slow", json=ORDER, headers={"Idempotency-Key": key})
    assert takeover.status_code == 201, takeover.text
    assert takeover.json()["call"] == 2
    assert doors.events_b.kinds().count("taken_over") == 1

    gate.set()
    late = first.result(timeout=CLIENT_TIMEOUT_SECONDS)
    assert late.status_code == 201
    assert late.json()["call"] == 1
    assert "lost" in doors.events_a.kinds()  # A's completion was fenced out
    replay = doors.client(url_a).post("/slow", json=ORDER, headers={"Idempotency-Key": key})
    assert replayed(replay), replay.text
    assert replay.json()["call"] == 2
    assert doors.state.calls(POST_SLOW) == 2


@pytest.mark.parametrize("pair", DOOR_PAIRS, ids=pair_id)
def test_without_a_margin_a_door_ahead_takes_over_a_live_owner(
    doors: TwoDoors, pair: tuple[Adapter, Adapter]
) -> None:
    # The hazard the margin prevents: B's clock is 0.5 s past A's lock while A, by its own
    # clock, is well inside it; with clock_skew_seconds=0 B runs the handler a second time.
    url_a, url_b = doors.open(pair, 0.0)
    key = new_key()
    gate, first = doors.a_holds(url_a, key)
    doors.assert_a_still_holds()

    early = doors.client(url_b).post("/slow", json=ORDER, headers={"Idempotency-Key": key})
    assert early.status_code == 201, early.text
    assert early.json()["call"] == 2
    assert doors.events_b.kinds().count("taken_over") == 1

    gate.set()
    assert first.result(timeout=CLIENT_TIMEOUT_SECONDS).json()["call"] == 1
    assert doors.state.calls(POST_SLOW) == 2


# --- 3. idempotent functions on two clocks -------------------------------------------------

FUNCTION_NAME = "tests.e2e.test_clock_skew.charge"


@pytest.fixture(params=STORE_KINDS)
def fstore(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
    yield from open_function_store(request, request.param)


class Charges:
    """One function as door A (the store's clock, frozen) and door B (its own clock, at A's
    lock + ``AHEAD``) run it: one name, so one key per order; each door's run answers its
    own name, and ``runs`` lists every run that finished, of either door."""

    def __init__(self, fstore: FunctionStore, b_skew: float) -> None:
        self.runs: list[str] = []
        self.hold = fstore.hold()  # door A's run waits here (B's runs pass)
        self.lock = fstore.clock.now() + LOCK
        self.clock_b = FakeClock(self.lock + AHEAD)

        def charge_a(order: str) -> str:
            self.runs.append("A")
            return "A"

        def charge_b(order: str) -> str:
            self.runs.append("B")
            return "B"

        self.a = fstore.decorate(
            hold=self.hold, key="order", name=FUNCTION_NAME, lock_timeout_seconds=LOCK
        )(charge_a)
        self.b = idempotent(
            store=fstore.store,
            key="order",
            name=FUNCTION_NAME,
            lock_timeout_seconds=LOCK,
            clock=self.clock_b,
            clock_skew_seconds=b_skew,
        )(fstore.adapt(charge_b))


def test_function_on_a_clock_ahead_by_less_than_the_margin_waits_for_it(
    fstore: FunctionStore,
) -> None:
    charges = Charges(fstore, DEFAULT_CLOCK_SKEW_SECONDS)
    order = new_key()
    first = fstore.start(charges.a, order)
    fstore.wait_until(charges.hold.entered.is_set, "door A's call to start")

    with pytest.raises(KeyInProgressError):
        fstore.run(charges.b, order)
    assert charges.runs == []

    charges.clock_b.advance(DEFAULT_CLOCK_SKEW_SECONDS - AHEAD)
    assert fstore.run(charges.b, order) == "B"  # taken over, 1 s after A's lock

    charges.hold.open()
    assert first.result() == "A"
    assert fstore.run(charges.b, order) == "B"  # B's stored result: A's was fenced out
    assert charges.runs == ["B", "A"]


def test_function_on_a_clock_ahead_without_a_margin_takes_over_early(
    fstore: FunctionStore,
) -> None:
    charges = Charges(fstore, 0.0)
    order = new_key()
    first = fstore.start(charges.a, order)
    fstore.wait_until(charges.hold.entered.is_set, "door A's call to start")

    assert fstore.run(charges.b, order) == "B"  # A is running: the work runs twice
    charges.hold.open()
    assert first.result() == "A"
    assert charges.runs == ["B", "A"]


# --- 4. validation ------------------------------------------------------------------------


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("never called")


def wsgi_app(environ: Environ, start_response: StartResponse) -> list[bytes]:
    raise AssertionError("never called")


def build_asgi(**options: Any) -> float:
    middleware = IdempotencyMiddleware(asgi_app, store=MemoryStore(), **options)
    return middleware.options.default_policy.clock_skew_seconds


def build_wsgi(**options: Any) -> float:
    middleware = IdempotencyWSGIMiddleware(wsgi_app, store=MemoryStore(), **options)
    return middleware.options.default_policy.clock_skew_seconds


class ClaimsSeen(MemoryStore):
    """A ``MemoryStore`` keeping the margin every claim carried."""

    def __init__(self) -> None:
        super().__init__()
        self.skews: list[float] = []

    def claim(self, request: ClaimRequest) -> ClaimResult:
        self.skews.append(request.clock_skew_seconds)
        return super().claim(request)


def build_function(**options: Any) -> float:
    store = ClaimsSeen()

    def f(key: str) -> int:
        return 7

    decorated = idempotent(store=store, key="key", **options)(f)
    assert decorated("k") == 7
    assert len(store.skews) == 1
    return store.skews[0]


DOORS = [build_asgi, build_wsgi, build_function]
BAD_SKEWS = [-1, -0.001, math.inf, -math.inf, math.nan, True, False, "1", None]


@pytest.mark.parametrize("build", DOORS, ids=lambda build: build.__name__)
@pytest.mark.parametrize("bad", BAD_SKEWS, ids=repr)
def test_clock_skew_seconds_must_be_a_non_negative_finite_number(build: Any, bad: Any) -> None:
    with pytest.raises(ValueError, match="clock_skew_seconds"):
        build(clock_skew_seconds=bad)


@pytest.mark.parametrize("build", DOORS, ids=lambda build: build.__name__)
@pytest.mark.parametrize("good", [0, 0.0, 2, 2.5], ids=repr)
def test_clock_skew_seconds_of_zero_or_more_is_accepted(build: Any, good: float) -> None:
    assert build(clock_skew_seconds=good) == good


@pytest.mark.parametrize("build", DOORS, ids=lambda build: build.__name__)
def test_clock_skew_seconds_defaults_to_one_second(build: Any) -> None:
    assert DEFAULT_CLOCK_SKEW_SECONDS == 1.0
    assert build() == 1.0
