"""Deterministic simulation of the real attempt flow: "once", checked under every interleaving.

The engine's attempt (``engine.flow.attempt``) is a generator of effects with no I/O in it,
the code every door runs (the HTTP doors, ``idempotent`` functions, consumers). Here a
simulation driver interprets those effects for two or three attempts on ONE key, against the
real ``MemoryStore`` (the stores' protocol semantics, checked against every other store by
the contract and model suites) on a simulated clock, and chooses at every step:

- which attempt moves next (the interleaving);
- what the world does to a store call: nothing (``ok``), a failure before the write
  (``fail_before``: nothing landed), a failure after it (``fail_after``: it landed, its
  answer was lost), a ``timeout`` (landed, and a second passed), the caller's cancellation
  before or after the write landed (``cancel_before``, ``cancel_after``), a ``crash`` (the
  attempt's process never continues, its background work neither), a ``pause`` past the
  lock timeout before the call goes out;
- what the handler does (``Run``): returns a response, raises, answers 5xx, is cancelled, the
  process crashes in it, or it pauses past the lock timeout and then returns;
- per attempt, when it starts (at once, or after every lock has timed out) and how far its
  clock is off (within the skew margin or beyond it).

After every step it checks the invariants of the Correctness page:

1. **Once**: a handler starts while an earlier run of the key finished with a response to
   keep (or is still running) only if that earlier owner lost its lease: it crashed, paused
   past the lock timeout, was cut off from the store, or a clock beyond the skew margin
   took it over.
2. **Fencing**: a complete, release or renew by an owner that does not hold the key changes
   nothing.
3. **Replays**: every replay is the completed response of the same fingerprint, byte for
   byte.
4. **No stuck key**: once every attempt (and its background work) ended, the key is not held
   in progress, unless by an owner that crashed, paused, or was cut off from the store.
5. **Answers**: every caller's answer is one the docs list for its situation (its own run,
   a replay, 409, 422, 503 only after a store failure, the cancellation it was dealt, the
   handler's own exception), and no flow raises anything else.

Exploration is exhaustive (stateless: each schedule re-executes from the start, following a
prefix of choices) up to a bound on injected faults and steps, or random with a seed. A
violation is reported with its seed (or choice path) and the shortest schedule found that
shows it (greedy shrinking), as readable steps.

Run longer sweeps with ``make simulate`` (``SEED=``, ``DEPTH=``, ``SCHEDULES=``) or
``python -m tests.support.simulation --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import random
import sys
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from idempotency_middleware.engine import decisions
from idempotency_middleware.engine import flow as engine
from idempotency_middleware.engine.effects import (
    Effect,
    Emit,
    EndLease,
    Ran,
    Recall,
    Release,
    Remember,
    Renew,
    Run,
    Sleep,
    Spawn,
    Wait,
    emit,
)
from idempotency_middleware.engine.refusals import Refusal
from idempotency_middleware.events import IdempotencyEvent, Reporter
from idempotency_middleware.policy.options import Options
from idempotency_middleware.stores.memory import MemoryStore
from idempotency_middleware.stores.protocol import ClaimRequest, Completion, StoreUnavailable
from idempotency_middleware.stores.records import IN_PROGRESS, Record, StoredResponse

LOCK_TIMEOUT = 10.0
SKEW_MARGIN = 1.0
# A pause (a stopped process, a long GC, a partition) outlasts the lock and its margin.
PAUSE = LOCK_TIMEOUT + SKEW_MARGIN + 0.5
# An attempt that starts "late" comes after every lock taken before it has timed out.
LATE = LOCK_TIMEOUT + SKEW_MARGIN + 1.0
STORE_CALL = 0.001  # the simulated time a store call takes
TIMEOUT = 1.0  # how long a call that times out took
START = 1_000_000.0

STORE_FAULTS = (
    "ok",
    "fail_before",
    "fail_after",
    "timeout",
    "cancel_before",
    "cancel_after",
    "crash",
    "pause",
)
# "pause": the handler stops mid-run past the lock timeout, then returns; "paused_first": the
# process stops between the claim's answer and the handler's start.
RUN_OUTCOMES = ("returns", "raises", "answers_5xx", "cancelled", "crash", "pause", "paused_first")
# The faults that take a lease from its owner through no fault of the engine. (A store
# failure is not one: the simulated outages are brief, far shorter than the lock timeout,
# and an owner cut off for less than its lock must not lose its key.)
LEASE_FAULTS = {"crash", "pause", "paused_first"}


class Cancelled(asyncio.CancelledError):
    """The caller's cancellation, as the async driver throws it into the flow."""


