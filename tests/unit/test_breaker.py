"""The stores' circuit breaker (``idempotency_middleware/breaker.py``), on a ``FakeClock``.

Every transition: closed -> open after exactly ``threshold`` consecutive outage failures,
open refuses claims (cause ``breaker_open``, ``retry_after`` the cool-down left), the
cool-down's end admits one probe (half-open), whose success closes and whose failure reopens
it; a probe that never reports is replaced after a cool-down. Misconfiguration and contention
neither count nor close it, ``threshold=0`` turns it off, and its options are validated by
every store. Its transitions reach each door's ``on_event`` once and are logged once.

The outage itself, through the doors and a hanging DynamoDB, is tests/e2e/test_breaker_outage.py.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    SQLiteStore,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.errors import CAUSES
from idempotency_middleware.events import IdempotencyEvent, Reporter
from idempotency_middleware.stores.breaker import (
    DEFAULT_COOLDOWN_SECONDS,
    DEFAULT_THRESHOLD,
    OUTAGE_CAUSES,
    BreakerState,
    CircuitBreaker,
)
from idempotency_middleware.testing import FakeClock
from tests.support.faultproxy import Events, Workload

COOLDOWN = 10.0
THRESHOLD = 3
# What neither counts nor closes: misconfiguration (fixing the configuration fixes it) and
# contention on one item or file (it says nothing about the store's health).
NOT_OUTAGES = sorted(set(CAUSES) - OUTAGE_CAUSES)


def state(target: CircuitBreaker) -> BreakerState:
    """The breaker's state, read afresh (a function, so that mypy does not narrow it)."""
    return target.state


def outage(cause: str = "timed_out") -> StoreUnavailableError:
    return StoreUnavailableError(
        f"the store failed ({cause}, test)",
        cause=cause,
        code="ReadTimeoutError",
        reason=f"{cause} in the test",
    )


def breaker(
    threshold: int = THRESHOLD, cooldown: float = COOLDOWN
) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(threshold, cooldown, clock), clock


def fail(target: CircuitBreaker, times: int, cause: str = "timed_out") -> None:
    for _ in range(times):
        target.failed(outage(cause))


def refusal(target: CircuitBreaker) -> StoreUnavailableError:
    """The error ``admit()`` raises; fails the test when it admits the claim."""
    with pytest.raises(StoreUnavailableError) as raised:
        target.admit()
    return raised.value


def opened(
    threshold: int = THRESHOLD, cooldown: float = COOLDOWN
) -> tuple[CircuitBreaker, FakeClock]:
    target, clock = breaker(threshold, cooldown)
    fail(target, threshold)
    assert state(target) == "open"
    return target, clock


# --- closed -> open -----------------------------------------------------------------------


def test_it_opens_after_exactly_threshold_consecutive_outage_failures() -> None:
    target, _ = breaker()
    fail(target, THRESHOLD - 1)
    assert state(target) == "closed"
    target.admit()  # one fewer than the threshold: claims still go to the store

    fail(target, 1)
    assert state(target) == "open"
    assert refusal(target).cause == "breaker_open"


def test_a_success_in_between_resets_the_count() -> None:
    target, _ = breaker()
    fail(target, THRESHOLD - 1)
    target.succeeded()
    fail(target, THRESHOLD - 1)
    assert state(target) == "closed"
    target.admit()
    fail(target, 1)
    assert state(target) == "open"


@pytest.mark.parametrize("cause", sorted(OUTAGE_CAUSES))
def test_every_outage_cause_counts(cause: str) -> None:
    target, _ = breaker(threshold=1)
    target.failed(outage(cause))
    assert state(target) == "open"


