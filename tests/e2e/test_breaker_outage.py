"""The circuit breaker during a real outage, through every door that uses a DynamoDB store:
the ASGI middleware on uvicorn with ``AsyncDynamoDBStore``, the WSGI middleware on waitress
with ``DynamoDBStore``, and ``idempotent`` on both stores (the async one on an event loop of
its own); then ``SQLiteStore`` with a file that is not a database; then DynamoDB's
``ReplicatedWriteConflictException``, which must not count.

The DynamoDB stores talk to moto through ``FaultProxy`` in ``hang`` mode: every request is
read and never answered, so each call fails after the store's read timeout (one attempt per
call, short timeouts, to keep the test fast). The breaker's cool-down runs on the store's
``clock=`` (a ``FakeClock`` the test advances). The door gets a ``FakeClock`` of its own: a
claim that failed is followed by a background release of the claim in case it landed
(``flow.release_lost_claim``, five tries at growing delays), and a fake clock passes those
delays at once, so its calls are over in a few read timeouts instead of seconds.

Those releases are store calls too, and their failures count. That is why the threshold
here is 2: the first claim's release starts when the first request has its 503, and fails a
whole read timeout later, so the second request's claim is always sent (and counted) before
it; with a larger threshold the releases' failures would open the breaker before the
threshold-th request, which is by design (an outage is an outage) but not what this test
shows. Counting exactly ``threshold`` failures is tests/unit/test_breaker.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import orjson
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    SQLiteStore,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.engine.decisions import LOST_CLAIM_RELEASE_DELAYS
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.breaker import BreakerOwner, BreakerState
from idempotency_middleware.stores.protocol import ClaimRequest
from idempotency_middleware.testing import FakeClock
from tests.conftest import new_table
from tests.support.faultproxy import (
    CLIENT_TIMEOUT_SECONDS,
    INTERNAL_SERVER_ERROR,
    REGION,
    REPLICATED_WRITE_CONFLICT,
    Events,
    FaultProxy,
    Served,
    serve_workload,
    wait_until,
)

T = TypeVar("T")

DoorKind = Literal["asgi", "wsgi", "async-function", "sync-function"]
DOORS: tuple[DoorKind, ...] = ("asgi", "wsgi", "async-function", "sync-function")
HTTP_DOORS: tuple[DoorKind, ...] = ("asgi", "wsgi")

PATH = "/ok"
THRESHOLD = 2
COOLDOWN_SECONDS = 30.0
READ_TIMEOUT_SECONDS = 0.5
# aiohttp's timers may fire up to the event loop's clock resolution early.
TIMER_TOLERANCE_SECONDS = 0.05
ONE_ATTEMPT: dict[str, Any] = {
    "connect_timeout": READ_TIMEOUT_SECONDS,
    "read_timeout": READ_TIMEOUT_SECONDS,
    "max_attempts": 1,
}
# After the last lost-claim release was sent to the hanging proxy, how long its read timeout
# gets to fire (a real socket timeout: no fake clock reaches it), with room for a loaded
# machine.
DRAIN_SLACK_SECONDS = 1.0


@pytest.fixture(scope="module")
def dynamodb_table(moto_endpoint: str) -> str:
    return new_table(moto_endpoint, "breaker")


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:
    return fault_proxy


def state(store: BreakerOwner) -> BreakerState:
    """The store's breaker state, read afresh (a function: mypy does not narrow it)."""
    return store.breaker_state


def unique_key(label: str) -> str:
    return f"{label}-{time.time_ns()}"


# --- one interface to every door -------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one call through a door came to."""

    ok: bool  # the handler ran or was replayed
    elapsed: float
    cause: str | None = None  # the store failure's, when not ok
    retry_after: int | None = None
    key_hash: str = ""  # the failed claim's (from its store_error event)
    error: str | None = None  # the store_error event's
    run: int | None = None  # the run that answered, when ok
    replayed: bool = False


