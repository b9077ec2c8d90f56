"""A store's circuit breaker: during an outage, claims answer 503 at once.

Without it, every covered request waits out the store's timeouts and retries (seconds)
before its 503, so an outage ties up every worker exactly when the service is already in
trouble. After ``threshold`` consecutive outage failures of the store's calls the breaker
*opens*: claims fail at once, with no store call, for ``cooldown_seconds``. Then the next
claim is let through as a probe (*half-open*) while the others still fail at once; any call
the store answers closes the breaker, a failed probe opens it again.

Only claims are refused: completions, releases and renewals of work that already ran are
still sent (and their answers count), so nothing that ran is abandoned by the breaker.

The breaker belongs to the store object, so every door using that store shares it. Its
transitions are logged once and reported as ``breaker_open`` / ``breaker_closed`` events to
the ``on_event`` hook of every door using the store.

While it is open, a refused claim also starts a probe of the store (its ``check``, at most
one at a time, at most one per ``PROBE_INTERVAL_SECONDS``, off the refused request's path):
the first probe the store answers closes the breaker, so claims go through again as soon as
the store is back (a failover's new primary found) rather than only after the cool-down.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from typing import TYPE_CHECKING, Literal

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import StoreUnavailableError

if TYPE_CHECKING:
    from ..events import EventKind, Reporter

logger = logging.getLogger("idempotency_middleware")

BreakerState = Literal["closed", "open", "half_open"]

DEFAULT_THRESHOLD = 5
DEFAULT_COOLDOWN_SECONDS = 5.0

# How often an open breaker's store is probed (while claims keep coming): a failover's new
# primary answers within about this much of being found. A probe is one read.
PROBE_INTERVAL_SECONDS = 0.2

# The failures that count: the store is down, slow or shedding load. A misconfiguration
# (no table, no credentials) already fails fast and says so, contention on one item or file
# (``busy``, ``write_conflict``) says nothing about the store's health, and neither does a
# request the store refused as written (``unknown``: a 4xx it has no cause for): none of them
# counts, nor closes the breaker.
# ``not_replicated`` counts: no claim can be kept durably while the replicas lag or are gone.
OUTAGE_CAUSES = frozenset(
    {"unreachable", "timed_out", "throttled", "server_error", "io_error", "not_replicated"}
)


class CircuitBreaker:
    """Counts a store's consecutive outage failures and refuses claims while open.

    ``threshold=0`` turns it off. Thread-safe; the hot path (a closed breaker, a call that
    succeeds) reads two attributes and takes no lock.
    """

    __slots__ = (
        "__weakref__",  # the metrics hooks watch it weakly (observability.breakers)
        "_clock",
        "_failures",
        "_last_failure",
        "_lock",
        "_next_probe",
        "_open_until",
        "_probe_started",
        "_probing",
        "_report_lock",
        "_reporters",
        "_state",
        "_transitions",
        "cooldown_seconds",
        "threshold",
    )

    def __init__(
        self,
        threshold: int = DEFAULT_THRESHOLD,
        cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ValueError(
                f"breaker_threshold must be a non-negative integer (0 turns the breaker off), "
                f"got {threshold!r}"
            )
        if (
            isinstance(cooldown_seconds, bool)
            or not isinstance(cooldown_seconds, (int, float))
            or not 0 < cooldown_seconds < math.inf
        ):
            raise ValueError(
                "breaker_cooldown_seconds must be a positive, finite number of seconds, "
                f"got {cooldown_seconds!r}"
            )
        self.threshold = threshold
        self.cooldown_seconds = float(cooldown_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._failures = 0
        self._open_until = 0.0
        self._probe_started = 0.0
        self._probing = False  # a background probe of the open breaker's store is running
        self._next_probe = 0.0
        self._last_failure: StoreUnavailableError | None = None
        # Transitions are numbered, and reported one at a time under their own lock (hooks
        # run outside the state lock), so a report overtaken by a newer transition is dropped:
        # the last event a hook hears always matches the state.
        self._transitions = 0
        self._report_lock = threading.RLock()
        # The reporters of the doors using the store, held weakly: a door that is gone
        # stops hearing about the breaker without unsubscribing.
        self._reporters: weakref.WeakSet[Reporter] = weakref.WeakSet()

    @property
    def state(self) -> BreakerState:
        """``"closed"`` (claims go to the store), ``"open"`` (claims fail at once) or
        ``"half_open"`` (one probe is with the store). An open breaker whose cool-down has
        passed is still ``"open"`` until a claim probes."""
        return self._state

    def subscribe(self, reporter: Reporter) -> None:
        """Report this breaker's transitions to ``reporter`` (a door's) from now on."""
        with self._lock:
            self._reporters.add(reporter)

    def admit(self) -> bool:
        """Before a claim: return to let it go to the store (``True`` when it is the
        half-open breaker's probe: call :meth:`end_probe` when it is over), or raise
        ``StoreUnavailable`` (cause ``breaker_open``, with ``retry_after``) to refuse it
        without a store call."""
        if self._state == "closed":
            return False
        with self._lock:
            now = self._clock.now()
            state: BreakerState = self._state  # again, under the lock
            if state == "closed":
                return False
            if state == "open" and now >= self._open_until:
                # The cool-down is over: this claim is the probe.
                self._state = "half_open"
                self._probe_started = now
                return True
            if state == "half_open" and now >= self._probe_started + self.cooldown_seconds:
                # The probe never ended (its thread hangs): this one replaces it.
                self._probe_started = now
                return True
            wait = (
                self._open_until - now
                if state == "open"
                else self._probe_started + self.cooldown_seconds - now
            )
            last = self._last_failure
        refused = StoreUnavailableError(
            f"the idempotency store failed {self.threshold} times in a row; the circuit "
            "breaker refuses claims without calling it until its cool-down ends"
            + (f" (last failure: {last.reason})" if last is not None else ""),
            cause="breaker_open",
            code=last.code if last is not None else "",
            retry_after=max(1, math.ceil(wait)),
        )
        refused.__cause__ = last
        raise refused

    def background_probe_due(self) -> bool:
        """After a refused claim: whether to start a background probe of the store now (call
        :meth:`background_probe_ended` when it is over, whatever came of it). At most one at
        a time, one per ``PROBE_INTERVAL_SECONDS``; none unless the breaker is open."""
        if self._state == "closed" or self._probing:
            return False
        with self._lock:
            now = self._clock.now()
            if self._probing or now < self._next_probe or self.state == "closed":
                return False
            self._probing = True
            self._next_probe = now + PROBE_INTERVAL_SECONDS
            return True

    def background_probe_ended(self) -> None:
        """The probe :meth:`background_probe_due` allowed is over (its success closed the
        breaker through :meth:`succeeded` already)."""
        with self._lock:
            self._probing = False

    def end_probe(self) -> None:
        """The probe's call is over. When it settled nothing (it failed for a reason that
        does not count, such as contention, or was cancelled), the next claim probes."""
        with self._lock:
            if self._state == "half_open":
                self._state = "open"
                self._open_until = self._clock.now()

    def succeeded(self) -> None:
        """The store answered a call (a failed condition is an answer too)."""
        if self._failures == 0 and self._state == "closed":
            return
        with self._lock:
            was = self._state
            self._failures = 0
            self._state = "closed"
            self._last_failure = None
            if was == "closed":
                return
            self._transitions += 1
            number = self._transitions
        self._report(number, "breaker_closed", None)

    def failed(self, error: StoreUnavailableError) -> None:
        """A store call failed with ``error``; counted when it is an outage."""
        if self.threshold == 0 or error.cause not in OUTAGE_CAUSES:
            return
        with self._lock:
            self._failures += 1
            self._last_failure = error
            opens = self._state == "half_open" or (
                self._state == "closed" and self._failures >= self.threshold
            )
            if not opens:
                return  # counted; or a finishing call failing while open: no new event
            self._state = "open"
            self._open_until = self._clock.now() + self.cooldown_seconds
            self._transitions += 1
            number = self._transitions
        # The request whose failure opened it is told the cool-down too.
        error.retry_after = max(1, math.ceil(self.cooldown_seconds))
        self._report(number, "breaker_open", error)

    def _report(self, number: int, kind: EventKind, error: BaseException | None) -> None:
        with self._report_lock:
            if number != self._transitions:
                return  # overtaken: a newer transition is (or was) reported instead
            self._deliver(kind, error)

    def tell(
        self, kind: EventKind, error: BaseException | None, key_hash: str, operation: str
    ) -> None:
        """Hand an event about the store (not a transition: the store has logged it) to the
        hooks of the doors using it, each hook once."""
        self._hand_on(kind, error, key_hash=key_hash, operation=operation)

    def _deliver(self, kind: EventKind, error: BaseException | None) -> None:
        if kind == "breaker_open":
            logger.error(
                "idempotency store circuit breaker opened after %d consecutive failures (%s): "
                "claims answer 503 without calling the store for %.1f s",
                self.threshold,
                getattr(error, "reason", error),
                self.cooldown_seconds,
                extra={"idempotency_event": kind},
            )
        else:
            logger.warning(
                "idempotency store circuit breaker closed: the store answers again",
                extra={"idempotency_event": kind},
            )
        self._hand_on(kind, error)

    def _hand_on(
        self,
        kind: EventKind,
        error: BaseException | None,
        key_hash: str = "",
        operation: str | None = None,
    ) -> None:
        with self._lock:
            reporters = list(self._reporters)
        hooks: list[object] = []
        for reporter in reporters:
            # Two doors sharing one hook hear of an event once (compared by equality:
            # ``obj.method`` is a new bound-method object each time it is read).
            if reporter.hook in hooks:
                continue
            hooks.append(reporter.hook)
            reporter.report_store(kind, failure=error, key_hash=key_hash, operation=operation)


class BreakerOwner:
    """What a store with a circuit breaker offers: ``breaker`` and ``breaker_state``."""

    breaker: CircuitBreaker

    @property
    def breaker_state(self) -> BreakerState:
        """``"closed"``, ``"open"`` or ``"half_open"``: for health checks."""
        return self.breaker.state


__all__ = [
    "DEFAULT_COOLDOWN_SECONDS",
    "DEFAULT_THRESHOLD",
    "OUTAGE_CAUSES",
    "PROBE_INTERVAL_SECONDS",
    "BreakerOwner",
    "BreakerState",
    "CircuitBreaker",
]
