"""The attempt sequence, written once for every door, with no I/O in it.

::

    [cache] -> claim
      Held    -> answer: replay | 409 | 422 | 410   (our own re-sent claim counts as Claimed)
                 or, with wait_seconds, poll the claim until it is Claimed or completed
      Claimed -> [renew first if the lease is nearly spent] -> run (lease renewed)
                 -> complete (+ the handler's transaction, or as deferred) | release,
                    each with finishing retries; events throughout
      failed  -> lost-claim release in the background; 503 or run unprotected

``attempt`` is a generator: it yields effects (``effects.py``) and receives their results,
or has the store's ``StoreUnavailable`` (or a cancellation) thrown into it. The drivers in
``drivers.py`` interpret it, one sync and one async: the httpx ``auth_flow`` idea. Its only
inputs besides effect results are the context's clock (time) and entropy (jitter); events
and the replay cache are effects too (``Emit``, ``Recall``, ``Remember``).
"""

from __future__ import annotations

from collections.abc import Container, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..clock import Clock
from ..errors import TransactionConflictError, TransactionRejectedError
from ..events import ROUTINE_KINDS, DoorKind, EventKind, Reporter, hooks_of
from ..policy.options import DEFAULT_STORED_STATUSES, Options
from ..stores.breaker import CircuitBreaker
from ..stores.encryption import Encryption
from ..stores.observers import StoreObserver, StoreObservers, store_kind
from ..stores.protocol import Completion, Held, StoreUnavailable
from ..stores.records import StoredResponse
from . import decisions
from .cache import ReplayCache
from .effects import (
    AWAIT_STREAM_END,
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
    StreamEnd,
    Wait,
)
from .entropy import SYSTEM_ENTROPY, Entropy


class RunUnprotected(NamedTuple):
    """The claim failed and ``on_store_error="run"``: run the inner thing with no claim."""


# ``Ran``: the inner thing ran under the claim; the door sends its answer unless it went out
# live. ``None``: it ran and answered nothing.
# ``StoredResponse``: replay it. ``Refusal``: the door words it (409, 422, 410, 503).
Ending = StoredResponse | decisions.Refusal | RunUnprotected | Ran | None
AttemptFlow = Generator[Effect, Any, Ending]

RUN_UNPROTECTED = RunUnprotected()


@dataclass(frozen=True)
class Context:
    """What every attempt of one door shares (built once, at the door's construction)."""

    reporter: Reporter
    clock: Clock
    cache: ReplayCache | None
    on_store_error: str
    http: bool = True  # an HTTP door (False: ``idempotent`` functions)
    entropy: Entropy = SYSTEM_ENTROPY  # owner tokens and jitter
    # The statuses whose responses are kept (the rest release the key for a retry).
    stored_statuses: Container[int] = DEFAULT_STORED_STATUSES
    # Seals responses before the store, opens them on a replay (None: stored as they are).
    encryption: Encryption | None = None
    # Plain records are refused as unreadable (a door whose serializer unpickles).
    sealed_only: bool = False

    @classmethod
    def for_options(
        cls,
        options: Options,
        store: object,
        *,
        http: bool = True,
        sealed_only: bool = False,
        door: DoorKind | None = None,
    ) -> Context:
        """``http=False`` for a door whose events carry no HTTP status (functions);
        ``sealed_only`` for one that reads back only the records it encrypted; ``door`` the
        kind of door its events name (``"http"`` by default, ``"function"`` with
        ``http=False``). The door's events include those of ``store``'s circuit breaker,
        when it has one, and its hooks that watch store calls watch ``store``'s."""
        door = door if door is not None else "http" if http else "function"
        reporter = Reporter(options.on_event, http=http, door=door, store=store_kind(store))
        breaker = getattr(store, "breaker", None)
        if isinstance(breaker, CircuitBreaker):
            breaker.subscribe(reporter)
        observers = getattr(store, "observers", None)
        if isinstance(observers, StoreObservers):
            for hook in hooks_of(options.on_event):
                if isinstance(hook, StoreObserver):
                    observers.add(hook)
        return cls(
            reporter,
            options.clock,
            ReplayCache(options.replay_cache_size) if options.replay_cache_size else None,
            options.on_store_error,
            http,
            stored_statuses=options.stored_statuses,
            encryption=options.encryption,
            sealed_only=sealed_only,
        )


