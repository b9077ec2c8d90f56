"""The attempt flow under every interleaving, bounded (``tests/support/simulation.py`` says how).

``make test`` runs this bounded sweep (well under a minute); ``make simulate`` runs deeper
and longer. Each sweep's schedules, steps and time go to ``.cache/simulation.txt``, which
``make test`` prints at its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotency_middleware.stores.records import COMPLETED
from tests.support import simulation
from tests.support.simulation import AttemptSpec, Report, Scenario, explore, sample

SUMMARY = Path(__file__).resolve().parents[2] / ".cache" / "simulation.txt"


@pytest.fixture(autouse=True)
def _untraced() -> Iterator[None]:
    """make test runs the suite under coverage, whose tracing makes these sweeps about five
    times slower: they run the same flow code hundreds of thousands of times, code the rest
    of the suite covers. Tracing is paused while they run."""
    try:
        import coverage
    except ImportError:  # (the other Pythons' runs have no coverage)
        yield
        return
    current = coverage.Coverage.current()
    if current is None:
        yield
        return
    current.stop()
    try:
        yield
    finally:
        current.start()


@pytest.fixture(scope="module")
def summary() -> Iterator[list[str]]:
    lines: list[str] = []
    yield lines
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text("".join(line + "\n" for line in lines))


def _passes(report: Report, summary: list[str]) -> None:
    summary.append(simulation.describe(report).splitlines()[0])
    assert report.violation is None, simulation.describe(report)


@pytest.mark.parametrize(
    "scenario", simulation.two_attempts(), ids=lambda scenario: scenario.describe()
)
def test_two_attempts_every_schedule_with_one_fault(scenario: Scenario, summary: list[str]) -> None:
    report = explore(scenario, fault_budget=1, max_steps=40)
    assert report.exhausted
    _passes(report, summary)


@pytest.mark.parametrize(
    "scenario",
    [
        Scenario((simulation.SAME, simulation.SAME), "http"),
        Scenario((simulation.SAME, AttemptSpec(wait_seconds=2.0)), "function"),
    ],
    ids=lambda scenario: scenario.describe(),
)
def test_two_attempts_every_schedule_with_two_faults(
    scenario: Scenario, summary: list[str]
) -> None:
    report = explore(scenario, fault_budget=2, max_steps=40)
    assert report.exhausted
    _passes(report, summary)


@pytest.mark.parametrize(
    "scenario", simulation.three_attempts(), ids=lambda scenario: scenario.describe()
)
def test_three_attempts_random_schedules(scenario: Scenario, summary: list[str]) -> None:
    report = sample(scenario, seed=20261129, schedules=1500, fault_budget=6, max_steps=60)
    _passes(report, summary)


@pytest.mark.parametrize(
    "scenario", simulation.two_attempts(), ids=lambda scenario: scenario.describe()
)
def test_two_attempts_random_schedules_with_lasting_outages(
    scenario: Scenario, summary: list[str]
) -> None:
    report = sample(scenario, seed=20261129, schedules=800, fault_budget=8, max_steps=60)
    _passes(report, summary)


def test_a_clock_beyond_the_skew_margin_is_what_lets_a_second_run_in(
    summary: list[str],
) -> None:
    """The checker can fail: counted strictly, a clock ahead by more than the lock and its
    margin takes a live owner's key over and runs the handler again (the documented limit),
    and the shortest schedule says so in a few steps."""
    report = explore(simulation.beyond_the_margin(strict=True), fault_budget=0, max_steps=40)
    assert report.violation is not None and report.violation.violation is not None
    assert report.violation.violation.rule == "once"
    assert len(report.violation.log) <= 6, simulation.describe(report)
    lenient = explore(simulation.beyond_the_margin(strict=False), fault_budget=1, max_steps=40)
    _passes(lenient, summary)


def test_a_completion_cancelled_before_it_landed_is_sent_again() -> None:
    """The schedule that found a finished handler run twice: the caller cancelled while its
    completion was on the wire, and a retry after the lock timeout."""
    scenario = Scenario((simulation.SAME, simulation.LATE_RETRY), "function")
    world = simulation.World(scenario)
    for choice in [
        ("#0", "go"),  # start
        ("#0", "ok"),  # claim
        ("#0", "returns"),  # the handler
        ("#0", "cancel_before"),  # the completion, cut short before it landed
        ("#0", "ok"),  # sent once more before the cancellation goes on
    ]:
        world.step(simulation.Choice(*choice))
    first = world.actor("#0")
    assert first.ended and isinstance(first.raised, simulation.Cancelled)
    record = world.store.get(world.key_hash)
    assert record is not None and record.status is COMPLETED
    while choices := world.choices(0):
        world.step(choices[0])
    world.check_end()
    assert [run.actor for run in world.ledger] == ["#0"]
    assert world.actor("#1").outcome == world.ledger[0].response


def test_a_completion_the_store_refused_four_times_lands_once_it_answers() -> None:
    """The schedule that found a finished handler run twice after a brief outage: four
    completions refused (about 0.2 s), and a retry after the lock timeout. The completion
    is retried for as long as the lease lasts, and lands when the store answers."""
    scenario = Scenario((simulation.SAME, simulation.LATE_RETRY), "http")
    world = simulation.World(scenario)
    steps = [("#0", "go"), ("#0", "ok"), ("#0", "returns"), ("#0", "fail_before")]
    steps += [("#0", "go"), ("#0", "fail_before")] * 3
    for choice in steps:
        world.step(simulation.Choice(*choice))
    assert not world.actor("#0").ended  # still completing, within its lease
    while choices := world.choices(0):
        world.step(choices[0])
    world.check_end()
    record = world.store.get(world.key_hash)
    assert record is not None and record.status is COMPLETED
    assert [run.actor for run in world.ledger] == ["#0"]
    assert world.actor("#1").outcome == world.ledger[0].response