class Door:
    """A covered call through one door, on a store whose breaker the test watches."""

    kind: DoorKind
    events: Events
    store: DynamoDBStore | AsyncDynamoDBStore | SQLiteStore

    @property
    def http(self) -> bool:
        return self.kind in HTTP_DOORS

    def call(self, key: str) -> Outcome:
        raise NotImplementedError

    def runs(self) -> int:
        raise NotImplementedError

    def _failure(self, elapsed: float, retry_after: int | None, before: int) -> Outcome:
        """The outcome of a call that failed on its claim: its one new store_error event."""
        claims = self.events.of("store_error", "claim")
        assert len(claims) == before + 1, "one store_error event per failed claim"
        event = claims[-1]
        return Outcome(
            False,
            elapsed,
            cause=event.cause,
            retry_after=retry_after,
            key_hash=event.key_hash,
            error=event.error,
        )


class HTTPDoor(Door):
    def __init__(self, kind: DoorKind, served: Served, store: Any) -> None:
        self.kind = kind
        self.served = served
        self.events = served.events
        self.store = store

    def call(self, key: str) -> Outcome:
        before = len(self.events.of("store_error", "claim"))
        started = time.monotonic()
        response = self.served.post(PATH, key)
        elapsed = time.monotonic() - started
        if response.status_code == 503:
            assert response.headers["content-type"] == "application/problem+json"
            problem = orjson.loads(response.content)
            assert problem["status"] == 503
            assert key not in problem["detail"]
            return self._failure(elapsed, int(response.headers["retry-after"]), before)
        assert response.status_code == 201, response.text
        return Outcome(
            True,
            elapsed,
            run=response.json()["run"],
            replayed=response.headers.get("idempotent-replayed") == "true",
        )

    def runs(self) -> int:
        return self.served.workload.runs(PATH)


class LoopThread:
    """An event loop running in a thread of its own: the async function's (and its store's
    client's) loop, driven from the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="breaker-loop")
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def on_the_loop() -> T:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(on_the_loop(), self.loop)
        return future.result(CLIENT_TIMEOUT_SECONDS)

    def close(self) -> None:
        async def cancel_the_rest() -> None:
            current = asyncio.current_task()
            rest = [task for task in asyncio.all_tasks() if task is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.run(cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class FunctionDoor(Door):
    """``idempotent`` on a sync function (``DynamoDBStore``) or a coroutine function
    (``AsyncDynamoDBStore``, called on ``loop``)."""

    def __init__(
        self, kind: DoorKind, store: Any, clock: FakeClock, loop: LoopThread | None
    ) -> None:
        self.kind = kind
        self.store = store
        self.events = Events()
        self._loop = loop
        self._runs = 0
        decorate = idempotent(store=store, key="order", on_event=self.events, clock=clock)

        def charge(order: str) -> dict[str, int]:
            self._runs += 1
            return {"run": self._runs}

        async def acharge(order: str) -> dict[str, int]:
            return charge(order)

        if loop is None:
            self._charge = decorate(charge)
        else:
            self._acharge = decorate(acharge)

    def _invoke(self, key: str) -> dict[str, int]:
        if self._loop is None:
            return self._charge(key)
        return self._loop.run(self._acharge(key))

    def call(self, key: str) -> Outcome:
        before = len(self.events.of("store_error", "claim"))
        replays = len(self.events.of("replayed"))
        started = time.monotonic()
        try:
            result = self._invoke(key)
        except StoreUnavailableError as error:
            failed = self._failure(time.monotonic() - started, error.retry_after, before)
            assert failed.cause == error.cause
            return failed
        elapsed = time.monotonic() - started
        replayed = len(self.events.of("replayed")) == replays + 1
        return Outcome(True, elapsed, run=result["run"], replayed=replayed)

    def warm_up(self) -> None:
        """One call with the store answering, so its client exists before the test."""
        outcome = self.call(unique_key("warm-up"))
        assert outcome.ok, outcome
        self._runs = 0
        self.events.clear()

    def runs(self) -> int:
        return self._runs


@contextlib.contextmanager
def door_of(
    kind: DoorKind,
    table: str,
    proxy: FaultProxy,
    store_kwargs: dict[str, Any],
    door_clock: FakeClock | None = None,
) -> Iterator[Door]:
    """A door of ``kind`` on its DynamoDB store at ``proxy``, warmed up; the proxy forgets
    the warm-up. ``door_clock``: the door's clock (the system clock by default)."""
    arguments: dict[str, Any] = {"endpoint_url": proxy.url, "region_name": REGION}
    arguments.update(store_kwargs)
    options: dict[str, Any] = {} if door_clock is None else {"clock": door_clock}
    if kind == "asgi":
        async_store = AsyncDynamoDBStore(table, **arguments)
        with serve_workload(kind, async_store, on_shutdown=async_store.aclose, **options) as s:
            proxy.forget()
            yield HTTPDoor(kind, s, async_store)
    elif kind == "wsgi":
        with (
            DynamoDBStore(table, **arguments) as sync_store,
            serve_workload(kind, sync_store, **options) as served,
        ):
            proxy.forget()
            yield HTTPDoor(kind, served, sync_store)
    elif kind == "sync-function":
        with DynamoDBStore(table, **arguments) as sync_store:
            door = FunctionDoor(kind, sync_store, door_clock or FakeClock(), None)
            door.warm_up()
            proxy.forget()
            yield door
    else:
        loop = LoopThread()
        try:
            async_store = AsyncDynamoDBStore(table, **arguments)
            door = FunctionDoor(kind, async_store, door_clock or FakeClock(), loop)
            try:
                door.warm_up()
                proxy.forget()
                yield door
            finally:
                loop.run(async_store.aclose())
        finally:
            loop.close()