class HandlerFailed(RuntimeError):
    """The handler's own exception."""


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt of the scenario."""

    payload: str = "same"  # attempts with other payloads have other fingerprints
    late: bool = False  # starts after every earlier lock timed out
    skew: float = 0.0  # how far its clock is ahead of true time
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class Scenario:
    """Who tries the key, through which door."""

    attempts: tuple[AttemptSpec, ...]
    door: str = "http"  # "http" (the HTTP doors) or "function" (functions, consumers)
    name: str = ""
    # A clock beyond the skew margin voids the lease, as documented; True counts the
    # second run it allows as a violation all the same (to show the margin matters).
    strict_clocks: bool = False

    def describe(self) -> str:
        parts = []
        for number, spec in enumerate(self.attempts):
            bits = [f"#{number}"]
            if spec.payload != "same":
                bits.append("other payload")
            if spec.late:
                bits.append("late")
            if spec.skew:
                bits.append(f"clock +{spec.skew:g}s")
            if spec.wait_seconds:
                bits.append(f"waits {spec.wait_seconds:g}s")
            parts.append(" ".join(bits))
        return f"{self.door} door: " + ", ".join(parts)


@dataclass(frozen=True)
class Choice:
    actor: str
    action: str  # a store fault, a Run outcome, or "go" (no fault to choose)


class Violation(Exception):
    """An invariant broken: ``rule`` is once, fencing, replays, stuck or answers."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule


class SimClock:
    """One attempt's clock: the world's true time plus its skew."""

    def __init__(self, world: World, skew: float) -> None:
        self._world = world
        self._skew = skew

    def now(self) -> float:
        return self._world.now + self._skew

    def sleep(self, seconds: float) -> None:  # the engine never sleeps itself
        raise AssertionError("the simulated clock is advanced by the world")

    async def asleep(self, seconds: float) -> None:
        raise AssertionError("the simulated clock is advanced by the world")


class FixedEntropy:
    """Jitter pinned to the middle of its range: the schedule is the only choice."""

    def owner(self) -> str:
        raise AssertionError("owners are given by the world")

    def jitter(self) -> float:
        return 0.5


@dataclass
class HandlerRun:
    """One start of the handler."""

    owner: str
    actor: str
    state: str = "running"  # running, kept, discarded, cancelled, crashed
    response: StoredResponse | None = None


@dataclass
class Actor:
    """An attempt, or a background flow one spawned (its ``process``'s)."""

    name: str
    process: str
    flow: Generator[Effect, Any, Any] | None
    owner: str
    spec: AttemptSpec
    background: bool = False
    started: bool = False
    pending: Any = None  # the effect it waits to have performed
    ready_at: float = 0.0
    ended: bool = False
    crashed: bool = False
    outcome: object = None
    raised: BaseException | None = None
    injected: set[str] = field(default_factory=set)
    events: list[IdempotencyEvent] = field(default_factory=list)  # its attempt's

    @property
    def gave_up_completing(self) -> bool:
        """Its completion was refused for as long as it is retried (the documented bound:
        5 s, or the lease): a second run after its lock timeout is the documented cost."""
        return any(
            event.kind == "store_error"
            and event.operation == "complete"
            and "gave up" in (event.error or "")
            for event in self.events
        )

    @property
    def fingerprint(self) -> str:
        return f"fp-{self.spec.payload}"


