"""``wait_seconds``: a duplicate of a running attempt waits for its outcome instead of 409.

1. The engine on a ``FakeClock``: the waiter's polls (their spacing, backoff and jitter),
   how a wait ends (time up, replay, the first released or died, a mismatch, a failed poll),
   and the option's validation. Attempts run through the real ``SyncDriver`` on a
   ``MemoryStore`` behind a wrapper that logs every claim (``tests/support/wait_apps.py``).
2. ``idempotent`` with threads and tasks, on ``MemoryStore`` and ``SQLiteStore``.
3. Over HTTP: uvicorn (``IdempotencyMiddleware``) and waitress (``IdempotencyWSGIMiddleware``)
   on 127.0.0.1, the ASGI door also on ``AsyncDynamoDBStore`` on moto.
4. A waiter whose client disconnects stops waiting (uvicorn), and ``disconnect_waiter``.

A test that needs the duplicate to be waiting waits until the store has seen it poll (its
second claim), never for a length of time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    IdempotencyEvent,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    KeyInProgressError,
    KeyReusedError,
    MemoryStore,
    SQLiteStore,
    StoreUnavailable,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.clock import SYSTEM_CLOCK, Clock
from idempotency_middleware.engine import decisions, flow
from idempotency_middleware.engine.drivers import SyncDriver
from idempotency_middleware.engine.effects import Effect, Ran, Run, Wait
from idempotency_middleware.engine.renewal import ThreadRenewals
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS, Options
from idempotency_middleware.stores.protocol import CLAIMED, AsyncStore, ClaimRequest
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from idempotency_middleware.web.asgi_messages import Message, disconnect_waiter
from tests.conftest import REGION
from tests.support.attempts import BOOKKEEPING, order_attempt
from tests.support.servers import serve_asgi, serve_wsgi
from tests.support.wait_apps import (
    ClaimLog,
    CountingAsyncStore,
    CountingStore,
    Handler,
    SeenClaim,
    asgi_app,
    wsgi_app,
)

# The promise (README), written out rather than read from core: never two polls closer than
# 0.1 s (so at most 10 store calls a second), never more than 1 s apart.
MIN_POLL_GAP = 0.1
MAX_POLL_GAP = 1.0
EPSILON = 1e-6  # times are epoch floats (~1.7e9): their differences carry ~2e-7 of error
# ...for each step the fake clock took: every advance rounds the sum to a multiple of 2**-22
# s (the float spacing near 1.7e9), so a time reached in n steps is off by up to n/2 of it.
CLOCK_STEP_ERROR = 2.0**-22


def drift(steps: int) -> float:
    """The rounding a time reached in ``steps`` advances of the fake clock may carry."""
    return EPSILON + steps * CLOCK_STEP_ERROR


LOCK = 60.0
BODY = b'{"amount": 5}'
FIRST_HEADERS = [(b"content-type", b"application/json")]
FIRST_BODY = b'{"id": 1}'
WAITER_RAN = Ran(201, [(b"content-type", b"application/json")], b'{"id": "waiter"}')


# --- 1. the engine, on a fake clock ---------------------------------------------------------


def recording(running: flow.AttemptFlow, effects: list[Effect]) -> flow.AttemptFlow:
    """``running``, passed through effect by effect, each one appended to ``effects``."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = running.send(value) if error is None else running.throw(error)
        except StopIteration as stop:
            outcome: flow.Ending = stop.value
            return outcome
        if not isinstance(effect, BOOKKEEPING):  # events: the World's on_event records them
            effects.append(effect)
        value, error = None, None
        try:
            value = yield effect
        except GeneratorExit:
            running.close()
            raise
        except BaseException as raised:
            error = raised