def on_the_wire(proxy: FaultProxy, key_hash: str) -> list[str]:
    """The operations of the requests for ``key_hash`` that reached the proxy."""
    needle = key_hash.encode()
    return [seen.operation for seen in proxy.seen() if needle in seen.body]


def drain_lost_claim_releases(proxy: FaultProxy, key_hashes: list[str]) -> None:
    """Wait until the background releases of the failed claims are over: every one of their
    tries reached the hanging proxy, and the last one's read timeout has fired. (Once the
    store answers again, one still to come would close the breaker before the probe.)"""
    tries = len(LOST_CLAIM_RELEASE_DELAYS)

    def all_sent() -> bool:
        return all(on_the_wire(proxy, hashed).count("DeleteItem") == tries for hashed in key_hashes)

    wait_until(all_sent, 30, "the lost claims' releases did not all reach the proxy")
    last = max(seen.at for seen in proxy.seen() if seen.operation == "DeleteItem")
    settled = last + READ_TIMEOUT_SECONDS + DRAIN_SLACK_SECONDS
    wait_until(lambda: time.time() >= settled, 10, "unreachable: a deadline in the past")


# --- a hanging store, through every door -------------------------------------------------------


@pytest.mark.parametrize("kind", DOORS)
def test_a_hanging_store_opens_the_breaker_claims_fail_at_once_and_a_probe_closes_it(
    kind: DoorKind, proxy: FaultProxy, dynamodb_table: str
) -> None:
    store_clock = FakeClock()
    store_kwargs = {
        **ONE_ATTEMPT,
        "clock": store_clock,
        "breaker_threshold": THRESHOLD,
        "breaker_cooldown_seconds": COOLDOWN_SECONDS,
    }
    with door_of(kind, dynamodb_table, proxy, store_kwargs, FakeClock()) as door:
        proxy.set("hang")

        # The first THRESHOLD claims go to the store and wait out its read timeout.
        failed: list[str] = []
        for number in range(THRESHOLD):
            outcome = door.call(unique_key(f"hang-{number}"))
            assert not outcome.ok
            assert outcome.cause == "timed_out"
            assert outcome.elapsed >= READ_TIMEOUT_SECONDS - TIMER_TOLERANCE_SECONDS
            # The failure that opens the breaker (this claim's, or a background release's
            # of a claim that may have landed) is told the cool-down; others the usual.
            assert outcome.retry_after in (1 if door.http else None, math.ceil(COOLDOWN_SECONDS))
            assert on_the_wire(proxy, outcome.key_hash)[0] == "PutItem"
            failed.append(outcome.key_hash)
        assert state(door.store) == "open"
        [opened] = door.events.of("breaker_open")
        assert opened.cause == "timed_out"
        assert (opened.key_hash, opened.method, opened.route) == ("", "", "")
        claims_sent = proxy.operations().count("PutItem")
        assert claims_sent == THRESHOLD

        # Open: refused at once, with no store call; the handler never runs.
        refused: list[str] = []
        for number in range(3):
            key = unique_key(f"refused-{number}")
            outcome = door.call(key)
            assert not outcome.ok
            assert outcome.cause == "breaker_open"
            assert outcome.retry_after == math.ceil(COOLDOWN_SECONDS)
            # "At once" is shown on the wire (below: nothing sent for its key), not by a
            # wall-clock bound: under coverage at a load of 6 a refused WSGI request, the
            # breaker's background probe waiting on the hanging store beside it, took 1.1 s.
            assert outcome.error is not None and "circuit breaker" in outcome.error
            assert on_the_wire(proxy, outcome.key_hash) == []  # nor a release: none was sent
            refused.append(key)
        assert proxy.operations().count("PutItem") == claims_sent
        assert door.runs() == 0
        assert len(door.events.of("breaker_open")) == 1

        # The cool-down passes on the store's clock: the next claim is the probe. The store
        # still hangs, so the probe fails and the breaker opens for another cool-down.
        store_clock.advance(COOLDOWN_SECONDS)
        probe = door.call(unique_key("failed-probe"))
        assert probe.cause == "timed_out"
        assert probe.elapsed >= READ_TIMEOUT_SECONDS - TIMER_TOLERANCE_SECONDS
        assert on_the_wire(proxy, probe.key_hash)[0] == "PutItem"
        failed.append(probe.key_hash)
        assert state(door.store) == "open"
        assert len(door.events.of("breaker_open")) == 2
        again = door.call(unique_key("after-the-failed-probe"))
        assert again.cause == "breaker_open"
        assert again.retry_after == math.ceil(COOLDOWN_SECONDS)
        assert on_the_wire(proxy, again.key_hash) == []
        assert door.runs() == 0

        # The store is back. Nothing closes the breaker until the store answers a call: the
        # probe, after the next cool-down.
        drain_lost_claim_releases(proxy, failed)
        proxy.set("pass")
        assert state(door.store) == "open"
        store_clock.advance(COOLDOWN_SECONDS)
        key = unique_key("recovered")
        first = door.call(key)
        assert first.ok and first.run == 1
        assert state(door.store) == "closed"
        replay = door.call(key)
        assert replay.ok and replay.replayed and replay.run == 1
        assert door.runs() == 1
        # A key the breaker refused was never claimed: its retry runs now, once.
        retried = door.call(refused[0])
        assert retried.ok and retried.run == 2 and not retried.replayed

        kinds = [(at, event.kind) for at, event in door.events.timed("breaker_open")]
        kinds += [(at, event.kind) for at, event in door.events.timed("breaker_closed")]
        assert [kind for _, kind in sorted(kinds)] == [
            "breaker_open",
            "breaker_open",
            "breaker_closed",
        ]
        [closed] = door.events.of("breaker_closed")
        assert closed.cause is None
        assert (closed.key_hash, closed.method, closed.route) == ("", "", "")