def attempt(context: Context, attempt: decisions.Attempt) -> AttemptFlow:
    """One attempt of a covered call carrying a valid key."""
    claim = attempt.claim
    # Events are yielded (``Emit``) only when someone listens (``Reporter.wants``): a request
    # nobody observes pays for none of them.
    reporter = context.reporter
    kind: EventKind
    clock = context.clock
    cache = context.cache
    if cache is not None:
        cached = yield Recall(cache, claim.key_hash, claim.now)
        if cached is not None:
            answer = decisions.answer_held(
                cached, claim.fingerprint, context.encryption, context.sealed_only
            )
            kind = decisions.held_event_kind(answer)
            if reporter.wants(kind):
                yield Emit(reporter, attempt, kind, answer.status, error=_why(answer))
            return answer
    wait_until: float | None = None  # set when a duplicate starts waiting (wait_seconds)
    polls = 0
    while True:
        started = clock.now()
        try:
            result = yield claim
        except StoreUnavailable as error:
            yield Emit(reporter, attempt, "store_error", operation="claim", failure=error)
            if error.cause != "breaker_open":
                # (A claim the breaker refused was never sent: there is nothing to release.)
                yield Spawn(release_lost_claim(attempt))
            if context.on_store_error == "run" and wait_until is None:
                yield Emit(reporter, attempt, "fail_open", operation="claim", failure=error)
                return RUN_UNPROTECTED
            # (A waiter whose poll failed saw the key held by a running attempt: running
            # unprotected beside it would be the duplicate run this exists to prevent.)
            return decisions.STORE_UNAVAILABLE._replace(
                error=error,
                retry_after=error.retry_after or decisions.STORE_UNAVAILABLE_RETRY_AFTER,
            )
        except GeneratorExit:
            raise  # the flow itself is being closed: no effect can be yielded any more
        except BaseException:
            # Cancelled (a deadline, a shutdown) with the claim possibly on the wire.
            yield Spawn(release_lost_claim(attempt))
            raise
        # One clock read serves the claim's latency and the lease check below.
        now = clock.now()
        latency_ms = (now - started) * 1000
        if not isinstance(result, Held):
            taken_over = result.taken_over
            break
        record = result.record
        if decisions.is_own_claim(record, claim):
            # Our claim landed but its answer was lost, and the client re-sent it: ours.
            taken_over = False
            break
        if attempt.policy.wait_seconds and decisions.is_waitable(record, claim):
            # A duplicate of a running attempt: wait for its outcome, polling with the same
            # claim (same owner), so a key the first released is claimed and run here.
            if wait_until is None:
                wait_until = now + attempt.policy.wait_seconds
            delay = decisions.poll_delay(polls, wait_until - now, context.entropy.jitter())
            if delay is not None:
                polls += 1
                if (yield Wait(delay, claim.key_hash)):
                    claim = claim._replace(now=clock.now())
                    attempt = attempt._replace(claim=claim)
                    continue
        if cache is not None:
            yield Remember(cache, record, now)
        answer = decisions.answer_held(
            record, claim.fingerprint, context.encryption, context.sealed_only
        )
        kind = decisions.held_event_kind(answer)
        if reporter.wants(kind):
            # (Built with tuple.__new__, every field in ``Emit``'s order: calling a
            # NamedTuple class costs twice as much, and a replay reports one.)
            why, waited = _why(answer), _waited(wait_until, attempt, now)
            yield tuple.__new__(
                Emit,
                (reporter, attempt, kind, answer.status, latency_ms, None, why, None, None, waited),
            )
        return answer
    # Asked once for the DEBUG events of the usual path (claimed, completed, deferred).
    routine = reporter.wants_routine()
    kind = "taken_over" if taken_over else "claimed"
    if routine if kind in ROUTINE_KINDS else reporter.wants(kind):
        if wait_until is None:
            # (Built with tuple.__new__, every field in ``Emit``'s order, as above.)
            yield tuple.__new__(
                Emit, (reporter, attempt, kind, None, latency_ms, None, None, None, None, None)
            )
        else:
            waited = _waited(wait_until, attempt, now)
            yield Emit(reporter, attempt, kind, None, latency_ms, waited_seconds=waited)
    policy = attempt.policy
    granted_at = claim.now
    if granted_at + claim.lock_timeout_seconds - now < policy.renewal_interval:
        # The claim took so long to land that less than one renewal interval is left of its
        # lease (counted from before it was sent): renew before running, or do not run, so
        # a live owner never runs on a lease another request may take over mid-run. (A
        # lease merely due for renewal is renewed by the lease scheduler at once.)
        try:
            renewed = yield Renew(claim.key_hash, claim.owner, now + claim.lock_timeout_seconds)
        except StoreUnavailable as error:
            yield Emit(reporter, attempt, "store_error", operation="renew", failure=error)
            yield from _release(context, attempt)
            return decisions.STORE_UNAVAILABLE
        except GeneratorExit:
            raise
        except BaseException:
            # Cancelled while renewing: the claim is ours and the handler never ran.
            yield from _release(context, attempt)
            raise
        if not renewed:
            # Taken over while the claim was in flight: the other request runs, not us.
            yield Emit(reporter, attempt, "lost", 409)
            return decisions.KEY_IN_PROGRESS
        granted_at = now
    try:
        # (Built with tuple.__new__: calling a NamedTuple class costs twice as much.)
        ran: Ran | None = yield tuple.__new__(Run, (attempt, granted_at, context.http))
        end = None
        if ran is not None and not ran.ended:
            # A live stream still going out: the door resumes us with how it ended (a
            # ``StreamEnd``, never an exception), and its lease ends with it.
            end = yield AWAIT_STREAM_END
            yield EndLease(claim.owner)
    except GeneratorExit:
        raise  # the flow itself is being closed: no effect can be yielded any more
    except BaseException:
        # Raised or cancelled: nothing is kept (nor written), so a retry runs it again.
        yield from _release(context, attempt)
        raise
    if ran is None:
        yield from _release(context, attempt)
        return ran
    # (Unpacked at once: cheaper than a NamedTuple attribute read per field.)
    status, headers, body, live, _, size, writes, deferred, deferred_to = ran
    # A status outside stored_statuses (by default 5xx) keeps nothing: a retry runs again.
    if status not in context.stored_statuses or (end is not None and end.failed):
        yield from _release(context, attempt)
        return ran
    streamed_size = None if not live else (size if end is None else end.size)
    # (Positional: a call by keyword costs more, on every request.)
    completion = decisions.completion_for(
        attempt, status, headers, body, clock.now(), streamed_size, writes, deferred, deferred_to
    )
    if context.encryption is not None and streamed_size is None:
        # Sealed once, here, before any store sees it (a live stream keeps no body).
        sealed = context.encryption.seal(completion.response, claim.key_hash, claim.fingerprint)
        completion = completion._replace(response=sealed)
    try:
        try:
            stored = yield completion
        except StoreUnavailable as error:
            stored = yield from _retry_finish(context, attempt, completion, "complete", error)
    except GeneratorExit:
        raise
    except (TransactionConflictError, TransactionRejectedError) as failed:
        # Nothing was written: the handler's response is discarded with its writes.
        refusal = decisions.Refusal(
            "transaction_conflict"
            if isinstance(failed, TransactionConflictError)
            else "transaction_rejected",
            error=failed,
        )
        yield Emit(reporter, attempt, refusal.event_kind, refusal.status, error=str(failed))
        yield from _release(context, attempt)
        return refusal
    except Exception:
        raise  # a store's own defect: not a cancellation, nothing to finish for it
    except BaseException:
        # Cancelled (the caller's deadline, a shutdown) while the completion was on the
        # wire, after the handler finished: left unwritten, the key would stay claimed with
        # its renewals stopped, and a retry would take it over and run the handler again.
        yield from _finish_interrupted(context, attempt, completion, "complete")
        raise
    if stored is not None:
        kind = "completed"
        if not stored:
            kind = "lost"
        elif deferred:
            kind = "deferred"
        if routine if kind in ROUTINE_KINDS else reporter.wants(kind):
            yield tuple.__new__(
                Emit, (reporter, attempt, kind, status, None, None, None, None, None, None)
            )
    if writes and not stored:
        if stored is None:
            # The commit never got an answer: it landed whole or not at all, and the key
            # stays claimed until its lock timeout; a retry then replays or runs again.
            return decisions.COMMIT_UNAVAILABLE
        # Taken over before the commit: nothing landed. The retry sees the new owner's
        # outcome; the discarded response must not reach the client as if it had.
        return decisions.KEY_IN_PROGRESS
    return ran