def test_the_outage_causes_are_the_store_being_down_slow_shedding_load_or_unreplicated() -> None:
    expected = {"unreachable", "timed_out", "throttled", "server_error", "io_error"}
    expected.add("not_replicated")  # (replicas lagging or gone: no claim can be kept durably)
    assert expected == OUTAGE_CAUSES
    # (unknown: a request the store refused as written, a 4xx it has no cause for)
    assert {"no_table", "access_denied", "busy", "write_conflict", "unknown"} <= set(NOT_OUTAGES)


# --- open -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "retry_after"),
    [(0.0, 10), (0.5, 10), (1.0, 9), (6.2, 4), (9.0, 1), (9.5, 1), (9.999, 1)],
)
def test_open_refuses_claims_with_the_cooldown_left_rounded_up(
    elapsed: float, retry_after: int
) -> None:
    target, clock = opened()
    clock.advance(elapsed)
    refused = refusal(target)
    assert refused.cause == "breaker_open"
    assert refused.retry_after == retry_after
    assert state(target) == "open"


def test_a_fractional_cooldown_is_rounded_up_and_never_below_one_second() -> None:
    target, _ = opened(cooldown=2.5)
    assert refusal(target).retry_after == 3
    target, _ = opened(cooldown=0.2)
    assert refusal(target).retry_after == 1


def test_the_refusal_names_the_last_failure() -> None:
    target, _ = breaker()
    fail(target, THRESHOLD - 1, "throttled")
    last = outage("unreachable")
    target.failed(last)
    refused = refusal(target)
    assert refused.__cause__ is last
    assert refused.code == last.code
    assert refused.misconfigured is False
    assert f"failed {THRESHOLD} times in a row" in str(refused)
    assert "unreachable in the test" in str(refused)


def test_the_state_stays_open_after_the_cooldown_until_a_claim_probes() -> None:
    target, clock = opened()
    clock.advance(COOLDOWN * 3)
    assert state(target) == "open"


def test_failures_while_open_neither_extend_the_cooldown_nor_report_again() -> None:
    """A completion or release of work that ran is still sent while open; its failure keeps
    the breaker open for the cool-down it already had."""
    target, clock = opened()
    clock.advance(COOLDOWN - 1)
    fail(target, 5)
    assert state(target) == "open"
    assert refusal(target).retry_after == 1
    clock.advance(1)
    target.admit()  # the first cool-down's end admits the probe
    assert state(target) == "half_open"


# --- half-open ------------------------------------------------------------------------------


def test_after_the_cooldown_exactly_one_probe_is_admitted_while_others_are_refused() -> None:
    target, clock = opened()
    clock.advance(COOLDOWN - 0.001)
    assert refusal(target).cause == "breaker_open"
    clock.advance(0.001)
    target.admit()  # the probe
    assert state(target) == "half_open"
    for _ in range(3):
        refused = refusal(target)
        assert refused.cause == "breaker_open"
        # Until the probe's own cool-down runs out, should it never report.
        assert refused.retry_after == math.ceil(COOLDOWN)
    clock.advance(4)
    assert refusal(target).retry_after == math.ceil(COOLDOWN - 4)


def test_the_probes_success_closes_the_breaker() -> None:
    target, clock = opened()
    clock.advance(COOLDOWN)
    target.admit()
    target.succeeded()
    assert state(target) == "closed"
    for _ in range(5):
        target.admit()
    # Closed again from scratch: it takes a whole threshold to open it again.
    fail(target, THRESHOLD - 1)
    assert state(target) == "closed"


def test_the_probes_failure_opens_it_again_for_a_new_cooldown() -> None:
    target, clock = opened()
    clock.advance(COOLDOWN)
    target.admit()
    clock.advance(2)  # the probe takes its time, then fails
    fail(target, 1)  # one failure is enough: it was the probe
    assert state(target) == "open"
    refused = refusal(target)
    assert refused.retry_after == math.ceil(COOLDOWN)
    clock.advance(COOLDOWN - 0.5)
    assert refusal(target).retry_after == 1
    clock.advance(0.5)
    target.admit()
    assert state(target) == "half_open"