@pytest.mark.parametrize("kind", HTTP_DOORS)
def test_with_the_breaker_off_every_claim_waits_out_the_hanging_store(
    kind: DoorKind, proxy: FaultProxy, dynamodb_table: str
) -> None:
    """``breaker_threshold=0``: the behaviour without a breaker, for contrast."""
    store_kwargs = {**ONE_ATTEMPT, "breaker_threshold": 0}
    with door_of(kind, dynamodb_table, proxy, store_kwargs, FakeClock()) as door:
        proxy.set("hang")
        for number in range(THRESHOLD + 2):
            outcome = door.call(unique_key(f"off-{number}"))
            assert outcome.cause == "timed_out"
            assert outcome.elapsed >= READ_TIMEOUT_SECONDS - TIMER_TOLERANCE_SECONDS
        assert state(door.store) == "closed"
        assert not door.events.of("breaker_open")
        assert proxy.operations().count("PutItem") == THRESHOLD + 2
        # The store is back for the background releases of the claims that may have landed,
        # so that an ASGI server stops without waiting out their tries against the hang.
        proxy.set("pass")


# --- SQLite: a file that is not a database -------------------------------------------------------

NOT_A_DATABASE = b"this file is not an SQLite database\n" * 128


def _sqlite_claim(key: str) -> ClaimRequest:
    return ClaimRequest(key, "fingerprint", "owner", time.time(), 30.0)