# The doors' options, the same for every schedule (an Options is frozen): built once, not
# once a schedule, where validating them was a quarter of a sweep's time.
OPTIONS = Options.build(
    lock_timeout_seconds=LOCK_TIMEOUT, clock_skew_seconds=SKEW_MARGIN, ttl_seconds=86400
)


class World:
    """One schedule of one scenario: the store, the clock, the attempts, the ledger."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.now = START
        self.store = MemoryStore(purge_interval_seconds=1e9)
        self.ledger: list[HandlerRun] = []
        self.actors: list[Actor] = []
        self.log: list[str] = []
        self.faults_used = 0
        # The store failure an attempt's process saw at its last store call, if any.
        self.last_store_fault: dict[str, str] = {}
        self.key_hash = "k" * 64
        self._background = itertools.count(1)
        options = OPTIONS
        http = scenario.door == "http"
        for number, spec in enumerate(scenario.attempts):
            actor = Actor(f"#{number}", f"#{number}", None, f"owner{number}", spec)
            context = engine.Context(
                Reporter(actor.events.append, http=http),
                SimClock(self, spec.skew),
                None,
                "fail",
                http,
                entropy=FixedEntropy(),
                stored_statuses=options.stored_statuses,
            )
            attempt = decisions.new_attempt(
                options.default_policy._replace(wait_seconds=spec.wait_seconds),
                "POST" if http else decisions.CALL_METHOD,
                "/orders",
                self.key_hash,
                f"fp-{spec.payload}",
                0.0,  # set when it starts
                actor.owner,
            )
            actor.pending = Start(context, attempt)
            actor.ready_at = START + (LATE if spec.late else 0.0)
            self.actors.append(actor)

    @property
    def fingerprints(self) -> set[str]:
        return {actor.fingerprint for actor in self.actors}

    # -- scheduling ---------------------------------------------------------------------

    def choices(self, fault_budget: int) -> list[Choice]:
        """What may happen next, the fault-free action first; when nothing can happen now,
        time moves on to the next wake-up. Empty once every actor ended."""
        while True:
            ready = [a for a in self.actors if not a.ended and a.ready_at <= self.now]
            if ready:
                break
            waiting = [a.ready_at for a in self.actors if not a.ended]
            if not waiting:
                return []
            self.now = min(waiting)
        choices: list[Choice] = []
        for actor in ready:
            kind = type(actor.pending)
            actions: Sequence[str]
            if kind in STORE_CALLS:
                # Nobody cancels a background flow: its process ends it (a crash).
                actions = BACKGROUND_FAULTS if actor.background else STORE_FAULTS
            elif kind is Run:
                actions = RUN_OUTCOMES
            else:
                actions = ("go",)
            budget_left = self.faults_used < fault_budget
            choices.extend(
                Choice(actor.name, action)
                for action in actions
                if budget_left or action in FAULT_FREE
            )
        return choices

    def step(self, choice: Choice) -> None:
        actor = self.actor(choice.actor)
        action = choice.action
        effect = actor.pending
        self.log.append(
            f"t+{self.now - START:7.3f}  {actor.name:>8}  {_describe(effect)}: {action}"
        )
        if action not in FAULT_FREE:
            self.faults_used += 1
            actor.injected.add(action)
        if type(effect) in STORE_CALLS:
            # (Background flows share their attempt's outage.)
            process = actor.process
            if action in STORE_FAILURES:
                self.last_store_fault[process] = action
            else:
                self.last_store_fault.pop(process, None)
        if action == "crash":
            self._crash(actor)
        elif (action == "pause" and type(effect) in STORE_CALLS) or action == "paused_first":
            # The process stops before the call goes out (or the handler starts); the call
            # follows the pause.
            actor.pending = Paused(effect)
            actor.ready_at = self.now + PAUSE
        elif type(effect) is Paused:
            actor.pending = effect.effect
            self.step(Choice(actor.name, "returns" if type(effect.effect) is Run else "ok"))
        elif type(effect) is Start:
            actor.started = True
            actor.flow = engine.attempt(
                effect.context,
                effect.attempt._replace(
                    claim=effect.attempt.claim._replace(now=effect.context.clock.now())
                ),
            )
            self._advance(actor, _send_none)
        elif type(effect) in STORE_CALLS:
            self._store_call(actor, effect, action)
        elif type(effect) is Run:
            self._run(actor, action)
        elif type(effect) is Returns:
            for run in self.ledger:
                if run.actor == actor.name and run.state == "running":
                    run.state = "kept"
            self._advance(actor, lambda flow: flow.send(effect.ran))
        elif type(effect) is Wait:
            self._advance(actor, lambda flow: flow.send(True))
        else:
            assert type(effect) is Sleep, effect
            self._advance(actor, _send_none)

    def actor(self, name: str) -> Actor:
        return next(actor for actor in self.actors if actor.name == name)

    def _crash(self, actor: Actor) -> None:
        """The process dies: the attempt and every background flow it spawned."""
        for other in self.actors:
            if other.process == actor.process and not other.ended:
                other.ended = other.crashed = True
                for run in self.ledger:
                    if run.actor == other.name and run.state == "running":
                        run.state = "crashed"
                if other.flow is not None:
                    other.flow.close()

    def _store_call(self, actor: Actor, effect: Effect, action: str) -> None:
        if action in LANDS:
            before = self.store.get(self.key_hash)
            result = _perform(self.store, effect)
            self._check_fencing(actor, effect, before)
        self.now += TIMEOUT if action == "timeout" else STORE_CALL
        if action == "ok":
            self._advance(actor, lambda flow: flow.send(result))
        elif action in ("fail_before", "fail_after"):
            outage = StoreUnavailable("simulated outage", cause="unreachable")
            self._advance(actor, lambda flow: flow.throw(outage))
        elif action == "timeout":
            timeout = StoreUnavailable("simulated timeout", cause="timeout")
            self._advance(actor, lambda flow: flow.throw(timeout))
        else:
            assert action in ("cancel_before", "cancel_after"), action
            self._advance(actor, lambda flow: flow.throw(Cancelled()))

    def _run(self, actor: Actor, action: str) -> None:
        self._check_once(actor)
        run = HandlerRun(actor.owner, actor.name)
        self.ledger.append(run)
        self.now += STORE_CALL
        if action == "raises":
            run.state = "discarded"
            self._advance(actor, lambda flow: flow.throw(HandlerFailed(actor.owner)))
            return
        if action == "cancelled":
            run.state = "cancelled"
            self._advance(actor, lambda flow: flow.throw(Cancelled()))
            return
        if action == "crash":  # (the choice's crash already ended the process)
            return
        status = 503 if action == "answers_5xx" else 201
        run.state = "discarded" if status >= 500 else "kept"
        headers = [(b"content-type", b"text/plain")]
        body = f"response of {actor.owner}".encode()
        run.response = StoredResponse(status, headers, body)
        ran = Ran(status, headers, body)
        if action == "pause":
            # The handler returns only after its lease ran out.
            run.state = "running"
            actor.pending = Returns(ran)
            actor.ready_at = self.now + PAUSE
            return
        self._advance(actor, lambda flow: flow.send(ran))

    def _advance(
        self, actor: Actor, resume: Callable[[Generator[Effect, Any, Any]], Effect]
    ) -> None:
        """Resume ``actor``'s flow, then perform what needs no choice (events, background
        spawns, the cache, lease bookkeeping) until it yields a store call, a run, a sleep
        or ends."""
        flow = actor.flow
        assert flow is not None
        while True:
            try:
                effect = resume(flow)
            except StopIteration as stop:
                actor.ended = True
                actor.outcome = stop.value
                self._check_answer(actor)
                return
            except BaseException as raised:  # what the flow raised is the caller's answer
                actor.ended = True
                actor.raised = raised
                self._check_answer(actor)
                return
            resume = _send_none
            if isinstance(effect, Emit):
                emit(effect)
            elif isinstance(effect, Spawn):
                child = Actor(
                    f"{actor.name}/bg{next(self._background)}",
                    actor.process,
                    effect.flow,
                    actor.owner,
                    actor.spec,
                    background=True,
                    started=True,
                )
                self.actors.append(child)
                self._advance(child, _send_none)
            elif isinstance(effect, (EndLease, Recall, Remember)):
                pass
            elif isinstance(effect, (Sleep, Wait)):
                actor.pending = effect
                actor.ready_at = self.now + effect.seconds
                return
            elif isinstance(effect, (*STORE_CALLS, Run)):
                actor.pending = effect
                actor.ready_at = self.now
                return
            else:
                raise Violation("answers", f"{actor.name} yielded {effect!r}")

    # -- invariants ----------------------------------------------------------------------

    def lease_lost(self, owner: str, *, or_cut_off: bool = False) -> bool:
        """Whether ``owner`` lost its lease through no fault of the engine: it crashed,
        paused past its lock, or a clock beyond the skew margin took the key over; with
        ``or_cut_off``, also when one of its store calls failed (a release given up leaves
        the key claimed until its lock times out, as documented)."""
        faults = LEASE_FAULTS | STORE_FAILURES if or_cut_off else LEASE_FAULTS
        for actor in self.actors:
            if actor.owner == owner and (
                actor.injected & faults or actor.crashed or actor.gave_up_completing
            ):
                return True
        if self.scenario.strict_clocks:
            return False
        return any(abs(a.spec.skew) > SKEW_MARGIN for a in self.actors if a.owner != owner)

    def _check_once(self, actor: Actor) -> None:
        """A run may follow a kept (or still running) one only when either owner lost its
        lease: the first, or this one (paused past its lock before its handler started)."""
        if self.lease_lost(actor.owner):
            return
        for run in self.ledger:
            if (
                run.owner != actor.owner
                and run.state in ("kept", "running")
                and not self.lease_lost(run.owner)
            ):
                raise Violation(
                    "once",
                    f"{actor.name} runs the handler again, but {run.actor}'s run "
                    f"({run.state}) never lost its lease",
                )

    def _check_fencing(self, actor: Actor, effect: Effect, before: Record | None) -> None:
        if type(effect) is ClaimRequest:
            return
        holds = before is not None and before.owner == actor.owner
        if type(effect) in (Release, Renew):
            holds = holds and before is not None and before.status is IN_PROGRESS
        if not holds and self.store.get(self.key_hash) != before:
            raise Violation(
                "fencing", f"{actor.name}'s {_describe(effect)} changed a key it does not hold"
            )

    def _check_answer(self, actor: Actor) -> None:
        raised = actor.raised
        if actor.background:
            if raised is not None and not isinstance(raised, Cancelled):
                raise Violation("answers", f"{actor.name} (background) raised {raised!r}")
            return
        if raised is not None:
            if isinstance(raised, Cancelled) and actor.injected & CANCELLATIONS:
                return
            if isinstance(raised, HandlerFailed) and raised.args == (actor.owner,):
                return
            raise Violation("answers", f"{actor.name} raised {raised!r}")
        outcome = actor.outcome
        if isinstance(outcome, Ran):
            if not any(run.owner == actor.owner for run in self.ledger):
                raise Violation("answers", f"{actor.name} answered its run without running")
            return
        if isinstance(outcome, StoredResponse):
            source = [run for run in self.ledger if run.response == outcome]
            if not source or self.actor(source[0].actor).fingerprint != actor.fingerprint:
                raise Violation("replays", f"{actor.name} replayed {outcome!r}")
            return
        if isinstance(outcome, Refusal):
            if outcome.reason == "in_progress":
                return
            if outcome.reason == "reused" and len(self.fingerprints) > 1:
                return
            if outcome.reason == "unavailable" and actor.injected & STORE_FAILURES:
                return
        raise Violation("answers", f"{actor.name} answered {outcome!r}")

    def check_end(self) -> None:
        """Once every attempt ended: no key left in progress but a faulted owner's."""
        record = self.store.get(self.key_hash)
        if (
            record is not None
            and record.status is IN_PROGRESS
            and not self.lease_lost(record.owner, or_cut_off=True)
        ):
            holder = next(a.name for a in self.actors if a.owner == record.owner)
            raise Violation("stuck", f"the key stays in progress, held by {holder}")