def test_a_probe_that_never_reports_is_replaced_after_a_cooldown() -> None:
    """Its caller was cancelled mid-call: neither success nor failure ever comes."""
    target, clock = opened()
    clock.advance(COOLDOWN)
    target.admit()
    clock.advance(COOLDOWN - 0.5)
    assert refusal(target).retry_after == 1
    clock.advance(0.5)
    target.admit()  # the replacement probe
    assert state(target) == "half_open"
    assert refusal(target).retry_after == math.ceil(COOLDOWN)
    target.succeeded()
    assert state(target) == "closed"


# --- what does not count --------------------------------------------------------------------


def test_threshold_zero_never_opens() -> None:
    target, _ = breaker(threshold=0)
    fail(target, 1000)
    assert state(target) == "closed"
    target.admit()


@pytest.mark.parametrize("cause", NOT_OUTAGES)
def test_misconfiguration_and_contention_neither_count_nor_reset(cause: str) -> None:
    target, _ = breaker()
    fail(target, THRESHOLD - 1)
    fail(target, 2 * THRESHOLD, cause)
    assert state(target) == "closed"
    fail(target, 1)  # the outage count went on from where it was
    assert state(target) == "open"


@pytest.mark.parametrize("cause", NOT_OUTAGES)
def test_misconfiguration_and_contention_neither_close_nor_reopen(cause: str) -> None:
    target, clock = opened()
    target.failed(outage(cause))
    assert state(target) == "open"
    clock.advance(COOLDOWN)
    target.admit()
    target.failed(outage(cause))  # the probe was refused for its configuration, say
    assert state(target) == "half_open"
    assert refusal(target).retry_after == math.ceil(COOLDOWN)


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [True, False, -1, 1.5, 2.0, "3", None])
def test_a_bad_threshold_is_refused_naming_the_option(threshold: Any) -> None:
    with pytest.raises(ValueError, match="breaker_threshold must be a non-negative integer"):
        CircuitBreaker(threshold, COOLDOWN, FakeClock())


@pytest.mark.parametrize("cooldown", [0, 0.0, -1.0, math.inf, math.nan, True, "5", None])
def test_a_bad_cooldown_is_refused_naming_the_option(cooldown: Any) -> None:
    with pytest.raises(ValueError, match="breaker_cooldown_seconds must be a positive, finite"):
        CircuitBreaker(THRESHOLD, cooldown, FakeClock())


def test_good_options_are_kept() -> None:
    target = CircuitBreaker(0, 1, FakeClock())
    assert (target.threshold, target.cooldown_seconds) == (0, 1.0)
    assert isinstance(target.cooldown_seconds, float)
    assert CircuitBreaker(7, 0.001).cooldown_seconds == 0.001


StoreFactory = Callable[..., Any]


def _stores(tmp_path: Path) -> dict[str, StoreFactory]:
    dynamodb: dict[str, Any] = {"region_name": "us-east-1", "endpoint_url": "http://127.0.0.1:9"}
    return {
        "MemoryStore": lambda **kw: MemoryStore(**kw),
        "SQLiteStore": lambda **kw: SQLiteStore(str(tmp_path / "breaker.sqlite3"), **kw),
        "DynamoDBStore": lambda **kw: DynamoDBStore("idempotency", **dynamodb, **kw),
        "AsyncDynamoDBStore": lambda **kw: AsyncDynamoDBStore("idempotency", **dynamodb, **kw),
    }


STORE_NAMES = ("MemoryStore", "SQLiteStore", "DynamoDBStore", "AsyncDynamoDBStore")