def _waited(wait_until: float | None, attempt: decisions.Attempt, now: float) -> float | None:
    """How long a duplicate has waited for the first attempt (``None``: it did not wait):
    since its wait began, ``wait_seconds`` before ``wait_until``."""
    if wait_until is None:
        return None
    return max(0.0, now - (wait_until - attempt.policy.wait_seconds))


def _why(answer: Ending) -> str | None:
    """What an event about a held key says beside its kind: why a stored response could
    not be read (never part of a client's answer)."""
    if type(answer) is decisions.Refusal and answer.reason == "unreadable":
        return str(answer.error)
    return None


def _release(context: Context, attempt: decisions.Attempt) -> Generator[Effect, Any, None]:
    claim = attempt.claim
    release = Release(claim.key_hash, claim.owner)
    try:
        try:
            released = yield release
        except StoreUnavailable as error:
            released = yield from _retry_finish(context, attempt, release, "release", error)
    except (GeneratorExit, Exception):
        raise
    except BaseException:
        # Cancelled mid-release: the key would stay claimed until its lock timeout.
        yield from _finish_interrupted(context, attempt, release, "release")
        raise
    yield from _report_finished(context, attempt, released)


def _report_finished(
    context: Context, attempt: decisions.Attempt, released: bool | None
) -> Generator[Effect, Any, None]:
    if released is not None:
        # Fenced out: another request took the key over while we ran; nothing was deleted.
        kind: EventKind = "released" if released else "lost"
        if context.reporter.wants(kind):
            yield Emit(context.reporter, attempt, kind)