STORE_CALLS = (ClaimRequest, Completion, Release, Renew)
BACKGROUND_FAULTS = tuple(fault for fault in STORE_FAULTS if not fault.startswith("cancel"))
FAULT_FREE = frozenset({"ok", "go", "returns"})
LANDS = frozenset({"ok", "fail_after", "timeout", "cancel_after"})
CANCELLATIONS = frozenset({"cancel_before", "cancel_after", "cancelled"})
STORE_FAILURES = frozenset({"fail_before", "fail_after", "timeout"})


@dataclass(frozen=True)
class Start:
    """An attempt not started yet: its flow is made when it starts, with its clock's now."""

    context: engine.Context
    attempt: decisions.Attempt


@dataclass(frozen=True)
class Paused:
    """A store call held back by a pause of its process."""

    effect: Any


@dataclass(frozen=True)
class Returns:
    """A handler paused mid-run, returning ``ran`` when the pause ends."""

    ran: Ran


def _perform(store: MemoryStore, effect: Effect) -> object:
    if type(effect) is ClaimRequest:
        return store.claim(effect)
    if type(effect) is Completion:
        return store.complete(effect)
    if type(effect) is Release:
        return store.release(effect.key_hash, effect.owner)
    assert type(effect) is Renew
    return store.renew(effect.key_hash, effect.owner, effect.lock_expires_at)