@pytest.mark.parametrize("name", STORE_NAMES)
def test_every_store_takes_the_options_and_exposes_the_state_on_its_clock(
    name: str, tmp_path: Path
) -> None:
    clock = FakeClock()
    store = _stores(tmp_path)[name](breaker_threshold=2, breaker_cooldown_seconds=7.5, clock=clock)
    assert (store.breaker.threshold, store.breaker.cooldown_seconds) == (2, 7.5)
    assert state(store.breaker) == "closed"
    fail(store.breaker, 2)
    assert state(store.breaker) == "open"
    assert refusal(store.breaker).retry_after == 8
    clock.advance(7.5)  # the store's clock times the cool-down
    store.breaker.admit()
    assert state(store.breaker) == "half_open"


@pytest.mark.parametrize("name", STORE_NAMES)
def test_every_store_defaults_to_five_failures_and_five_seconds(name: str, tmp_path: Path) -> None:
    store = _stores(tmp_path)[name]()
    assert (DEFAULT_THRESHOLD, DEFAULT_COOLDOWN_SECONDS) == (5, 5.0)
    assert store.breaker.threshold == DEFAULT_THRESHOLD
    assert store.breaker.cooldown_seconds == DEFAULT_COOLDOWN_SECONDS


@pytest.mark.parametrize("name", STORE_NAMES)
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"breaker_threshold": -1}, "breaker_threshold"),
        ({"breaker_threshold": True}, "breaker_threshold"),
        ({"breaker_cooldown_seconds": 0}, "breaker_cooldown_seconds"),
        ({"breaker_cooldown_seconds": math.inf}, "breaker_cooldown_seconds"),
    ],
)
def test_every_store_refuses_bad_options_naming_them(
    name: str, options: dict[str, Any], named: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=named):
        _stores(tmp_path)[name](**options)


def test_a_finishing_call_the_store_answers_closes_an_open_breaker(tmp_path: Path) -> None:
    """Completions, releases and reads still go to the store while the breaker is open (work
    that ran must be finished); one the store answers shows it is back: closed, no probe."""
    clock = FakeClock()
    store = SQLiteStore(str(tmp_path / "finishing.sqlite3"), clock=clock, breaker_threshold=1)
    try:
        store.breaker.failed(outage())
        assert state(store.breaker) == "open"
        assert store.release("some-key", "some-owner") is False  # answered: nothing to release
        assert state(store.breaker) == "closed"
    finally:
        store.close()


# --- events and logs --------------------------------------------------------------------------


async def _asgi_app(scope: Any, receive: Any, send: Any) -> None:  # never called
    raise AssertionError("not served")


def _function_door(store: MemoryStore, hook: Events) -> Callable[[str], dict[str, str]]:
    @idempotent(store=store, key="order", on_event=hook)
    def charge(order: str) -> dict[str, str]:
        return {"charged": order}

    return charge


def _breaker_events(hook: Events) -> list[IdempotencyEvent]:
    return hook.of("breaker_open") + hook.of("breaker_closed")


def test_transitions_reach_every_doors_on_event_once_without_a_key() -> None:
    store = MemoryStore()
    asgi_hook, wsgi_hook, function_hook = Events(), Events(), Events()
    doors = [
        IdempotencyMiddleware(_asgi_app, store=store, on_event=asgi_hook),
        IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=wsgi_hook),
        _function_door(store, function_hook),
    ]

    fail(store.breaker, DEFAULT_THRESHOLD - 1, "throttled")
    store.breaker.failed(outage("server_error"))
    store.breaker.failed(outage("server_error"))  # open already: no second event
    store.breaker.succeeded()
    store.breaker.succeeded()  # closed already: no second event

    for hook in (asgi_hook, wsgi_hook, function_hook):
        [opened_event] = hook.of("breaker_open")
        assert opened_event.cause == "server_error"
        assert opened_event.error is not None and "server_error" in opened_event.error
        [closed_event] = hook.of("breaker_closed")
        assert closed_event.cause is None and closed_event.error is None
        for event in (opened_event, closed_event):
            assert (event.key_hash, event.method, event.route) == ("", "", "")
            assert event.status is None
        assert [kind for _, kind in _kinds(hook)] == ["breaker_open", "breaker_closed"]
    assert len(doors) == 3


