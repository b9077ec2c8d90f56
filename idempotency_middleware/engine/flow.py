"""The attempt sequence, written once for every door, with no I/O in it.

::

    [cache] -> claim
      Held    -> answer: replay | 409 | 422 | 410   (our own re-sent claim counts as Claimed)
      Claimed -> [renew first if the lease is nearly spent] -> run (lease renewed)
                 -> complete | release, each with finishing retries; events throughout
      failed  -> lost-claim release in the background; 503 or run unprotected

``attempt`` is a generator: it yields effects (``effects.py``) and receives their results,
or has the store's ``StoreUnavailable`` (or a cancellation) thrown into it. The drivers in
``drivers.py`` interpret it, one sync and one async: the httpx ``auth_flow`` idea.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import core
from ..cache import ReplayCache
from ..clock import Clock
from ..events import EventKind, Reporter
from ..options import Options
from ..problems import Problem
from ..records import StoredResponse
from ..stores.base import Held, StoreUnavailable
from .effects import (
    AwaitStreamEnd,
    Claim,
    Complete,
    Effect,
    EndLease,
    Ran,
    Release,
    Renew,
    Run,
    Sleep,
    Spawn,
    StartLease,
    StreamEnd,
)


class Answer(NamedTuple):
    """The door sends this instead of running anything: a replay or a problem."""

    response: StoredResponse | Problem


class RunUnprotected(NamedTuple):
    """The claim failed and ``on_store_error="run"``: run the inner thing with no claim."""


class Sent(NamedTuple):
    """The inner thing ran under the claim; ``ran`` is its answer (``None``: it answered
    nothing). The door sends it unless it went out live."""

    ran: Ran | None


Outcome = Answer | RunUnprotected | Sent
Flow = Generator[Effect, Any, Outcome]

RUN_UNPROTECTED = RunUnprotected()


@dataclass(frozen=True)
class Context:
    """What every attempt of one door shares (built once, at the door's construction)."""

    reporter: Reporter
    clock: Clock
    cache: ReplayCache | None
    on_store_error: str

    @classmethod
    def for_options(cls, options: Options) -> Context:
        return cls(
            Reporter(options.on_event),
            options.clock,
            ReplayCache(options.replay_cache_size) if options.replay_cache_size else None,
            options.on_store_error,
        )


def attempt(context: Context, attempt: core.Attempt) -> Flow:
    """One attempt of a covered call carrying a valid key."""
    claim = attempt.claim
    cache = context.cache
    if cache is not None:
        cached = cache.get(claim.key_hash, claim.now)
        if cached is not None:
            return _answer(context, attempt, core.answer_held(cached, claim.fingerprint), None)
    started = time.perf_counter()
    try:
        result = yield Claim(claim)
    except StoreUnavailable as error:
        context.reporter.report(attempt, "store_error", operation="claim", error=repr(error))
        yield Spawn(release_lost_claim(attempt))
        if context.on_store_error == "run":
            context.reporter.report(attempt, "fail_open")
            return RUN_UNPROTECTED
        return Answer(core.store_unavailable())
    except BaseException:
        # Cancelled (a deadline, a shutdown) with the claim possibly on the wire.
        yield Spawn(release_lost_claim(attempt))
        raise
    latency_ms = (time.perf_counter() - started) * 1000
    taken_over = False
    if isinstance(result, Held):
        record = result.record
        if not core.is_own_claim(record, claim):
            if cache is not None:
                cache.put(record)
            answer = core.answer_held(record, claim.fingerprint)
            return _answer(context, attempt, answer, latency_ms)
        # Our claim landed but its answer was lost, and the client re-sent it: it is ours.
    else:
        taken_over = result.taken_over
    kind: EventKind = "taken_over" if taken_over else "claimed"
    context.reporter.report(attempt, kind, store_latency_ms=latency_ms)
    return (yield from _run_claimed(context, attempt))


def _answer(
    context: Context,
    attempt: core.Attempt,
    answer: StoredResponse | Problem,
    latency_ms: float | None,
) -> Answer:
    context.reporter.report(
        attempt, core.held_event_kind(answer), status=answer.status, store_latency_ms=latency_ms
    )
    return Answer(answer)


def _run_claimed(context: Context, attempt: core.Attempt) -> Flow:
    claim = attempt.claim
    policy = attempt.policy
    granted_at = claim.now
    now = context.clock.now()
    if granted_at + claim.lock_timeout_seconds - now < policy.renewal_interval:
        # The claim took so long to land that less than one renewal interval is left of its
        # lease (counted from before it was sent): renew before running, or do not run, so
        # a live owner never runs on a lease another request may take over mid-run. (A
        # lease merely due for renewal is renewed by the lease scheduler at once.)
        try:
            renewed = yield Renew(claim.key_hash, claim.owner, now + claim.lock_timeout_seconds)
        except StoreUnavailable as error:
            context.reporter.report(attempt, "store_error", operation="renew", error=repr(error))
            yield from _release(context, attempt)
            return Answer(core.store_unavailable())
        if not renewed:
            # Taken over while the claim was in flight: the other request runs, not us.
            context.reporter.report(attempt, "lost", status=409)
            return Answer(core.key_in_progress())
        granted_at = now
    yield StartLease(attempt, granted_at)
    try:
        ran = yield Run()
        end = (yield AwaitStreamEnd()) if ran is not None and not ran.ended else None
    except BaseException:
        # Raised or cancelled: nothing is kept, so a retry runs the handler again.
        yield EndLease(claim.owner)
        yield from _release(context, attempt)
        raise
    yield EndLease(claim.owner)
    if ran is None or not core.keeps_response(ran.status) or (end is not None and end.failed):
        yield from _release(context, attempt)
    else:
        streamed_size = None if not ran.live else (ran.size if end is None else end.size)
        completion = core.completion_for(
            attempt,
            ran.status,
            ran.headers,
            ran.body,
            context.clock.now(),
            streamed_size=streamed_size,
        )
        stored = yield from _finish(context, attempt, Complete(completion), "complete")
        if stored is not None:
            context.reporter.report(attempt, "completed" if stored else "lost", status=ran.status)
    return Sent(ran)


def _release(context: Context, attempt: core.Attempt) -> Generator[Effect, Any, None]:
    claim = attempt.claim
    released = yield from _finish(context, attempt, Release(claim.key_hash, claim.owner), "release")
    if released is not None:
        # Fenced out: another request took the key over while we ran; nothing was deleted.
        context.reporter.report(attempt, "released" if released else "lost")


def _finish(
    context: Context, attempt: core.Attempt, effect: Complete | Release, operation: str
) -> Generator[Effect, Any, bool | None]:
    """A finishing write, retried with backoff; ``None`` (and an ERROR event) if it never
    lands: losing it costs a second run after the lock timeout (complete) or a key locked
    until then (release)."""
    error: StoreUnavailable | None = None
    for number in range(core.FINISH_ATTEMPTS):
        if number:
            yield Sleep(core.finish_delay(number))
        try:
            done: bool = yield effect
        except StoreUnavailable as next_error:
            error = next_error
            continue
        return done
    assert error is not None
    context.reporter.report(
        attempt,
        "store_error",
        operation=operation,
        error=core.gave_up(error, core.FINISH_ATTEMPTS),
    )
    return None


def release_lost_claim(attempt: core.Attempt) -> Generator[Effect, Any, None]:
    """A claim whose answer was lost (or whose call was cancelled in flight) may land later
    than the error: release it, fenced by our owner token, so a retry is not held off for a
    whole lock timeout. Stops at the first release that finds it."""
    claim = attempt.claim
    for delay in core.LOST_CLAIM_RELEASE_DELAYS:
        yield Sleep(delay)
        try:
            if (yield Release(claim.key_hash, claim.owner)):
                return
        except StoreUnavailable:
            continue


__all__ = [
    "RUN_UNPROTECTED",
    "Answer",
    "Context",
    "Flow",
    "Outcome",
    "RunUnprotected",
    "Sent",
    "StreamEnd",
    "attempt",
    "release_lost_claim",
]