def _finish_interrupted(
    context: Context, attempt: decisions.Attempt, effect: Completion | Release, operation: str
) -> Generator[Effect, Any, None]:
    """A finishing write (``effect``) cut short by a cancellation of its caller (a
    deadline, a shutdown, ``KeyboardInterrupt``), landed or not: it is sent once more
    before the cancellation goes on, which is safe because it is fenced by the owner token
    (a completion sent twice by its owner stores the same response). Should that be cut
    short or fail too, a background flow keeps at it, so a finished handler's outcome is
    not lost to its caller's deadline."""
    try:
        done = yield effect
    except GeneratorExit:
        raise
    except BaseException:
        yield Spawn(_finish_in_background(context, attempt, effect, operation))
        return
    yield from _report_finishing(context, attempt, effect, done)


def _finish_in_background(
    context: Context, attempt: decisions.Attempt, effect: Completion | Release, operation: str
) -> Generator[Effect, Any, None]:
    """The finishing write of a cancelled caller, retried as the caller would have (a
    completion: for as long as its lease). A transaction refused with it left nothing
    behind: the key is released for a retry."""
    try:
        try:
            done = yield effect
        except StoreUnavailable as error:
            done = yield from _retry_finish(context, attempt, effect, operation, error)
    except (TransactionConflictError, TransactionRejectedError):
        yield from _release(context, attempt)
        return
    yield from _report_finishing(context, attempt, effect, done)