def test_sqlite_a_file_that_is_not_a_database_is_an_outage_and_the_open_breaker_leaves_it_alone(
    tmp_path: Path,
) -> None:
    """SQLITE_NOTADB is cause ``io_error``: it counts. While open, a claim does not even open
    the file: deleted meanwhile, it is not created again until the probe."""
    path = tmp_path / "idempotency.sqlite3"
    path.write_bytes(NOT_A_DATABASE)
    clock = FakeClock()
    store = SQLiteStore(
        str(path), clock=clock, breaker_threshold=THRESHOLD, breaker_cooldown_seconds=10.0
    )
    try:
        for number in range(THRESHOLD):
            assert state(store) == "closed"
            with pytest.raises(StoreUnavailableError) as failed:
                store.claim(_sqlite_claim(f"k{number}"))
            assert failed.value.cause == "io_error"
        assert state(store) == "open"

        path.unlink()  # fixed: the next connection makes a fresh database
        with pytest.raises(StoreUnavailableError) as refused:
            store.claim(_sqlite_claim("k-refused"))
        assert refused.value.cause == "breaker_open"
        assert refused.value.retry_after == 10
        assert isinstance(refused.value.__cause__, StoreUnavailableError)
        assert refused.value.__cause__.cause == "io_error"
        assert not path.exists(), "the refused claim opened the database"

        clock.advance(10.0)
        store.claim(_sqlite_claim("k-probe"))
        assert path.exists()
        assert state(store) == "closed"
    finally:
        store.close()


def test_sqlite_a_failed_probe_opens_it_again(tmp_path: Path) -> None:
    path = tmp_path / "idempotency.sqlite3"
    path.write_bytes(NOT_A_DATABASE)
    clock = FakeClock()
    store = SQLiteStore(str(path), clock=clock, breaker_threshold=1, breaker_cooldown_seconds=5.0)
    try:
        with pytest.raises(StoreUnavailableError):
            store.claim(_sqlite_claim("k"))
        clock.advance(5.0)
        with pytest.raises(StoreUnavailableError) as probe:
            store.claim(_sqlite_claim("k"))
        assert probe.value.cause == "io_error"
        assert probe.value.retry_after == 5  # reopened: the new cool-down
        assert state(store) == "open"
        clock.advance(4.0)
        with pytest.raises(StoreUnavailableError) as refused:
            store.claim(_sqlite_claim("k"))
        assert refused.value.retry_after == 1
    finally:
        store.close()


@pytest.mark.parametrize("adapter", HTTP_DOORS)
def test_sqlite_through_the_middleware_503_at_once_with_retry_after_then_recovers(
    adapter: Literal["asgi", "wsgi"], tmp_path: Path
) -> None:
    path = tmp_path / "idempotency.sqlite3"
    path.write_bytes(NOT_A_DATABASE)
    store_clock = FakeClock()
    store = SQLiteStore(
        str(path),
        clock=store_clock,
        breaker_threshold=1,
        breaker_cooldown_seconds=COOLDOWN_SECONDS,
    )
    try:
        # (No warm-up: the store cannot answer one.)
        with serve_workload(adapter, store, warm_up=False, clock=FakeClock()) as served:
            door = HTTPDoor(adapter, served, store)
            first = door.call(unique_key("sqlite"))
            assert first.cause == "io_error"
            # The request whose failure opened the breaker is told the whole cool-down.
            assert first.retry_after == math.ceil(COOLDOWN_SECONDS)
            assert state(store) == "open"
            [opened] = served.events.of("breaker_open")
            assert opened.cause == "io_error"

            refused_key = unique_key("sqlite-refused")
            refused = door.call(refused_key)
            assert refused.cause == "breaker_open"
            assert refused.retry_after == math.ceil(COOLDOWN_SECONDS)
            assert refused.key_hash == storage_key("POST", PATH, None, refused_key)
            assert door.runs() == 0

            # The first request's background releases of its claim (one per delay, each
            # failing on the broken file; the door's fake clock sleeps at once) must be over
            # before the file is fixed: one failing late would open the breaker again after
            # the probe closed it. Every one of them is counted, open or not.
            failures = 1 + len(LOST_CLAIM_RELEASE_DELAYS)
            wait_until(
                lambda: store.breaker._failures == failures,
                10,
                "the lost claim's background releases did not all fail",
            )
            path.unlink()
            store_clock.advance(COOLDOWN_SECONDS)
            recovered = door.call(refused_key)
            assert recovered.ok and recovered.run == 1
            assert state(store) == "closed"
            assert len(served.events.of("breaker_open")) == 1
            assert len(served.events.of("breaker_closed")) == 1
    finally:
        store.close()


# --- ReplicatedWriteConflictException: contention, not an outage ----------------------------------