def _send_none(flow: Generator[Effect, Any, Any]) -> Effect:
    return flow.send(None)


def _describe(effect: object) -> str:
    if isinstance(effect, Paused):
        return _describe(effect.effect)
    names = {
        Start: "start",
        ClaimRequest: "claim",
        Completion: "complete",
        Release: "release",
        Renew: "renew",
        Run: "run the handler",
        Returns: "the paused handler returns",
        Sleep: "sleep",
        Wait: "wait",
    }
    return names.get(type(effect), type(effect).__name__)


# -- exploration ---------------------------------------------------------------------------


Picker = Callable[[int, list[Choice], "World"], int]


@dataclass
class Outcome:
    """What one schedule did: its choices (indices into each step's choices), how many
    there were at each step, and the violation it found, if any."""

    path: list[int]
    widths: list[int]
    violation: Violation | None
    log: list[str]


def run_schedule(
    scenario: Scenario,
    fault_budget: int,
    max_steps: int,
    pick: Picker,
) -> Outcome:
    """Run one schedule; ``pick(step, choices, world)`` chooses among each step's choices
    (an index)."""
    with _quiet():
        return _run_schedule(scenario, fault_budget, max_steps, pick)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The events' log lines (thousands of simulated outages) are not printed. (A sweep
    holds it around all its schedules: setting a logger's level clears every logger's
    cache, which once a schedule cost a few percent of a sweep.)"""
    logger = logging.getLogger("idempotency_middleware")
    level = logger.level
    if level > logging.CRITICAL:
        yield
        return
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run_schedule(
    scenario: Scenario,
    fault_budget: int,
    max_steps: int,
    pick: Picker,
) -> Outcome:
    world = World(scenario)
    path: list[int] = []
    widths: list[int] = []
    try:
        for step in range(max_steps):
            choices = world.choices(fault_budget)
            if not choices:
                world.check_end()
                break
            index = pick(step, choices, world)
            path.append(index)
            widths.append(len(choices))
            world.step(choices[index])
        else:
            # Bounded: past the step bound, every actor goes on fault-free to its end.
            while choices := world.choices(0):
                world.step(choices[0])
            world.check_end()
    except Violation as violation:
        return Outcome(path, widths, violation, world.log)
    return Outcome(path, widths, None, world.log)


@dataclass
class Report:
    scenario: Scenario
    schedules: int = 0
    steps: int = 0
    violation: Outcome | None = None
    seed: int | None = None
    seconds: float = 0.0
    exhausted: bool = False


def explore(scenario: Scenario, *, fault_budget: int, max_steps: int) -> Report:
    """Every schedule of ``scenario`` with at most ``fault_budget`` injected faults (and run
    outcomes other than returning), up to ``max_steps`` choices each: depth-first, each
    schedule re-executed from the start along the previous one's path."""
    report = Report(scenario)
    started = time.perf_counter()
    prefix: list[int] = []
    with _quiet():
        while True:
            outcome = replay(scenario, prefix, fault_budget, max_steps)
            report.schedules += 1
            report.steps += len(outcome.path)
            if outcome.violation is not None:
                report.violation = shrink(scenario, fault_budget, max_steps, outcome)
                break
            path = list(zip(outcome.path, outcome.widths, strict=True))
            while path and path[-1][0] + 1 >= path[-1][1]:
                path.pop()
            if not path:
                report.exhausted = True
                break
            prefix = [index for index, _ in path]
            prefix[-1] += 1
    report.seconds = time.perf_counter() - started
    return report