def _kinds(hook: Events) -> list[tuple[float, str]]:
    timed = [(at, event.kind) for at, event in hook.timed("breaker_open")]
    timed += [(at, event.kind) for at, event in hook.timed("breaker_closed")]
    return sorted(timed)


def test_two_doors_sharing_one_hook_hear_of_a_transition_once() -> None:
    store = MemoryStore()
    hook = Events()
    doors = [
        IdempotencyMiddleware(_asgi_app, store=store, on_event=hook),
        IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=hook),
        _function_door(store, hook),
    ]
    fail(store.breaker, DEFAULT_THRESHOLD)
    store.breaker.succeeded()
    assert len(hook.of("breaker_open")) == 1
    assert len(hook.of("breaker_closed")) == 1
    assert len(doors) == 3


def test_a_door_without_a_hook_and_a_door_of_another_store_hear_nothing() -> None:
    store, other = MemoryStore(), MemoryStore()
    hook = Events()
    quiet = IdempotencyMiddleware(_asgi_app, store=store)
    elsewhere = IdempotencyMiddleware(_asgi_app, store=other, on_event=hook)
    fail(store.breaker, DEFAULT_THRESHOLD)
    assert state(store.breaker) == "open"
    assert state(other.breaker) == "closed"
    assert not _breaker_events(hook)
    assert quiet is not elsewhere


def test_a_door_that_was_garbage_collected_no_longer_hears_of_transitions() -> None:
    store = MemoryStore()
    kept_hook, dropped_hook = Events(), Events()
    kept = IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=kept_hook)
    dropped: object = IdempotencyMiddleware(_asgi_app, store=store, on_event=dropped_hook)
    dropped_function: object = _function_door(store, dropped_hook)
    del dropped, dropped_function
    gc.collect()

    fail(store.breaker, DEFAULT_THRESHOLD)
    store.breaker.succeeded()
    assert len(kept_hook.of("breaker_open")) == 1
    assert len(kept_hook.of("breaker_closed")) == 1
    assert not _breaker_events(dropped_hook)
    assert kept is not None


def test_a_hook_that_raises_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="idempotency_middleware")
    store = MemoryStore()
    hook = Events()

    def broken(event: IdempotencyEvent) -> None:
        raise RuntimeError("the hook broke")

    doors = [
        IdempotencyMiddleware(_asgi_app, store=store, on_event=broken),
        IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=hook),
    ]
    fail(store.breaker, DEFAULT_THRESHOLD)
    assert len(hook.of("breaker_open")) == 1
    assert any(
        record.getMessage() == "on_event hook raised; event dropped" for record in caplog.records
    )
    assert len(doors) == 2


def test_a_store_event_names_the_cause_of_any_failure() -> None:
    """``Reporter.report_store`` with a failure that is not a store error: cause unknown."""
    hook = Events()
    Reporter(hook).report_store("breaker_open", failure=RuntimeError("boom"))
    Reporter(None).report_store("breaker_open", failure=RuntimeError("ignored"))
    [event] = hook.of("breaker_open")
    assert event.cause == "unknown"
    assert event.error == "RuntimeError('boom')"