def _report_finishing(
    context: Context, attempt: decisions.Attempt, effect: Completion | Release, done: bool | None
) -> Generator[Effect, Any, None]:
    """The event of a finishing write sent again for a cancelled caller, as the attempt
    would have reported it."""
    if isinstance(effect, Release):
        yield from _report_finished(context, attempt, done)
    elif done is not None:
        kind: EventKind = "lost" if not done else "deferred" if effect.deferred else "completed"
        if context.reporter.wants(kind):
            yield Emit(context.reporter, attempt, kind, effect.response.status)


def _retry_finish(
    context: Context,
    attempt: decisions.Attempt,
    effect: Completion | Release,
    operation: str,
    error: StoreUnavailable,
) -> Generator[Effect, Any, bool | None]:
    """Retry a failed finishing write with backoff; ``None`` (and an ERROR event) if it never
    lands. A release is tried ``FINISH_ATTEMPTS`` times: giving it up costs a key locked
    until its lock timeout. A completion is tried for as long as the lease it ran under
    lasts (``lock_timeout_seconds`` after the handler returned: renewals kept it at least
    that long), at most ``FINISH_SECONDS`` (its caller waits meanwhile), its tries at most
    ``MAX_FINISH_DELAY`` apart: its handler finished, and losing it would run the handler
    again after the lock timeout, when a store failing over for a few seconds would have
    taken it. Each try is fenced by the owner token: once another attempt took the key
    over, the completion finds it and changes nothing."""
    # A completion's deadline: its lease, at most FINISH_SECONDS, counted on the clock and
    # in the delays slept (a bound even on a clock that stands still, or is set back).
    deadline = started = slept = 0.0
    if isinstance(effect, Completion):
        started = effect.now
        deadline = started + min(attempt.claim.lock_timeout_seconds, decisions.FINISH_SECONDS)
    clock = context.clock
    number = 1
    while number < decisions.FINISH_ATTEMPTS or (
        clock.now() < deadline and started + slept < deadline
    ):
        delay = decisions.finish_delay(number, context.entropy.jitter())
        slept += delay
        yield Sleep(delay)
        number += 1
        try:
            done: bool = yield effect
        except StoreUnavailable as next_error:
            error = next_error
            continue
        return done
    yield Emit(
        context.reporter,
        attempt,
        "store_error",
        operation=operation,
        error=decisions.gave_up(error, number),
        failure=error,
        note=f"gave up after {number} attempts"
        + (f" in {decisions.FINISH_SECONDS:g} s or its lease" if deadline else "")
        + "; the key stays claimed until its lock timeout",
    )
    return None


def release_lost_claim(attempt: decisions.Attempt) -> Generator[Effect, Any, None]:
    """A claim whose answer was lost (or whose call was cancelled in flight) may land later
    than the error: release it, fenced by our owner token, so a retry is not held off for a
    whole lock timeout. Stops at the first release that finds it."""
    claim = attempt.claim
    for delay in decisions.LOST_CLAIM_RELEASE_DELAYS:
        yield Sleep(delay)
        try:
            if (yield Release(claim.key_hash, claim.owner)):
                return
        except StoreUnavailable:
            continue


__all__ = [
    "RUN_UNPROTECTED",
    "AttemptFlow",
    "Context",
    "Ending",
    "RunUnprotected",
    "StreamEnd",
    "attempt",
    "release_lost_claim",
]