# Short timeouts, and botocore's default two attempts: it retries a write conflict itself.
TWO_ATTEMPTS: dict[str, Any] = {"connect_timeout": 1.0, "read_timeout": 1.0, "max_attempts": 2}


@pytest.mark.parametrize(
    ("status", "code", "cause", "opens"),
    [
        pytest.param(
            409,
            REPLICATED_WRITE_CONFLICT,
            "write_conflict",
            False,
            id="write-conflict-409",
        ),
        pytest.param(
            400,
            REPLICATED_WRITE_CONFLICT,
            "write_conflict",
            False,
            id="write-conflict-400",
        ),
        # The same answer as an outage, for contrast: it opens a breaker of threshold 1.
        pytest.param(500, INTERNAL_SERVER_ERROR, "server_error", True, id="server-error"),
    ],
)
@pytest.mark.parametrize("kind", DOORS)
def test_a_claim_refused_for_a_write_conflict_is_retried_then_unavailable_without_opening(
    kind: DoorKind,
    status: int,
    code: str,
    cause: str,
    opens: bool,
    proxy: FaultProxy,
    dynamodb_table: str,
) -> None:
    store_kwargs = {**TWO_ATTEMPTS, "breaker_threshold": 1}
    with door_of(kind, dynamodb_table, proxy, store_kwargs) as door:
        proxy.set("error", error_status=status, error_code=code)
        key = unique_key("conflict")
        outcome = door.call(key)
        assert not outcome.ok
        assert outcome.cause == cause
        assert outcome.error is not None and code in outcome.error
        if opens:  # the failure that opens the breaker is told its cool-down (default 5 s)
            assert outcome.retry_after == 5
        else:
            assert outcome.retry_after == (1 if door.http else None)
        # botocore retried it: both attempts reached the wire.
        assert on_the_wire(proxy, outcome.key_hash)[:2] == ["PutItem", "PutItem"]
        assert proxy.operations().count("PutItem") == TWO_ATTEMPTS["max_attempts"]
        assert door.runs() == 0
        if opens:
            assert state(door.store) == "open"
            assert len(door.events.of("breaker_open")) == 1
            return
        assert state(door.store) == "closed"
        assert not door.events.of("breaker_open")

        # The conflict is over: the same key runs, once.
        proxy.set("pass")
        retry = door.call(key)
        assert retry.ok and retry.run == 1
        assert state(door.store) == "closed"


def test_the_proxy_answers_a_write_conflict_as_dynamodb_does(proxy: FaultProxy) -> None:
    """The canned answer, as botocore parses it: the code is the ``__type`` after the '#'."""
    proxy.set("error", error_status=409, error_code=REPLICATED_WRITE_CONFLICT)
    response = httpx.post(
        proxy.url,
        content=b"{}",
        headers={"X-Amz-Target": "DynamoDB_20120810.PutItem"},
        trust_env=False,
    )
    assert response.status_code == 409
    assert response.json() == {
        "__type": f"com.amazonaws.dynamodb.v20120810#{REPLICATED_WRITE_CONFLICT}",
        "message": "One or more items in this request are being modified by a request in "
        "another Region.",
    }
    assert proxy.operations() == ["PutItem"]


@pytest.mark.parametrize("kind", DOORS)
def test_a_completion_refused_once_for_a_write_conflict_is_retried_and_lands(
    kind: DoorKind, proxy: FaultProxy, dynamodb_table: str
) -> None:
    """One attempt per call, so the retry is the finishing retries', not botocore's."""
    store_kwargs = {**ONE_ATTEMPT, "read_timeout": 2.0, "breaker_threshold": 1}
    with door_of(kind, dynamodb_table, proxy, store_kwargs) as door:
        proxy.set(
            "error",
            operations={"UpdateItem"},
            count=1,
            error_status=409,
            error_code=REPLICATED_WRITE_CONFLICT,
        )
        key = unique_key("complete-conflict")
        first = door.call(key)
        assert first.ok and first.run == 1
        updates = [seen.fault for seen in proxy.seen() if seen.operation == "UpdateItem"]
        assert updates == ["error", "pass"]
        assert not door.events.of("store_error")
        assert len(door.events.of("completed")) == 1
        assert state(door.store) == "closed"

        replay = door.call(key)
        assert replay.ok and replay.replayed and replay.run == 1
        assert door.runs() == 1