def sample(
    scenario: Scenario, *, seed: int, schedules: int, fault_budget: int, max_steps: int
) -> Report:
    """``schedules`` random schedules drawn from ``seed``: at each step an actor at random,
    then mostly the fault-free action, a fault a quarter of the time, and a store failure
    again (most of the time) right after one: outages last, which uniform draws would hardly
    ever show (four failed completions in a row)."""
    report = Report(scenario, seed=seed)
    started = time.perf_counter()
    rng = random.Random(seed)

    def pick(step: int, choices: list[Choice], world: World) -> int:
        actor = rng.choice(sorted({choice.actor for choice in choices}))
        mine = [index for index, choice in enumerate(choices) if choice.actor == actor]
        last = world.last_store_fault.get(world.actor(actor).process)
        if last is not None and rng.random() < OUTAGE_PERSISTS:
            again = [index for index in mine if choices[index].action == last]
            if again:
                return again[0]
        if rng.random() < FAULT_RATE:
            return rng.choice(mine)
        return mine[0]

    with _quiet():
        for _ in range(schedules):
            outcome = run_schedule(scenario, fault_budget, max_steps, pick)
            report.schedules += 1
            report.steps += len(outcome.path)
            if outcome.violation is not None:
                report.violation = shrink(scenario, fault_budget, max_steps, outcome)
                break
    report.seconds = time.perf_counter() - started
    return report