def _breaker_logs(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    return [
        (getattr(record, "idempotency_event", ""), record.levelno)
        for record in caplog.records
        if getattr(record, "idempotency_event", "").startswith("breaker_")
    ]


def test_each_transition_is_logged_once_however_many_doors_share_the_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="idempotency_middleware")
    clock = FakeClock()
    store = MemoryStore(clock=clock, breaker_threshold=2, breaker_cooldown_seconds=COOLDOWN)
    doors = [
        IdempotencyMiddleware(_asgi_app, store=store, on_event=Events()),
        IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=Events()),
        IdempotencyWSGIMiddleware(Workload().wsgi, store=store),
    ]
    fail(store.breaker, 2, "unreachable")
    fail(store.breaker, 3)  # while open: no new transition
    assert _breaker_logs(caplog) == [("breaker_open", logging.ERROR)]
    [opened_log] = [
        r for r in caplog.records if getattr(r, "idempotency_event", "") == "breaker_open"
    ]
    message = opened_log.getMessage()
    assert "opened after 2 consecutive failures" in message
    assert "unreachable in the test" in message
    assert f"for {COOLDOWN:.1f} s" in message

    clock.advance(COOLDOWN)
    store.breaker.admit()
    fail(store.breaker, 1)  # the probe failed: opened again, logged again
    clock.advance(COOLDOWN)
    store.breaker.admit()
    store.breaker.succeeded()
    assert _breaker_logs(caplog) == [
        ("breaker_open", logging.ERROR),
        ("breaker_open", logging.ERROR),
        ("breaker_closed", logging.WARNING),
    ]
    assert len(doors) == 3


# --- threads ------------------------------------------------------------------------------------

THREADS = 16


def _at_once(action: Callable[[], object], count: int = THREADS) -> list[BaseException]:
    """Run ``action`` on ``count`` threads released together; the exceptions they raised."""
    barrier = threading.Barrier(count, timeout=60)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        try:
            action()
        except BaseException as error:
            with lock:
                errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    return errors


@pytest.fixture
def shared() -> Iterator[tuple[MemoryStore, Events, FakeClock]]:
    clock = FakeClock()
    store = MemoryStore(clock=clock, breaker_threshold=4, breaker_cooldown_seconds=COOLDOWN)
    hook = Events()
    door = IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=hook)
    yield store, hook, clock
    assert door is not None