class World:
    """One key, a first attempt holding it (claimed straight in the store, so the log sees
    only waiters), and waiters: attempts driven by the real ``SyncDriver`` on a FakeClock."""

    def __init__(
        self, *, wait_seconds: float, on_store_error: str = "fail", lock: float = LOCK
    ) -> None:
        self.clock = FakeClock()
        self.memory = MemoryStore(clock=self.clock)
        self.store = CountingStore(self.memory, self.clock)
        self.events: list[IdempotencyEvent] = []
        self.options = Options.build(
            lock_timeout_seconds=lock,
            wait_seconds=wait_seconds,
            on_store_error=on_store_error,
            on_event=self.events.append,
            clock=self.clock,
        )
        self.context = flow.Context.for_options(self.options, self.store)
        self.renewals = ThreadRenewals(self.store, self.context.reporter, self.clock)
        self.driver = SyncDriver(self.store, self.clock, self.renewals)
        self.first = self.new_attempt()
        self.runs = 0

    def new_attempt(self, body: bytes = BODY) -> decisions.Attempt:
        return order_attempt(self.options, self.clock.now(), body)

    def hold_first(self) -> None:
        assert self.memory.claim(self.first.claim._replace(now=self.clock.now())) == CLAIMED

    def complete_first(self) -> None:
        completion = decisions.completion_for(
            self.first, 201, FIRST_HEADERS, FIRST_BODY, self.clock.now()
        )
        assert self.memory.complete(completion)

    def release_first(self) -> None:
        assert self.memory.release(self.first.claim.key_hash, self.first.claim.owner)

    def wait(self, attempt: decisions.Attempt) -> tuple[flow.Ending, list[Effect]]:
        effects: list[Effect] = []

        def run() -> Ran:
            self.runs += 1
            return WAITER_RAN

        running = recording(flow.attempt(self.context, attempt), effects)
        return self.driver.drive(running, run), effects

    def claims_of(self, attempt: decisions.Attempt) -> list[SeenClaim]:
        return self.store.log.by(attempt.claim.owner)

    def event_kinds(self) -> list[str]:
        return [event.kind for event in self.events]


@pytest.fixture
def make_world() -> Iterator[Callable[..., World]]:
    worlds: list[World] = []

    def make(**options: Any) -> World:
        world = World(**options)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.renewals.close()


def gaps(claims: list[SeenClaim]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(claims)]


def waits(effects: list[Effect]) -> list[float]:
    return [effect.seconds for effect in effects if isinstance(effect, Wait)]