# Random schedules: how often a step is a fault, and how often a store failure follows one.
FAULT_RATE = 0.25
OUTAGE_PERSISTS = 0.7


def replay(scenario: Scenario, path: Sequence[int], fault_budget: int, max_steps: int) -> Outcome:
    """The schedule ``path`` chooses (indices past a step's width wrap around), then
    fault-free to the end."""
    return run_schedule(
        scenario,
        fault_budget,
        max_steps,
        lambda step, choices, world: path[step] % len(choices) if step < len(path) else 0,
    )


def shrink(scenario: Scenario, fault_budget: int, max_steps: int, failing: Outcome) -> Outcome:
    """A shorter schedule with the same kind of violation: greedily drop each choice, or
    make another one at its step, keeping each change that fails sooner (fewer steps, then
    fewer non-default choices)."""
    assert failing.violation is not None
    rule = failing.violation.rule
    best = failing

    def size(outcome: Outcome) -> tuple[int, int]:
        return len(outcome.log), sum(1 for index in outcome.path if index)

    improved = True
    while improved:
        improved = False
        for position, width in enumerate(best.widths):
            head, tail = best.path[:position], best.path[position + 1 :]
            candidates = [head + tail] + [[*head, index, *tail] for index in range(width)]
            for candidate in candidates:
                if candidate == best.path:
                    continue
                outcome = replay(scenario, candidate, fault_budget, max_steps)
                if (
                    outcome.violation is not None
                    and outcome.violation.rule == rule
                    and size(outcome) < size(best)
                ):
                    best, improved = outcome, True
                    break
            if improved:
                break
    return best


