"""The attempt sequence (``engine.flow``), stepped effect by effect: no servers, no store,
no sleeps. Each test scripts what the store answers (or raises) at each effect and checks
the effects the attempt yields, its outcome and its events. Time is a ``FakeClock``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
from collections.abc import Callable, Generator
from typing import Any

import pytest

from idempotency_middleware.engine import decisions, flow
from idempotency_middleware.engine.drivers import AsyncDriver, Suspended, SyncDriver
from idempotency_middleware.engine.effects import (
    AwaitStreamEnd,
    Effect,
    Ran,
    Renew,
    Run,
    Sleep,
    StreamEnd,
)
from idempotency_middleware.engine.renewal import Leases, LoopRenewals, ThreadRenewals
from idempotency_middleware.events import IdempotencyEvent
from idempotency_middleware.handler.context import (
    CURRENT,
    announce,
    current_attempt,
    finish_announced,
)
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS, Options
from idempotency_middleware.stores.memory import MemoryStore
from idempotency_middleware.stores.protocol import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    Completion,
    Held,
    StoreUnavailable,
    awaits_nothing,
    sync_twin,
)
from idempotency_middleware.stores.records import Record, Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.support.attempts import BOOKKEEPING, bookkeeping, order_attempt, without_bookkeeping

LOCK = 30.0
INTERVAL = LOCK / 3
CREATED = Ran(201, [(b"content-type", b"application/json")], b'{"id": 1}')

Answerer = Callable[[Effect], Any]


class Scripted:
    """Runs one attempt by hand: ``answer(effect)`` returns the effect's result or raises
    what the store would raise; every effect and event is recorded."""

    def __init__(
        self, *, cache_size: int = 0, on_store_error: str = "fail", lock: float = LOCK
    ) -> None:
        self.clock = FakeClock()
        self.events: list[IdempotencyEvent] = []
        self.options = Options.build(
            lock_timeout_seconds=lock,
            replay_cache_size=cache_size,
            on_store_error=on_store_error,
            on_event=self.events.append,
            clock=self.clock,
        )
        self.context = flow.Context.for_options(self.options, None)
        self.effects: list[Effect] = []
        self.attempt = self.new_attempt()

    def new_attempt(self, body: bytes = b'{"a": 1}') -> decisions.Attempt:
        return order_attempt(self.options, self.clock.now(), body)

    def run(self, answer: Answerer) -> flow.Ending:
        running = flow.attempt(self.context, self.attempt)
        outcome: flow.Ending = self.step(running, answer)
        return outcome

    def step(self, running: Generator[Effect, Any, Any], answer: Answerer) -> Any:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = running.send(value) if error is None else running.throw(error)
            except StopIteration as stop:
                return stop.value
            if isinstance(effect, BOOKKEEPING):
                value, error = bookkeeping(effect), None
                continue
            self.effects.append(effect)
            value, error = None, None
            try:
                value = answer(effect)
            except BaseException as raised:
                error = raised

    def kinds(self) -> list[str]:
        return [type(effect).__name__ for effect in self.effects]

    def event_kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def record(
        self, status: Status, *, fingerprint: str | None = None, owner: str = "other"
    ) -> Record:
        claim = self.attempt.claim
        response = StoredResponse(201, [], b'{"id": 1}') if status is Status.COMPLETED else None
        return Record(
            claim.key_hash,
            status,
            claim.fingerprint if fingerprint is None else fingerprint,
            owner,
            claim.now + LOCK,
            claim.now + 1000,
            response,
        )


def store_that(**results: Any) -> Answerer:
    """An answerer: the result (or exception, raised) for each effect type by name; a list
    is consumed one item per call. Effects not named answer ``None``."""

    def answer(effect: Effect) -> Any:
        result = results.get(type(effect).__name__)
        if isinstance(result, list):
            result = result.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result

    return answer


def unavailable() -> StoreUnavailable:
    return StoreUnavailable("connection refused")


# --- a new key ---


def test_a_new_key_is_claimed_run_under_a_lease_and_completed() -> None:
    script = Scripted()
    outcome = script.run(store_that(ClaimRequest=CLAIMED, Run=CREATED, Completion=True))
    assert outcome == CREATED
    assert script.kinds() == ["ClaimRequest", "Run", "Completion"]
    assert script.event_kinds() == ["claimed", "completed"]
    start = script.effects[1]
    assert isinstance(start, Run) and start.granted_at == script.attempt.claim.now
    complete = script.effects[2]
    assert isinstance(complete, Completion)
    assert complete.response.body == CREATED.body
    assert complete.owner == script.attempt.claim.owner


def test_a_taken_over_claim_is_reported_as_such() -> None:
    script = Scripted()
    script.run(store_that(ClaimRequest=TAKEN_OVER, Run=CREATED, Completion=True))
    assert script.event_kinds() == ["taken_over", "completed"]


def test_a_5xx_answer_releases_the_key() -> None:
    script = Scripted()
    outcome = script.run(store_that(ClaimRequest=CLAIMED, Run=Ran(503, [], b"busy"), Release=True))
    assert isinstance(outcome, Ran) and outcome.status == 503
    assert script.kinds() == ["ClaimRequest", "Run", "Release"]
    assert script.event_kinds() == ["claimed", "released"]


def test_an_app_that_answered_nothing_releases_the_key() -> None:
    script = Scripted()
    outcome = script.run(store_that(ClaimRequest=CLAIMED, Run=None, Release=True))
    assert outcome is None
    assert script.kinds()[-1] == "Release"


def test_a_raising_app_releases_the_key_and_the_error_propagates() -> None:
    script = Scripted()
    with pytest.raises(ZeroDivisionError):
        script.run(store_that(ClaimRequest=CLAIMED, Run=ZeroDivisionError(), Release=True))
    assert script.kinds() == ["ClaimRequest", "Run", "Release"]
    assert script.event_kinds() == ["claimed", "released"]


def test_a_fenced_out_release_is_reported_lost_not_released() -> None:
    script = Scripted()
    with pytest.raises(ZeroDivisionError):
        script.run(store_that(ClaimRequest=CLAIMED, Run=ZeroDivisionError(), Release=False))
    assert script.event_kinds() == ["claimed", "lost"]


def test_a_fenced_out_completion_is_reported_lost() -> None:
    script = Scripted()
    script.run(store_that(ClaimRequest=CLAIMED, Run=CREATED, Completion=False))
    assert script.event_kinds() == ["claimed", "lost"]


# --- finishing retries ---


def test_a_failing_completion_is_retried_with_backoff_until_it_lands() -> None:
    script = Scripted()
    script.run(
        store_that(
            ClaimRequest=CLAIMED, Run=CREATED, Completion=[unavailable(), unavailable(), True]
        )
    )
    assert script.kinds()[2:] == [
        "Completion",
        "Sleep",
        "Completion",
        "Sleep",
        "Completion",
    ]
    sleeps = [effect.seconds for effect in script.effects if isinstance(effect, Sleep)]
    assert all(0 <= seconds <= 0.05 * 2 ** (number) for number, seconds in enumerate(sleeps))
    assert script.event_kinds() == ["claimed", "completed"]


def store_down_for(script: Scripted, seconds: float | None) -> Answerer:
    """A store that refuses completions until ``seconds`` after the handler ran (``None``:
    for good); the attempt's sleeps advance its clock, as a driver's do."""
    answers = store_that(ClaimRequest=CLAIMED, Run=CREATED)
    back_at: list[float] = []

    def answer(effect: Effect) -> Any:
        if isinstance(effect, Sleep):
            script.clock.advance(effect.seconds)
            return None
        if isinstance(effect, Completion):
            if not back_at:
                back_at.append(math.inf if seconds is None else effect.now + seconds)
            if script.clock.now() < back_at[0]:
                raise unavailable()
            return True
        return answers(effect)

    return answer


def test_a_completion_that_never_lands_is_tried_while_its_lease_lasts_then_given_up() -> None:
    script = Scripted()
    started = script.clock.now()
    script.run(store_down_for(script, None))
    tries = script.kinds().count("Completion")
    assert tries > decisions.FINISH_ATTEMPTS
    # For FINISH_SECONDS (the lease is longer), its tries at most MAX_FINISH_DELAY apart.
    waited = script.clock.now() - started
    finish_seconds, max_delay = decisions.FINISH_SECONDS, decisions.MAX_FINISH_DELAY
    assert finish_seconds <= waited < finish_seconds + max_delay
    assert max(e.seconds for e in script.effects if isinstance(e, Sleep)) <= max_delay
    assert script.event_kinds() == ["claimed", "store_error"]
    error = script.events[-1]
    assert error.operation == "complete"
    assert error.error is not None and f"gave up after {tries} attempts" in error.error


def test_a_completion_retried_on_a_clock_that_stands_still_still_ends() -> None:
    """The retries are bounded by the delays slept too, whatever the clock says."""
    script = Scripted()  # (its sleeps are answered without moving its clock)
    refused = [unavailable() for _ in range(1000)]
    script.run(store_that(ClaimRequest=CLAIMED, Run=CREATED, Completion=refused))
    assert decisions.FINISH_ATTEMPTS < script.kinds().count("Completion") < 1000
    assert script.event_kinds() == ["claimed", "store_error"]


def test_a_completion_cut_short_by_a_cancellation_is_sent_again_and_reported() -> None:
    script = Scripted()
    answers = store_that(
        ClaimRequest=CLAIMED, Run=CREATED, Completion=[asyncio.CancelledError(), True]
    )
    with pytest.raises(asyncio.CancelledError):
        script.run(answers)
    assert script.kinds() == ["ClaimRequest", "Run", "Completion", "Completion"]
    assert script.event_kinds() == ["claimed", "completed"]


def test_a_completion_refused_through_a_failover_of_a_few_seconds_lands() -> None:
    script = Scripted()
    outcome = script.run(store_down_for(script, 3.0))
    assert isinstance(outcome, Ran)
    assert script.event_kinds() == ["claimed", "completed"]
    assert script.kinds().count("Completion") > decisions.FINISH_ATTEMPTS


def test_a_completion_is_tried_no_longer_than_a_short_lease() -> None:
    script = Scripted(lock=1.0)
    started = script.clock.now()
    script.run(store_down_for(script, None))
    assert 1.0 <= script.clock.now() - started < 1.0 + decisions.MAX_FINISH_DELAY


# --- a held key ---


def test_a_completed_key_with_the_same_fingerprint_is_replayed_without_running() -> None:
    script = Scripted()
    record = script.record(Status.COMPLETED)
    outcome = script.run(store_that(ClaimRequest=Held(record)))
    assert outcome == record.response
    assert script.kinds() == ["ClaimRequest"]
    assert script.event_kinds() == ["replayed"]


def test_a_key_in_progress_answers_409() -> None:
    script = Scripted()
    outcome = script.run(store_that(ClaimRequest=Held(script.record(Status.IN_PROGRESS))))
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 409
    assert script.event_kinds() == ["conflict"]


def test_a_key_reused_with_another_request_answers_422() -> None:
    script = Scripted()
    record = script.record(Status.COMPLETED, fingerprint="another request")
    outcome = script.run(store_that(ClaimRequest=Held(record)))
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 422
    assert script.event_kinds() == ["mismatch"]


def test_our_own_claim_re_sent_after_its_answer_was_lost_is_ours_and_runs() -> None:
    """botocore re-sends a PutItem whose answer was cut; the re-sent claim fails against the
    claim that landed, which carries our owner token: it is our claim, not a 409."""
    script = Scripted()
    own = script.record(Status.IN_PROGRESS, owner=script.attempt.claim.owner)
    outcome = script.run(store_that(ClaimRequest=Held(own), Run=CREATED, Completion=True))
    assert outcome == CREATED
    assert script.kinds() == ["ClaimRequest", "Run", "Completion"]
    assert script.event_kinds() == ["claimed", "completed"]


def test_a_completed_record_with_our_owner_token_is_not_run_again() -> None:
    script = Scripted()
    own = script.record(Status.COMPLETED, owner=script.attempt.claim.owner)
    outcome = script.run(store_that(ClaimRequest=Held(own)))
    assert outcome == own.response
    assert "Run" not in script.kinds()


# --- the replay cache ---


def test_a_cached_replay_costs_no_store_call() -> None:
    script = Scripted(cache_size=8)
    record = script.record(Status.COMPLETED)
    script.run(store_that(ClaimRequest=Held(record)))
    script.effects.clear()
    outcome = script.run(store_that())
    assert outcome == record.response
    assert script.effects == []
    assert script.event_kinds() == ["replayed", "replayed"]


def test_the_replay_cache_keeps_no_in_progress_record() -> None:
    script = Scripted(cache_size=8)
    script.run(store_that(ClaimRequest=Held(script.record(Status.IN_PROGRESS))))
    script.effects.clear()
    script.run(store_that(ClaimRequest=Held(script.record(Status.IN_PROGRESS))))
    assert script.kinds() == ["ClaimRequest"]


def test_a_cached_record_past_its_ttl_is_not_served() -> None:
    script = Scripted(cache_size=8)
    script.run(store_that(ClaimRequest=Held(script.record(Status.COMPLETED))))
    script.clock.advance(1001)
    script.attempt = script.new_attempt()
    script.effects.clear()
    script.run(store_that(ClaimRequest=CLAIMED, Run=CREATED, Completion=True))
    assert script.kinds()[0] == "ClaimRequest"


# --- a failing claim ---


def test_a_failed_claim_answers_503_and_releases_the_lost_claim_in_the_background() -> None:
    script = Scripted()
    outcome = script.run(store_that(ClaimRequest=unavailable()))
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 503
    assert script.kinds() == ["ClaimRequest", "Spawn"]
    assert script.event_kinds() == ["store_error"]
    assert script.events[0].operation == "claim"


def test_a_failed_claim_runs_unprotected_when_asked_to() -> None:
    script = Scripted(on_store_error="run")
    outcome = script.run(store_that(ClaimRequest=unavailable()))
    assert outcome is flow.RUN_UNPROTECTED
    assert script.event_kinds() == ["store_error", "fail_open"]


def test_a_claim_cancelled_in_flight_releases_it_in_the_background_and_stays_cancelled() -> None:
    script = Scripted()
    with pytest.raises(asyncio.CancelledError):
        script.run(store_that(ClaimRequest=asyncio.CancelledError()))
    assert script.kinds() == ["ClaimRequest", "Spawn"]


def test_the_lost_claim_release_retries_on_its_schedule_and_stops_once_it_finds_the_claim() -> None:
    script = Scripted()
    background = flow.release_lost_claim(script.attempt)
    script.step(background, store_that(Release=[unavailable(), False, True]))
    assert script.kinds() == ["Sleep", "Release", "Sleep", "Release", "Sleep", "Release"]
    sleeps = [effect.seconds for effect in script.effects if isinstance(effect, Sleep)]
    assert sleeps == list(decisions.LOST_CLAIM_RELEASE_DELAYS[:3])


def test_the_lost_claim_release_gives_up_after_its_last_delay() -> None:
    script = Scripted()
    script.step(flow.release_lost_claim(script.attempt), store_that(Release=False))
    assert script.kinds().count("Release") == len(decisions.LOST_CLAIM_RELEASE_DELAYS)


# --- a slow claim: the lease counts from before the claim was sent ---


def slow_claim(script: Scripted, seconds: float, result: Any = CLAIMED) -> Answerer:
    """The claim takes ``seconds`` to land (the fake clock moves while it is in flight)."""

    def answer(effect: Effect) -> Any:
        if isinstance(effect, ClaimRequest):
            script.clock.advance(seconds)
            return result
        return store_that(Run=CREATED, Completion=True, Renew=True, Release=True)(effect)

    return answer


def test_a_claim_that_lands_with_its_lease_nearly_spent_renews_before_running() -> None:
    script = Scripted()
    script.run(slow_claim(script, LOCK - INTERVAL / 2))
    assert script.kinds() == ["ClaimRequest", "Renew", "Run", "Completion"]
    renew, start = script.effects[1], script.effects[2]
    assert isinstance(renew, Renew) and isinstance(start, Run)
    assert renew.lock_expires_at == script.clock.now() + LOCK
    assert start.granted_at == script.clock.now()


def test_a_claim_taken_over_while_it_was_in_flight_does_not_run() -> None:
    script = Scripted()

    def answer(effect: Effect) -> Any:
        if isinstance(effect, Renew):
            return False
        return slow_claim(script, LOCK)(effect)

    outcome = script.run(answer)
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 409
    assert "Run" not in script.kinds()
    assert script.event_kinds() == ["claimed", "lost"]


def test_a_nearly_spent_claim_whose_renewal_fails_is_released_and_answers_503() -> None:
    script = Scripted()

    def answer(effect: Effect) -> Any:
        if isinstance(effect, Renew):
            raise unavailable()
        return slow_claim(script, LOCK - 1)(effect)

    outcome = script.run(answer)
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 503
    assert script.kinds() == ["ClaimRequest", "Renew", "Release"]


def test_a_claim_merely_due_for_renewal_runs_and_its_lease_counts_from_before_the_claim() -> None:
    script = Scripted()
    script.run(slow_claim(script, INTERVAL + 1))
    assert script.kinds() == ["ClaimRequest", "Run", "Completion"]
    start = script.effects[1]
    assert isinstance(start, Run) and start.granted_at == script.attempt.claim.now
    leases = Leases()
    # Due at once: one interval after the lease was granted, not after the claim returned.
    assert leases.add(start) == script.attempt.claim.now + INTERVAL < script.clock.now()
    assert leases.take_due(script.clock.now()) == [start]


# --- live streams ---

LIVE = Ran(200, [(b"content-type", b"text/event-stream")], b"", live=True, ended=False)


def test_a_live_stream_is_completed_without_its_body_when_it_ends() -> None:
    script = Scripted()
    outcome = script.run(
        store_that(
            ClaimRequest=CLAIMED, Run=LIVE, AwaitStreamEnd=StreamEnd(42, False), Completion=True
        )
    )
    assert outcome == LIVE
    assert script.kinds() == [
        "ClaimRequest",
        "Run",
        "AwaitStreamEnd",
        "EndLease",
        "Completion",
    ]
    complete = script.effects[-1]
    assert isinstance(complete, Completion)
    assert complete.streamed and complete.body_size == 42


def test_a_live_stream_that_failed_midway_releases_the_key() -> None:
    script = Scripted()
    script.run(
        store_that(ClaimRequest=CLAIMED, Run=LIVE, AwaitStreamEnd=StreamEnd(7, True), Release=True)
    )
    assert script.kinds()[-2:] == ["EndLease", "Release"]


def test_a_stream_already_ended_when_the_app_returned_is_not_awaited() -> None:
    script = Scripted()
    ended = LIVE._replace(ended=True, size=9)
    script.run(store_that(ClaimRequest=CLAIMED, Run=ended, Completion=True))
    assert "AwaitStreamEnd" not in script.kinds()
    complete = script.effects[-1]
    assert isinstance(complete, Completion) and complete.body_size == 9


# --- the drivers, on a real MemoryStore and a fake clock ------------------------------------------


def test_the_sync_driver_runs_an_attempt_against_a_store() -> None:
    script = Scripted()
    store = MemoryStore()
    renewals = ThreadRenewals(store, script.context.reporter, script.clock)
    driver = SyncDriver(store, script.clock, renewals)
    outcome = driver.drive(flow.attempt(script.context, script.attempt), lambda: CREATED)
    assert outcome == CREATED
    record = store.get(script.attempt.claim.key_hash)
    assert record is not None and record.status is Status.COMPLETED
    renewals.close()


def test_a_forked_child_does_not_renew_the_claims_its_parent_held() -> None:
    script = Scripted()
    store = MemoryStore()
    renewals = ThreadRenewals(store, script.context.reporter, script.clock)
    renewals.start(Run(script.attempt, script.clock.now()))
    try:
        child = os.fork()
        if child == 0:  # the parent's claim is the parent's: nothing for the child to renew
            os._exit(0 if not renewals._leases.active else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert renewals._leases.active  # the parent's door still renews it
    finally:
        renewals.close()


def test_the_sync_driver_suspends_at_a_live_stream_and_resumes_when_it_ends() -> None:
    script = Scripted()
    store = MemoryStore()
    driver = SyncDriver(
        store, script.clock, ThreadRenewals(store, script.context.reporter, script.clock)
    )
    running = flow.attempt(script.context, script.attempt)
    with pytest.raises(Suspended):
        driver.drive(running, lambda: LIVE)
    record = store.get(script.attempt.claim.key_hash)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert driver.resume(running, StreamEnd(5, False)) == LIVE
    record = store.get(script.attempt.claim.key_hash)
    assert record is not None and record.status is Status.COMPLETED
    assert record.response_not_stored and record.response_size == 5


def test_a_dead_owner_is_taken_over_once_the_fake_clock_crosses_its_lock() -> None:
    script = Scripted()
    store = MemoryStore()
    first = script.attempt
    assert isinstance(store.claim(first.claim), type(CLAIMED))
    # Past the lock and the default clock-skew margin.
    script.clock.advance(LOCK + DEFAULT_CLOCK_SKEW_SECONDS + 0.001)
    script.attempt = script.new_attempt()
    driver = SyncDriver(
        store, script.clock, ThreadRenewals(store, script.context.reporter, script.clock)
    )
    driver.drive(flow.attempt(script.context, script.attempt), lambda: CREATED)
    assert script.event_kinds() == ["taken_over", "completed"]
    # The dead owner is fenced out.
    assert store.release(first.claim.key_hash, first.claim.owner) is False


def test_the_thread_renewer_extends_a_running_lease_from_the_clock_time_it_renews_at() -> None:
    script = Scripted()
    store = MemoryStore()
    assert store.claim(script.attempt.claim) == CLAIMED
    renewals = ThreadRenewals(store, script.context.reporter, script.clock)
    lease = Run(script.attempt, script.attempt.claim.now)
    leases = Leases()
    leases.add(lease)
    now = script.clock.advance(INTERVAL)
    due = leases.take_due(now)
    assert due == [lease]
    renewals.renew_due(due, now)
    record = store.get(script.attempt.claim.key_hash)
    assert record is not None and record.lock_expires_at == now + LOCK
    assert leases.next_due() == now + INTERVAL


async def test_the_async_driver_runs_an_attempt_against_a_store() -> None:
    script = Scripted()
    store = MemoryStore()
    driver = AsyncDriver(
        store, script.clock, LoopRenewals(store, script.context.reporter, script.clock)
    )

    async def run() -> Ran:
        return CREATED

    outcome = await driver.drive(flow.attempt(script.context, script.attempt), run)
    assert outcome == CREATED
    record = store.get(script.attempt.claim.key_hash)
    assert record is not None and record.status is Status.COMPLETED


async def test_the_async_driver_refuses_to_wait_for_a_stream() -> None:
    script = Scripted()
    store = MemoryStore()
    driver = AsyncDriver(
        store, script.clock, LoopRenewals(store, script.context.reporter, script.clock)
    )

    def waits() -> Generator[Effect, Any, None]:
        yield AwaitStreamEnd()

    with pytest.raises(TypeError, match="cannot interpret"):
        await driver.drive(waits())


class RefusingClaims(MemoryStore):
    """A MemoryStore whose first claim lands but answers as if the connection was cut."""

    async def aclaim(self, request: Any) -> Any:
        self.claim(request)
        raise StoreUnavailable("answer lost")


@pytest.mark.parametrize(
    ("level", "logged"),
    [
        (logging.INFO, []),
        (logging.DEBUG, ["idempotency key claimed", "idempotent response stored"]),
    ],
)
def test_with_no_hook_a_new_keys_events_are_logged_only_at_debug(
    caplog: pytest.LogCaptureFixture, level: int, logged: list[str]
) -> None:
    clock = FakeClock()
    options = Options.build(clock=clock)  # no on_event: the log is the only listener
    context = flow.Context.for_options(options, None)
    store = MemoryStore(clock=clock)
    driver = SyncDriver(store, clock, ThreadRenewals(store, context.reporter, clock))
    caplog.set_level(level, logger="idempotency_middleware")

    outcome = driver.drive(
        flow.attempt(context, order_attempt(options, clock.now(), b"{}")),
        lambda: Ran(201, [], b"{}"),
    )

    assert isinstance(outcome, Ran) and outcome.status == 201
    assert [record.getMessage() for record in caplog.records] == logged


def test_the_handlers_attempt_is_made_at_its_first_ask_and_finished_with_its_run() -> None:
    attempt = order_attempt(Options.build(), 1000.0, b"{}")
    announced = announce(Run(attempt, 1000.0, True), "the store")
    entered = CURRENT.set(announced)
    try:
        asked = current_attempt("test")
        assert current_attempt("test") is asked  # made once
        assert (asked.claim, asked.store, asked.finished) == (attempt.claim, "the store", False)
    finally:
        assert finish_announced(announced) is asked
        CURRENT.reset(entered)
    assert asked.finished  # a Transaction kept past its attempt takes no writes

    # Asked first after the run ended, in a context copied while it ran (a thread the
    # handler started): finished all the same.
    late = announce(Run(attempt, 1000.0, True), None)
    copied = contextvars.Context()
    copied.run(CURRENT.set, late)
    assert finish_announced(late) is None  # nobody had asked
    assert copied.run(current_attempt, "test").finished


class ClaimsCounted(MemoryStore):
    """A MemoryStore whose claims and completions are counted, its async methods marked as
    wrapping the sync ones (as MemoryStore's are): they count too, should they be awaited."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def claim(self, request: ClaimRequest) -> Any:
        self.calls.append("claim")
        return super().claim(request)

    def complete(self, completion: Any) -> bool:
        self.calls.append("complete")
        return super().complete(completion)

    @awaits_nothing("claim")
    async def aclaim(self, request: ClaimRequest) -> Any:
        self.calls.append("aclaim")
        return self.claim(request)

    @awaits_nothing("complete")
    async def acomplete(self, completion: Any) -> bool:
        self.calls.append("acomplete")
        return self.complete(completion)


def test_only_an_async_method_marked_as_wrapping_its_sync_twin_is_bypassed() -> None:
    store = MemoryStore()
    assert sync_twin(store, "aclaim") == store.claim
    assert sync_twin(store, "acomplete") == store.complete
    # Overriding the async method without the mark: the driver awaits it as it is.
    refusing = RefusingClaims()
    assert sync_twin(refusing, "aclaim") is None
    assert sync_twin(refusing, "acomplete") == refusing.complete
    assert sync_twin(object(), "aclaim") is None


async def test_the_async_driver_calls_a_store_without_io_through_its_sync_methods() -> None:
    script = Scripted()
    store = ClaimsCounted()
    driver = AsyncDriver(
        store, script.clock, LoopRenewals(store, script.context.reporter, script.clock)
    )

    async def run() -> Ran:
        return Ran(201, [], b"{}")

    outcome = await driver.drive(flow.attempt(script.context, script.attempt), run)
    assert isinstance(outcome, Ran) and outcome.status == 201
    assert store.calls == ["claim", "complete"]  # the sync methods, never the async ones
    record = store.get(script.attempt.claim.key_hash)
    assert record is not None and record.status is Status.COMPLETED


async def test_the_async_driver_releases_a_lost_claim_in_a_background_task() -> None:
    script = Scripted()
    store = RefusingClaims()
    driver = AsyncDriver(
        store, script.clock, LoopRenewals(store, script.context.reporter, script.clock)
    )
    outcome = await driver.drive(flow.attempt(script.context, script.attempt))
    assert isinstance(outcome, decisions.Refusal) and outcome.status == 503
    assert store.get(script.attempt.claim.key_hash) is not None  # it landed
    for _ in range(10):  # the background task runs on this loop; the fake clock never waits
        await asyncio.sleep(0)
    assert store.get(script.attempt.claim.key_hash) is None


def test_a_claim_cancelled_while_renewing_before_its_run_is_released() -> None:
    script = Scripted()

    def answer(effect: Effect) -> Any:
        if isinstance(effect, Renew):
            raise asyncio.CancelledError
        return slow_claim(script, LOCK - 1)(effect)

    with pytest.raises(asyncio.CancelledError):
        script.run(answer)
    assert script.kinds() == ["ClaimRequest", "Renew", "Release"]
    assert script.event_kinds() == ["claimed", "released"]


def test_a_flow_closed_while_a_live_stream_is_pending_closes_cleanly() -> None:
    script = Scripted()
    running = without_bookkeeping(flow.attempt(script.context, script.attempt))
    assert isinstance(next(running), ClaimRequest)
    assert isinstance(running.send(CLAIMED), Run)
    assert running.send(LIVE) == AwaitStreamEnd()
    running.close()  # no "generator ignored GeneratorExit": nothing is yielded on close


def test_a_flow_closed_while_renewing_before_its_run_yields_nothing_more() -> None:
    script = Scripted()
    running = without_bookkeeping(flow.attempt(script.context, script.attempt))
    assert isinstance(next(running), ClaimRequest)
    script.clock.advance(LOCK)  # the claim took its whole lease to land
    assert isinstance(running.send(CLAIMED), Renew)
    running.close()  # no "generator ignored GeneratorExit"


class _Suspends:
    """An awaitable that suspends its coroutine once (no event loop needed)."""

    def __await__(self) -> Generator[None, None, None]:
        yield


def test_a_driver_closed_while_a_claim_is_in_flight_stops_without_further_effects() -> None:
    """A server shutting down destroys pending tasks: the garbage collector closes their
    coroutines, with no loop running. The attempt must then stop, not try to spawn a
    background release (which needs a running loop)."""
    script = Scripted()

    class HangingClaims(MemoryStore):
        async def aclaim(self, request: Any) -> Any:
            await _Suspends()
            raise AssertionError("never resumed")

    store = HangingClaims()
    driver = AsyncDriver(
        store, script.clock, LoopRenewals(store, script.context.reporter, script.clock)
    )
    coroutine = driver.drive(flow.attempt(script.context, script.attempt))
    coroutine.send(None)  # suspended inside the claim
    coroutine.close()  # raised "no running event loop" when the flow went on to spawn
    assert script.event_kinds() == []