def test_a_long_wait_polls_at_least_0_1_s_apart_and_at_most_10_times_in_any_second(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()  # and it never finishes
    waiter = world.new_attempt()
    outcome, effects = world.wait(waiter)
    assert isinstance(outcome, decisions.Refusal)
    assert outcome._replace(held_until=None) == decisions.KEY_IN_PROGRESS
    claims = world.claims_of(waiter)
    assert all(claim.held for claim in claims)
    assert len(claims) == len(waits(effects)) + 1  # one claim, then a poll after every wait
    # Backed off to at most a second between polls: it polled all along, not once at the end.
    assert len(claims) >= 30
    assert min(gaps(claims)) >= MIN_POLL_GAP - EPSILON
    for claim in claims:
        in_one_second = [other for other in claims if claim.at <= other.at < claim.at + 1.0]
        assert len(in_one_second) <= 10, f"{len(in_one_second)} polls in the second at {claim.at}"
    assert not world.store.log.other_calls  # polls are claims only
    assert world.runs == 0


def test_the_poll_backoff_grows_from_0_1_0_2_s_to_at_most_1_s(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()
    waiter = world.new_attempt()
    world.wait(waiter)
    between = gaps(world.claims_of(waiter))
    assert 0.1 - EPSILON <= between[0] <= 0.2 + EPSILON
    assert max(between) <= MAX_POLL_GAP + EPSILON
    # Past the first few polls it has backed off to 0.5-1 s (the last pause may be cut to
    # the time left).
    backed_off = between[4:-1]
    assert backed_off
    assert all(0.5 - EPSILON <= gap <= 1.0 + EPSILON for gap in backed_off), backed_off


def test_two_waiters_poll_on_different_jittered_schedules(
    make_world: Callable[..., World],
) -> None:
    schedules = []
    for _ in range(2):
        world = make_world(wait_seconds=10)
        world.hold_first()
        waiter = world.new_attempt()
        world.wait(waiter)
        schedules.append(gaps(world.claims_of(waiter)))
    assert schedules[0] != schedules[1]
    # Jittered within one waiter too: once backed off, its pauses are not all equal.
    assert len({round(gap, 6) for gap in schedules[0][4:-1]}) > 1


def test_when_the_time_is_up_the_waiter_is_refused_409_with_retry_after(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()
    started = world.clock.now()
    waiter = world.new_attempt()
    outcome, effects = world.wait(waiter)
    assert isinstance(outcome, decisions.Refusal)
    assert outcome._replace(held_until=None) == decisions.KEY_IN_PROGRESS
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 409
    assert outcome.retry_after == 1
    claims = world.claims_of(waiter)
    # It waited its whole time (a last poll less than one interval before the end is
    # skipped), and not a moment longer.
    waited = claims[-1].at - started
    slack = drift(len(waits(effects)))
    assert 30 - MIN_POLL_GAP - slack <= waited <= 30 + slack
    assert math.isclose(sum(waits(effects)), waited, abs_tol=slack)
    assert world.event_kinds() == ["conflict"]
    assert world.events[0].status == 409
    record = world.memory.get(world.first.claim.key_hash)
    assert record is not None and record.owner == world.first.claim.owner
    assert world.runs == 0


def test_a_waiter_gets_the_replay_when_the_first_completes_mid_wait_and_calls_no_more(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()

    def first_completes(number: int, request: ClaimRequest) -> None:
        if number == 4:  # after three polls that found it running
            world.complete_first()

    world.store.before_claim = first_completes
    waiter = world.new_attempt()
    outcome, effects = world.wait(waiter)
    assert outcome == StoredResponse(201, FIRST_HEADERS, FIRST_BODY)
    assert [type(effect).__name__ for effect in effects] == [
        "ClaimRequest",
        "Wait",
        "ClaimRequest",
        "Wait",
        "ClaimRequest",
        "Wait",
        "ClaimRequest",
    ]
    claims = world.claims_of(waiter)
    assert len(claims) == 4 and claims[-1].held
    assert not world.store.log.other_calls
    assert world.event_kinds() == ["replayed"]
    assert world.runs == 0


def test_a_waiter_claims_and_runs_once_when_the_first_releases_the_key(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()

    def first_releases(number: int, request: ClaimRequest) -> None:
        if number == 3:
            world.release_first()  # it raised, or answered 5xx

    world.store.before_claim = first_releases
    waiter = world.new_attempt()
    outcome, effects = world.wait(waiter)
    assert outcome == WAITER_RAN
    assert world.runs == 1
    claims = world.claims_of(waiter)
    assert [claim.held for claim in claims] == [True, True, False]
    # Its lease counts from the poll that claimed it, not from its first claim.
    run = next(effect for effect in effects if isinstance(effect, Run))
    assert run.granted_at == claims[-1].at
    record = world.memory.get(waiter.claim.key_hash)
    assert record is not None and record.status is Status.COMPLETED
    assert record.owner == waiter.claim.owner
    assert record.response is not None and record.response.body == WAITER_RAN.body
    assert world.event_kinds() == ["claimed", "completed"]


def test_a_waiter_takes_a_dead_firsts_claim_over_when_its_lock_runs_out_mid_wait(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30, lock=5)
    world.hold_first()  # its owner died: the claim is never renewed
    started = world.clock.now()
    waiter = world.new_attempt()
    outcome, _ = world.wait(waiter)
    assert outcome == WAITER_RAN
    assert world.runs == 1
    claims = world.claims_of(waiter)
    taken = claims[-1]
    assert not taken.held
    # Taken over once the lock is stale by the default clock-skew margin.
    stale = 5 + DEFAULT_CLOCK_SKEW_SECONDS
    slack = drift(len(claims))
    assert stale - slack <= taken.at - started <= stale + MAX_POLL_GAP + slack
    assert world.event_kinds() == ["taken_over", "completed"]


def test_a_mismatched_fingerprint_is_answered_422_at_once_without_waiting(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()
    other = world.new_attempt(body=b'{"amount": 6}')
    outcome, effects = world.wait(other)
    assert outcome == decisions.KEY_REUSED
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 422
    assert [type(effect).__name__ for effect in effects] == ["ClaimRequest"]
    assert world.clock.slept == []
    assert world.event_kinds() == ["mismatch"]


def test_a_completed_key_is_replayed_at_once_without_waiting(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=30)
    world.hold_first()
    world.complete_first()
    outcome, effects = world.wait(world.new_attempt())
    assert outcome == StoredResponse(201, FIRST_HEADERS, FIRST_BODY)
    assert [type(effect).__name__ for effect in effects] == ["ClaimRequest"]
    assert world.clock.slept == []


def test_with_wait_seconds_0_a_duplicate_is_refused_409_at_once(
    make_world: Callable[..., World],
) -> None:
    world = make_world(wait_seconds=0)
    world.hold_first()
    outcome, effects = world.wait(world.new_attempt())
    assert isinstance(outcome, decisions.Refusal)
    assert outcome._replace(held_until=None) == decisions.KEY_IN_PROGRESS
    assert [type(effect).__name__ for effect in effects] == ["ClaimRequest"]
    assert world.clock.slept == []
    assert world.event_kinds() == ["conflict"]


@pytest.mark.parametrize("on_store_error", ["fail", "run"])
def test_a_poll_the_store_cannot_answer_ends_the_wait_with_503_never_running_unprotected(
    make_world: Callable[..., World], on_store_error: str
) -> None:
    world = make_world(wait_seconds=30, on_store_error=on_store_error)
    world.hold_first()

    def poll_fails(number: int, request: ClaimRequest) -> None:
        if number == 3:
            raise StoreUnavailable("connection refused (test)")

    world.store.before_claim = poll_fails
    waiter = world.new_attempt()
    outcome, effects = world.wait(waiter)
    assert isinstance(outcome, decisions.Refusal) and outcome.reason == "unavailable"
    assert outcome.status == 503 and outcome.error is not None
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 503
    assert world.runs == 0
    assert not any(isinstance(effect, Run) for effect in effects)
    assert "fail_open" not in world.event_kinds()
    assert world.event_kinds()[0] == "store_error"
    assert len(world.claims_of(waiter)) == 3  # no poll after the failed one


def test_a_first_claim_the_store_cannot_answer_still_runs_unprotected_when_asked_to(
    make_world: Callable[..., World],
) -> None:
    # The contrast to the test above: the rule is about waiters only.
    world = make_world(wait_seconds=30, on_store_error="run")
    world.hold_first()

    def claim_fails(number: int, request: ClaimRequest) -> None:
        raise StoreUnavailable("connection refused (test)")

    world.store.before_claim = claim_fails
    outcome, _ = world.wait(world.new_attempt())
    assert outcome is flow.RUN_UNPROTECTED
    assert world.event_kinds()[:2] == ["store_error", "fail_open"]


BAD_WAIT_SECONDS = [-1, -0.001, math.nan, math.inf, -math.inf, True, False, "1", None]


@pytest.mark.parametrize("value", BAD_WAIT_SECONDS, ids=repr)
@pytest.mark.parametrize("door", ["asgi", "wsgi", "idempotent"])
def test_a_bad_wait_seconds_is_rejected_with_value_error_at_construction(
    door: str, value: Any
) -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="wait_seconds"):
        if door == "asgi":
            IdempotencyMiddleware(asgi_app(Handler()), store=store, wait_seconds=value)
        elif door == "wsgi":
            IdempotencyWSGIMiddleware(wsgi_app(Handler()), store=store, wait_seconds=value)
        else:
            idempotent(store=store, key="key", wait_seconds=value)


@pytest.mark.parametrize("value", [0, 0.05, 2, 7.5])
def test_a_non_negative_finite_wait_seconds_is_taken(value: float) -> None:
    store = MemoryStore()
    asgi = IdempotencyMiddleware(asgi_app(Handler()), store=store, wait_seconds=value)
    wsgi = IdempotencyWSGIMiddleware(wsgi_app(Handler()), store=store, wait_seconds=value)
    assert asgi.options.default_policy.wait_seconds == value
    assert wsgi.options.default_policy.wait_seconds == value
    idempotent(store=store, key="key", wait_seconds=value)


# --- 2. idempotent, with threads and with tasks ---------------------------------------------

StoreKind = Literal["memory", "sqlite"]


@pytest.fixture(params=["memory", "sqlite"])
def counted(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[CountingStore]:
    """A MemoryStore or a SQLiteStore behind a claim-logging wrapper (system clock)."""
    if request.param == "memory":
        yield CountingStore(MemoryStore(), SYSTEM_CLOCK)
        return
    store = SQLiteStore(tmp_path / "wait.sqlite3")
    try:
        yield CountingStore(store, SYSTEM_CLOCK)
    finally:
        store.close()


def waiting(log: ClaimLog) -> Callable[[], bool]:
    """True once a second owner has polled (claimed twice): it is waiting."""
    return lambda: len(log.waiter_claims()) >= 2


@dataclass
class Charges:
    """A function body whose first call holds until released, and may raise."""

    first_raises: bool = False
    calls: list[int] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def charge(self, amount: int) -> dict[str, int]:
        self.calls.append(amount)
        number = len(self.calls)
        if number == 1:
            self.started.set()
            assert self.release.wait(10)
            if self.first_raises:
                raise RuntimeError("card declined")
        return {"charge": number, "amount": amount}


def test_a_sync_duplicate_call_waits_for_the_first_and_gets_its_result(
    counted: CountingStore,
) -> None:
    charges = Charges()

    @idempotent(store=counted, key="key", wait_seconds=10)
    def charge(key: str, amount: int) -> dict[str, int]:
        return charges.charge(amount)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(charge, "k-1", 5)
        assert charges.started.wait(5)
        duplicate = pool.submit(charge, "k-1", 5)
        assert counted.log.wait_for(waiting(counted.log))
        assert not duplicate.done()
        charges.release.set()
        assert first.result(10) == {"charge": 1, "amount": 5}
        assert duplicate.result(10) == {"charge": 1, "amount": 5}
    assert charges.calls == [5]


def test_a_sync_duplicate_call_runs_the_function_itself_when_the_first_raises(
    counted: CountingStore,
) -> None:
    charges = Charges(first_raises=True)

    @idempotent(store=counted, key="key", wait_seconds=10)
    def charge(key: str, amount: int) -> dict[str, int]:
        return charges.charge(amount)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(charge, "k-1", 5)
        assert charges.started.wait(5)
        duplicate = pool.submit(charge, "k-1", 5)
        assert counted.log.wait_for(waiting(counted.log))
        charges.release.set()
        with pytest.raises(RuntimeError, match="card declined"):
            first.result(10)
        assert duplicate.result(10) == {"charge": 2, "amount": 5}
    assert charges.calls == [5, 5]
    assert charge("k-1", 5) == {"charge": 2, "amount": 5}  # stored: replayed, not run


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until ``condition`` holds (a condition, not a length of time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@dataclass
class AsyncCharges:
    first_raises: bool = False
    calls: list[int] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def charge(self, amount: int) -> dict[str, int]:
        self.calls.append(amount)
        number = len(self.calls)
        if number == 1:
            self.started.set()
            await asyncio.wait_for(self.release.wait(), 10)
            if self.first_raises:
                raise RuntimeError("card declined")
        return {"charge": number, "amount": amount}


async def test_an_async_duplicate_call_waits_for_the_first_and_gets_its_result(
    counted: CountingStore,
) -> None:
    charges = AsyncCharges()

    @idempotent(store=counted, key="key", wait_seconds=10)
    async def charge(key: str, amount: int) -> dict[str, int]:
        return await charges.charge(amount)

    first = asyncio.ensure_future(charge("k-1", 5))
    await asyncio.wait_for(charges.started.wait(), 5)
    duplicate = asyncio.ensure_future(charge("k-1", 5))
    await until(waiting(counted.log))
    assert not duplicate.done()
    charges.release.set()
    assert await asyncio.wait_for(first, 10) == {"charge": 1, "amount": 5}
    assert await asyncio.wait_for(duplicate, 10) == {"charge": 1, "amount": 5}
    assert charges.calls == [5]


async def test_an_async_duplicate_call_runs_the_function_itself_when_the_first_raises(
    counted: CountingStore,
) -> None:
    charges = AsyncCharges(first_raises=True)

    @idempotent(store=counted, key="key", wait_seconds=10)
    async def charge(key: str, amount: int) -> dict[str, int]:
        return await charges.charge(amount)

    first = asyncio.ensure_future(charge("k-1", 5))
    await asyncio.wait_for(charges.started.wait(), 5)
    duplicate = asyncio.ensure_future(charge("k-1", 5))
    await until(waiting(counted.log))
    charges.release.set()
    with pytest.raises(RuntimeError, match="card declined"):
        await asyncio.wait_for(first, 10)
    assert await asyncio.wait_for(duplicate, 10) == {"charge": 2, "amount": 5}
    assert charges.calls == [5, 5]


def test_a_sync_call_whose_wait_runs_out_raises_key_in_progress() -> None:
    clock = FakeClock()
    store = CountingStore(MemoryStore(clock=clock), clock)
    charges = Charges()

    @idempotent(store=store, key="key", wait_seconds=20, clock=clock)
    def charge(key: str, amount: int) -> dict[str, int]:
        return charges.charge(amount)

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(charge, "k-1", 5)
        assert charges.started.wait(5)
        started = clock.now()
        with pytest.raises(KeyInProgressError) as raised:
            charge("k-1", 5)
        assert raised.value.retry_after == 1
        assert clock.now() - started >= 20 - MIN_POLL_GAP
        assert len(store.log.waiter_claims()) >= 20
        charges.release.set()
        assert first.result(10) == {"charge": 1, "amount": 5}
    assert charges.calls == [5]


async def test_an_async_call_whose_wait_runs_out_raises_key_in_progress() -> None:
    clock = FakeClock()
    store = CountingStore(MemoryStore(clock=clock), clock)
    charges = AsyncCharges()

    @idempotent(store=store, key="key", wait_seconds=20, clock=clock)
    async def charge(key: str, amount: int) -> dict[str, int]:
        return await charges.charge(amount)

    first = asyncio.ensure_future(charge("k-1", 5))
    await asyncio.wait_for(charges.started.wait(), 5)
    started = clock.now()
    with pytest.raises(KeyInProgressError):
        await charge("k-1", 5)
    assert clock.now() - started >= 20 - MIN_POLL_GAP
    assert len(store.log.waiter_claims()) >= 20
    charges.release.set()
    assert await asyncio.wait_for(first, 10) == {"charge": 1, "amount": 5}


def test_a_call_with_another_payload_raises_key_reused_at_once_without_waiting() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    charges = Charges()

    @idempotent(store=store, key="key", wait_seconds=20, clock=clock)
    def charge(key: str, amount: int) -> dict[str, int]:
        return charges.charge(amount)

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(charge, "k-1", 5)
        assert charges.started.wait(5)
        with pytest.raises(KeyReusedError):
            charge("k-1", 6)
        assert clock.slept == []
        charges.release.set()
        first.result(10)


def test_a_call_whose_poll_fails_raises_store_unavailable_and_never_runs_unprotected() -> None:
    clock = FakeClock()
    store = CountingStore(MemoryStore(clock=clock), clock)
    charges = Charges()

    def poll_fails(number: int, request: ClaimRequest) -> None:
        if number == 3:  # the first's claim, the duplicate's, then its first poll
            raise StoreUnavailable("connection refused (test)")

    @idempotent(store=store, key="key", wait_seconds=20, clock=clock, on_store_error="run")
    def charge(key: str, amount: int) -> dict[str, int]:
        return charges.charge(amount)

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(charge, "k-1", 5)
        assert charges.started.wait(5)
        store.before_claim = poll_fails
        with pytest.raises(StoreUnavailableError):
            charge("k-1", 5)
        assert charges.calls == [5]
        charges.release.set()
        first.result(10)
    assert charges.calls == [5]


# --- 3. over HTTP, real servers on 127.0.0.1 ------------------------------------------------

DoorKind = Literal["asgi-memory", "wsgi-memory", "asgi-dynamodb"]
MEMORY_DOORS: list[DoorKind] = ["asgi-memory", "wsgi-memory"]
ALL_DOORS: list[DoorKind] = [*MEMORY_DOORS, "asgi-dynamodb"]


class Events:
    """An ``on_event`` hook the servers' threads report to."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.seen: list[IdempotencyEvent] = []

    def __call__(self, event: IdempotencyEvent) -> None:
        with self._condition:
            self.seen.append(event)
            self._condition.notify_all()

    def wait_for(self, kind: str, timeout: float) -> IdempotencyEvent | None:
        with self._condition:
            self._condition.wait_for(lambda: self.of(kind) != [], timeout)
            found = self.of(kind)
            return found[0] if found else None

    def of(self, kind: str) -> list[IdempotencyEvent]:
        with self._condition:
            return [event for event in self.seen if event.kind == kind]


@dataclass
class Door:
    url: str
    handler: Handler
    log: ClaimLog
    events: Events


@contextlib.contextmanager
def serve_door(
    kind: DoorKind,
    request: pytest.FixtureRequest,
    *,
    clock: Clock = SYSTEM_CLOCK,
    **options: Any,
) -> Iterator[Door]:
    handler = Handler()
    events = Events()
    options = {"on_event": events, "clock": clock, **options}
    if kind == "wsgi-memory":
        sync_store = CountingStore(MemoryStore(clock=clock), clock)
        wsgi = IdempotencyWSGIMiddleware(wsgi_app(handler), store=sync_store, **options)
        try:
            with serve_wsgi(wsgi) as url:
                yield Door(url, handler, sync_store.log, events)
        finally:
            wsgi.close()
        return
    store: CountingStore | CountingAsyncStore
    on_shutdown: Callable[[], Awaitable[None]] | None = None
    if kind == "asgi-memory":
        store = CountingStore(MemoryStore(clock=clock), clock)
    else:
        aws = request.getfixturevalue("aws_sessions")
        dynamodb = AsyncDynamoDBStore(
            request.getfixturevalue("harness_table"),
            endpoint_url=request.getfixturevalue("moto_endpoint"),
            region_name=REGION,
            session=aws.aioboto3_session,
        )
        on_shutdown = dynamodb.aclose
        store = CountingAsyncStore(dynamodb, clock)
    asgi_store: AsyncStore = store
    middleware = IdempotencyMiddleware(asgi_app(handler), store=asgi_store, **options)
    with serve_asgi(middleware, on_shutdown=on_shutdown) as url:
        yield Door(url, handler, store.log, events)


def post(url: str, key: str, body: bytes = BODY) -> httpx.Response:
    with httpx.Client(base_url=url, trust_env=False, timeout=15) as client:
        return client.post(
            "/orders",
            content=body,
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        )


def new_key() -> str:
    return f"wait-{uuid.uuid4().hex}"


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_a_duplicate_request_waits_for_the_first_and_gets_its_replay_not_409(
    kind: DoorKind, request: pytest.FixtureRequest
) -> None:
    with serve_door(kind, request, wait_seconds=10) as door, ThreadPoolExecutor(2) as pool:
        gate = door.handler.hold(1)
        key = new_key()
        first = pool.submit(post, door.url, key)
        assert door.handler.wait_for_calls(1)
        duplicate = pool.submit(post, door.url, key)
        assert door.log.wait_for(waiting(door.log)), "the duplicate never polled"
        assert not duplicate.done()
        gate.set()
        original, replay = first.result(15), duplicate.result(15)
    assert original.status_code == 201
    assert "idempotent-replayed" not in original.headers
    assert replay.status_code == 201
    assert replay.headers.get("idempotent-replayed") == "true"
    assert replay.content == original.content
    assert original.json()["call"] == 1
    assert door.handler.calls == 1


@pytest.mark.parametrize("kind", ALL_DOORS)
def test_a_duplicate_runs_the_handler_itself_when_the_first_answers_500(
    kind: DoorKind, request: pytest.FixtureRequest
) -> None:
    with serve_door(kind, request, wait_seconds=10) as door, ThreadPoolExecutor(2) as pool:
        gate = door.handler.hold(1)
        door.handler.answer(1, 500)
        key = new_key()
        first = pool.submit(post, door.url, key)
        assert door.handler.wait_for_calls(1)
        duplicate = pool.submit(post, door.url, key)
        assert door.log.wait_for(waiting(door.log)), "the duplicate never polled"
        gate.set()
        failed, ran = first.result(15), duplicate.result(15)
        assert failed.status_code == 500
        assert ran.status_code == 201
        assert "idempotent-replayed" not in ran.headers
        assert ran.json()["call"] == 2
        assert door.handler.calls == 2
        later = post(door.url, key)  # what the duplicate got is the key's stored outcome
    assert later.headers.get("idempotent-replayed") == "true"
    assert later.content == ran.content


@pytest.mark.parametrize("kind", MEMORY_DOORS)
def test_a_duplicate_whose_wait_runs_out_gets_409_with_retry_after(
    kind: DoorKind, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()  # the waiter's sleeps advance it: its 5 s go by at once
    with (
        serve_door(kind, request, clock=clock, wait_seconds=5) as door,
        ThreadPoolExecutor(1) as pool,
    ):
        gate = door.handler.hold(1)
        key = new_key()
        first = pool.submit(post, door.url, key)
        assert door.handler.wait_for_calls(1)
        started = clock.now()
        refused = post(door.url, key)
        assert refused.status_code == 409
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["content-type"] == "application/problem+json"
        assert clock.now() - started >= 5 - MIN_POLL_GAP
        assert len(door.log.waiter_claims()) >= 5  # it polled all along
        assert door.handler.calls == 1 and not first.done()
        gate.set()
        assert first.result(15).status_code == 201
    assert door.handler.calls == 1


# --- 4. a waiter whose client disconnects ----------------------------------------------------


def raw_post(url: str, key: str) -> socket.socket:
    """Send a POST on a socket of its own, the answer left unread."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.port is not None
    connection = socket.create_connection((parts.hostname, parts.port), timeout=5)
    head = (
        f"POST /orders HTTP/1.1\r\nHost: {parts.netloc}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    connection.sendall(head.encode("ascii") + BODY)
    return connection


def test_an_asgi_waiter_whose_client_disconnects_stops_polling_and_the_first_completes(
    request: pytest.FixtureRequest,
) -> None:
    with serve_door("asgi-memory", request, wait_seconds=30) as door, ThreadPoolExecutor(1) as pool:
        gate = door.handler.hold(1)
        key = new_key()
        first = pool.submit(post, door.url, key)
        assert door.handler.wait_for_calls(1)
        connection = raw_post(door.url, key)
        assert door.log.wait_for(waiting(door.log)), "the duplicate never polled"
        closed_at = time.monotonic()
        connection.close()
        # The waiter's attempt ends (a conflict it cannot send any more) long before its
        # 30 s and while the first still runs.
        stopped = door.events.wait_for("conflict", timeout=5)
        assert stopped is not None, "the waiter kept waiting after its client left"
        assert time.monotonic() - closed_at < 2
        assert not first.done() and door.handler.returned == 0
        polls = len(door.log.waiter_claims())
        gate.set()
        original = first.result(15)
        assert original.status_code == 201
        assert "idempotent-replayed" not in original.headers
        assert len(door.log.waiter_claims()) == polls  # not one poll after it stopped
        replay = post(door.url, key)
    assert replay.status_code == 201 and replay.headers.get("idempotent-replayed") == "true"
    assert replay.content == original.content
    assert door.handler.calls == 1
    assert [event.kind for event in door.events.seen].count("completed") == 1


class FakeReceive:
    """An ASGI ``receive`` driven by the test: it blocks until a message is delivered."""

    def __init__(self, failure: Exception | None = None) -> None:
        self._pending: list[Message] = []
        self._arrived = asyncio.Event()
        self._failure = failure
        self.calls = 0
        self.cancelled = 0

    def deliver(self, message: Message) -> None:
        self._pending.append(message)
        self._arrived.set()

    async def __call__(self) -> Message:
        self.calls += 1
        try:
            while not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self._failure is not None:
            raise self._failure
        return self._pending.pop(0)


class GatedClock(FakeClock):
    """A FakeClock whose async sleeps last until the test opens ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.cancelled = 0

    async def asleep(self, seconds: float) -> None:
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        await super().asleep(seconds)


async def ticks(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_disconnect_waiter_answers_true_when_its_sleep_ends_and_cancels_receive() -> None:
    clock = FakeClock()
    receive = FakeReceive()
    wait = disconnect_waiter(receive, clock)
    assert await wait(0.25) is True
    assert clock.slept == [0.25]
    await ticks()
    assert receive.calls == 1 and receive.cancelled == 1


async def test_disconnect_waiter_answers_false_at_once_on_http_disconnect() -> None:
    clock = GatedClock()  # the sleep would never end
    receive = FakeReceive()
    waiting_task = asyncio.ensure_future(disconnect_waiter(receive, clock)(5.0))
    await ticks()
    assert not waiting_task.done()
    receive.deliver({"type": "http.disconnect"})
    assert await asyncio.wait_for(waiting_task, 1) is False
    await ticks()
    assert clock.cancelled == 1  # its sleep was cancelled, not left running
    assert clock.slept == []


async def test_disconnect_waiter_answers_false_for_a_client_already_gone() -> None:
    clock = FakeClock()
    receive = FakeReceive()
    receive.deliver({"type": "http.disconnect"})
    assert await disconnect_waiter(receive, clock)(5.0) is False


async def test_disconnect_waiter_keeps_sleeping_on_another_message_type() -> None:
    clock = GatedClock()
    receive = FakeReceive()
    receive.deliver({"type": "http.request", "body": b"", "more_body": False})
    waiting_task = asyncio.ensure_future(disconnect_waiter(receive, clock)(5.0))
    await ticks()
    assert receive.calls == 1  # answered, and not a disconnect
    assert not waiting_task.done()
    clock.gate.set()
    assert await asyncio.wait_for(waiting_task, 1) is True
    assert clock.slept == [5.0]


async def test_disconnect_waiter_counts_a_failing_receive_as_a_client_gone() -> None:
    clock = GatedClock()
    receive = FakeReceive(failure=OSError("connection reset"))
    receive.deliver({"type": "http.request"})
    assert await asyncio.wait_for(disconnect_waiter(receive, clock)(5.0), 1) is False
