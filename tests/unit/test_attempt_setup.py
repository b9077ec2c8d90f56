"""``engine.setup``: what every door builds once to run its attempts (context, renewals,
driver), sync and async, on a real ``MemoryStore`` and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idempotency_middleware import MemoryStore
from idempotency_middleware.engine import decisions
from idempotency_middleware.engine.effects import Ran
from idempotency_middleware.engine.setup import AsyncSetup, LiveStream, SyncSetup
from idempotency_middleware.events import IdempotencyEvent
from idempotency_middleware.policy.options import Options, Policy
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.testing import FakeClock

CREATED = Ran(201, [(b"content-type", b"text/plain")], b"made")
LIVE = Ran(200, [(b"content-type", b"text/event-stream")], b"", live=True, ended=False)
DEFAULT_POLICY = Options.build().default_policy


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def setup(clock: FakeClock, store: MemoryStore) -> Iterator[SyncSetup]:
    built = SyncSetup.for_options(Options.build(clock=clock), store)
    yield built
    built.close()


def attempt_of(setup: SyncSetup | AsyncSetup, policy: Policy = DEFAULT_POLICY) -> decisions.Attempt:
    """An attempt of function ``orders.charge`` with key ``k1``, built as a door builds it."""
    return decisions.call_attempt(
        policy, "orders.charge", "k1", "fp", setup.now(), setup.new_owner()
    )


def test_a_sync_setup_runs_an_attempt_and_completes_its_key(
    setup: SyncSetup, store: MemoryStore
) -> None:
    attempt = attempt_of(setup)
    assert setup.drive(attempt, lambda: CREATED) == CREATED
    record = store.get(attempt.key_hash)
    assert record is not None and record.status is Status.COMPLETED


def test_a_setups_attempts_take_their_time_from_the_options_clock(
    setup: SyncSetup, clock: FakeClock
) -> None:
    clock.advance(42)
    assert attempt_of(setup).claim.now == clock.now()


def test_a_setup_gives_each_attempt_its_own_owner(setup: SyncSetup) -> None:
    assert attempt_of(setup).claim.owner != attempt_of(setup).claim.owner


def test_a_second_attempt_with_the_key_gets_the_stored_response(setup: SyncSetup) -> None:
    setup.drive(attempt_of(setup), lambda: CREATED)
    replayed = setup.drive(attempt_of(setup), lambda: pytest.fail("ran twice"))
    assert replayed == StoredResponse(CREATED.status, CREATED.headers, CREATED.body)


def test_a_live_stream_keeps_the_key_claimed_until_its_finish(
    setup: SyncSetup, store: MemoryStore
) -> None:
    attempt = attempt_of(setup)
    with pytest.raises(LiveStream) as live:
        setup.drive(attempt, lambda: LIVE)
    record = store.get(attempt.key_hash)
    assert record is not None and record.status is Status.IN_PROGRESS
    live.value.finish(5, False)
    record = store.get(attempt.key_hash)
    assert record is not None and record.status is Status.COMPLETED
    assert record.response_not_stored and record.response_size == 5


def test_a_live_stream_that_failed_releases_the_key_at_its_finish(
    setup: SyncSetup, store: MemoryStore
) -> None:
    attempt = attempt_of(setup)
    with pytest.raises(LiveStream) as live:
        setup.drive(attempt, lambda: LIVE)
    live.value.finish(3, True)
    assert store.get(attempt.key_hash) is None


def test_a_sync_setup_renews_the_lease_while_its_handler_runs_and_close_stops_it(
    setup: SyncSetup,
) -> None:
    attempt = attempt_of(setup)
    renewing: list[bool] = []

    def run() -> Ran:
        renewing.append(attempt.claim.owner in setup.renewals._leases.active)
        setup.close()
        renewing.append(attempt.claim.owner in setup.renewals._leases.active)
        return CREATED

    setup.drive(attempt, run)
    assert renewing == [True, False]


def test_a_function_doors_setup_words_events_without_http_and_reads_sealed_records_only(
    store: MemoryStore,
) -> None:
    events: list[IdempotencyEvent] = []
    setup = SyncSetup.for_options(
        Options.build(on_event=events.append), store, http=False, sealed_only=True
    )
    try:
        assert setup.context.sealed_only and not setup.context.http
        setup.drive(attempt_of(setup), lambda: CREATED)
    finally:
        setup.close()
    assert [event.kind for event in events] == ["claimed", "completed"]
    assert all(event.status is None for event in events)


def test_an_http_doors_setup_reports_the_status_it_completed_with(store: MemoryStore) -> None:
    events: list[IdempotencyEvent] = []
    setup = SyncSetup.for_options(Options.build(on_event=events.append), store)
    try:
        assert not setup.context.sealed_only
        setup.drive(attempt_of(setup), lambda: CREATED)
    finally:
        setup.close()
    assert [(event.kind, event.status) for event in events] == [
        ("claimed", None),
        ("completed", 201),
    ]


async def test_an_async_setup_runs_an_attempt_on_the_running_loop(
    clock: FakeClock, store: MemoryStore
) -> None:
    setup = AsyncSetup.for_options(Options.build(clock=clock), store)
    attempt = attempt_of(setup)

    async def run() -> Ran:
        return CREATED

    assert await setup.drive(attempt, run) == CREATED
    record = store.get(attempt.key_hash)
    assert record is not None and record.status is Status.COMPLETED


async def test_an_async_setup_pauses_a_waiting_duplicate_with_the_doors_wait(
    clock: FakeClock, store: MemoryStore
) -> None:
    setup = AsyncSetup.for_options(Options.build(clock=clock, wait_seconds=5), store)
    first = attempt_of(setup)
    store.claim(first.claim)  # still running elsewhere
    waits: list[float] = []

    async def client_gone(seconds: float) -> bool:
        waits.append(seconds)
        return False  # its client left: stop waiting

    async def run() -> Ran:
        pytest.fail("a duplicate ran")

    duplicate = attempt_of(setup, Options.build(wait_seconds=5).default_policy)
    ending = await setup.drive(duplicate, run, client_gone)
    assert isinstance(ending, decisions.Refusal) and ending.reason == "in_progress"
    assert len(waits) == 1