def test_many_threads_failing_at_once_open_it_once(
    shared: tuple[MemoryStore, Events, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="idempotency_middleware")
    store, hook, _ = shared
    for _ in range(20):  # twenty rounds, to give a race its chances
        hook.clear()
        caplog.clear()
        assert not _at_once(lambda: store.breaker.failed(outage()))
        assert state(store.breaker) == "open"
        assert len(hook.of("breaker_open")) == 1
        assert _breaker_logs(caplog) == [("breaker_open", logging.ERROR)]
        assert not _at_once(store.breaker.succeeded)
        assert state(store.breaker) == "closed"
        assert len(hook.of("breaker_closed")) == 1


def test_many_claims_at_the_end_of_the_cooldown_admit_exactly_one_probe(
    shared: tuple[MemoryStore, Events, FakeClock],
) -> None:
    store, _, clock = shared
    fail(store.breaker, 4)
    for _ in range(20):
        clock.advance(COOLDOWN)
        errors = _at_once(store.breaker.admit)
        assert len(errors) == THREADS - 1
        assert all(
            isinstance(error, StoreUnavailableError) and error.cause == "breaker_open"
            for error in errors
        )
        assert state(store.breaker) == "half_open"
        store.breaker.failed(outage())  # the probe failed: open for another cool-down


# --- probes that settle nothing, the opening failure, event order, bound-method hooks ---------


@pytest.mark.parametrize("cause", ["busy", "write_conflict", "no_table", "unknown"])
def test_a_probe_that_settles_nothing_lets_the_next_claim_probe(cause: str) -> None:
    target, clock = opened()
    clock.advance(COOLDOWN)
    assert target.admit() is True  # the probe
    target.failed(outage(cause))  # neither an outage nor an answer
    assert state(target) == "half_open"
    target.end_probe()
    assert state(target) == "open"
    assert target.admit() is True  # at once, not a cool-down later


def test_a_probe_with_a_verdict_is_left_as_it_settled() -> None:
    target, clock = opened()
    clock.advance(COOLDOWN)
    assert target.admit() is True
    target.succeeded()
    target.end_probe()
    assert state(target) == "closed"
    assert target.admit() is False  # closed: an ordinary claim, not a probe


def test_the_failure_that_opens_it_is_told_the_cool_down() -> None:
    target, _ = breaker(threshold=2, cooldown=7.5)
    first, second = outage(), outage()
    target.failed(first)
    target.failed(second)
    assert first.retry_after is None  # counted, did not open it
    assert second.retry_after == 8


def test_a_report_overtaken_by_a_newer_transition_is_dropped() -> None:
    """Thread A opens it and is slow to report; thread B closes it and reports first: the
    hook hears ``breaker_closed`` only, so its last word matches the state."""
    opening = threading.Event()
    release_a = threading.Event()

    class SlowToReportAnOpening(CircuitBreaker):
        def _report(self, number: int, kind: Any, error: BaseException | None) -> None:
            if kind == "breaker_open":
                opening.set()
                assert release_a.wait(5)
            super()._report(number, kind, error)

    target = SlowToReportAnOpening(1, COOLDOWN, FakeClock())
    heard: list[str] = []
    reporter = Reporter(lambda event: heard.append(event.kind))
    target.subscribe(reporter)
    a = threading.Thread(target=target.failed, args=(outage(),))
    a.start()
    assert opening.wait(5)
    target.succeeded()  # B
    release_a.set()
    a.join(5)
    assert state(target) == "closed"
    assert heard == ["breaker_closed"]


def test_reports_are_delivered_one_at_a_time_in_order() -> None:
    """A slow hook still delivering ``breaker_open`` holds back the ``breaker_closed`` that
    follows, so a dashboard never ends on a stale ``open``."""
    target = CircuitBreaker(1, COOLDOWN, FakeClock())
    delivering = threading.Event()
    release = threading.Event()
    heard: list[str] = []

    def slow_hook(event: IdempotencyEvent) -> None:
        if event.kind == "breaker_open":
            delivering.set()
            assert release.wait(5)
        heard.append(event.kind)

    reporter = Reporter(slow_hook)
    target.subscribe(reporter)
    a = threading.Thread(target=target.failed, args=(outage(),))
    a.start()
    assert delivering.wait(5)
    b = threading.Thread(target=target.succeeded)
    b.start()
    release.set()
    a.join(5)
    b.join(5)
    assert state(target) == "closed"
    assert heard == ["breaker_open", "breaker_closed"]


class Metrics:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def on_event(self, event: IdempotencyEvent) -> None:
        self.kinds.append(event.kind)


def test_one_bound_method_hook_on_two_doors_hears_a_transition_once() -> None:
    store = MemoryStore(breaker_threshold=1)
    metrics = Metrics()
    doors = [
        IdempotencyWSGIMiddleware(Workload().wsgi, store=store, on_event=metrics.on_event)
        for _ in range(2)
    ]
    store.breaker.failed(outage())
    assert metrics.kinds == ["breaker_open"]
    assert len(doors) == 2


@pytest.mark.parametrize(
    ("code", "status", "cause"),
    [
        ("TransactionConflictException", 400, "write_conflict"),  # a claim during a commit
        ("ReplicatedWriteConflictException", 409, "write_conflict"),
        ("ValidationException", 400, "unknown"),  # refused as written: not an outage
        ("InternalServerError", 500, "server_error"),
    ],
)
def test_dynamodb_contention_and_refusals_do_not_count_as_outages(
    code: str, status: int, cause: str
) -> None:
    from botocore.exceptions import ClientError

    from idempotency_middleware.stores.dynamodb.errors import translate_error

    answer: Any = {
        "Error": {"Code": code, "Message": "from the test"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    translated = translate_error("put_item", ClientError(answer, "PutItem"), "idempotency")
    assert isinstance(translated, StoreUnavailableError)
    assert translated.cause == cause
    target, _ = breaker(threshold=1)
    target.failed(translated)
    assert state(target) == ("open" if cause in OUTAGE_CAUSES else "closed")