def describe(report: Report) -> str:
    how = "exhaustive" if report.seed is None else f"random, seed {report.seed}"
    line = (
        f"{report.scenario.name or report.scenario.describe()}: {report.schedules} schedules, "
        f"{report.steps} steps ({how}{', every schedule' if report.exhausted else ''}) "
        f"in {report.seconds:.1f} s"
    )
    if report.violation is None:
        return line + ": 0 violations"
    outcome = report.violation
    return "\n".join(
        [
            line + f": VIOLATION {outcome.violation}",
            f"  path {outcome.path} (replay with tests.support.simulation.replay)",
            *("  " + entry for entry in outcome.log),
        ]
    )


# -- the scenarios ---------------------------------------------------------------------------

SAME = AttemptSpec()
LATE_RETRY = AttemptSpec(late=True)


def two_attempts() -> list[Scenario]:
    """Two attempts on one key, every start and door; the skew within the margin."""
    scenarios = []
    for door in ("http", "function"):
        for second in (
            SAME,
            LATE_RETRY,
            AttemptSpec(wait_seconds=2.0),
            AttemptSpec(payload="other"),
            AttemptSpec(skew=SKEW_MARGIN * 0.9),
            AttemptSpec(late=True, skew=-SKEW_MARGIN * 0.9),
        ):
            scenarios.append(Scenario((SAME, second), door))
    return scenarios


def three_attempts() -> list[Scenario]:
    return [
        Scenario((SAME, SAME, LATE_RETRY), "http"),
        Scenario((SAME, AttemptSpec(wait_seconds=2.0), LATE_RETRY), "function"),
        Scenario((SAME, LATE_RETRY, AttemptSpec(late=True, wait_seconds=2.0)), "http"),
    ]


def beyond_the_margin(*, strict: bool) -> Scenario:
    """A clock ahead by more than the lock and the skew margin: the lease does not hold."""
    return Scenario(
        (SAME, AttemptSpec(skew=LOCK_TIMEOUT + SKEW_MARGIN + 0.5)), "http", strict_clocks=strict
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.simulation",
        description="Explore the attempt flow's interleavings and faults (make simulate).",
    )
    parser.add_argument("--depth", type=int, default=2, help="faults per exhaustive schedule")
    parser.add_argument("--max-steps", type=int, default=40, help="choices per schedule")
    parser.add_argument("--seed", type=int, default=None, help="random schedules' seed")
    parser.add_argument(
        "--schedules", type=int, default=20_000, help="random schedules per scenario"
    )
    parser.add_argument("--random-faults", type=int, default=4, help="faults per random schedule")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    failed = False
    started = time.perf_counter()
    total = 0
    for scenario in two_attempts():
        report = explore(scenario, fault_budget=args.depth, max_steps=args.max_steps)
        total += report.schedules
        print(describe(report), flush=True)
        failed |= report.violation is not None
    for number, scenario in enumerate(two_attempts() + three_attempts()):
        report = sample(
            scenario,
            seed=seed + number,
            schedules=args.schedules,
            fault_budget=args.random_faults,
            max_steps=args.max_steps,
        )
        total += report.schedules
        print(describe(report), flush=True)
        failed |= report.violation is not None
    print(
        f"simulation: {total} schedules in {time.perf_counter() - started:.0f} s, "
        f"seed {seed}, depth {args.depth}: {'VIOLATIONS' if failed else '0 violations'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
