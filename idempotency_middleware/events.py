"""Observability: typed events for an ``on_event`` hook, and matching structured logs.

Every event carries the hashed storage key, never the client's key or scope value, so logs
and metrics can be shipped anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from .errors import StoreUnavailableError

logger = logging.getLogger("idempotency_middleware")

EventKind = Literal[
    "claimed",  # a new key was claimed; the handler runs
    "taken_over",  # a dead owner's stale claim was taken over; the handler runs
    "replayed",  # a completed response was replayed
    "conflict",  # 409 (KeyInProgressError): the key is in progress
    "mismatch",  # 422: the key was used with a different request
    "not_stored",  # 410: completed, but its response could not be kept
    "unreadable",  # 500: completed, but its stored response cannot be read; not re-run
    "completed",  # the handler's response was stored
    "deferred",  # the handler deferred its work; its response was stored as the interim one
    "transaction_conflict",  # a condition of the handler's transaction failed; released
    "transaction_rejected",  # DynamoDB cannot commit the transaction as written; released
    "released",  # the claim was released (5xx, exception, cancellation)
    "lost",  # the claim was taken over while the handler ran; response not stored
    "store_error",  # the store failed; see ``operation``
    "fail_open",  # the claim failed and on_store_error="run" ran the handler unprotected
    "breaker_open",  # the store's circuit breaker opened: claims answer 503 without a call
    "breaker_closed",  # the store answered again: the breaker closed
    "not_replicated",  # a completion landed on the primary, not on enough replicas in time
]

_LEVELS: dict[str, int] = {
    "claimed": logging.DEBUG,
    "replayed": logging.DEBUG,
    "completed": logging.DEBUG,
    "deferred": logging.DEBUG,
    "transaction_conflict": logging.INFO,
    "transaction_rejected": logging.ERROR,
    "released": logging.DEBUG,
    "conflict": logging.INFO,
    "mismatch": logging.INFO,
    "not_stored": logging.INFO,
    "unreadable": logging.ERROR,
    "taken_over": logging.WARNING,
    "lost": logging.WARNING,
    "store_error": logging.ERROR,
    "fail_open": logging.ERROR,
    "breaker_open": logging.ERROR,
    "breaker_closed": logging.WARNING,
    "not_replicated": logging.WARNING,
}

# The kinds logged at DEBUG, those of an attempt's usual path (claimed, completed ...):
# ``Reporter.wants_routine`` answers ``wants`` for all of them at once.
ROUTINE_KINDS = frozenset(kind for kind, level in _LEVELS.items() if level == logging.DEBUG)

_MESSAGES: dict[str, str] = {
    "claimed": "idempotency key claimed",
    "taken_over": "idempotency key taken over from an owner whose lock expired",
    "replayed": "idempotent response replayed",
    "conflict": "idempotency key in progress; answered 409",
    "mismatch": "idempotency key reused with a different request; answered 422",
    "not_stored": "idempotency key completed without a stored response; answered 410",
    "unreadable": "stored idempotent response cannot be read (corrupt, tampered with, or "
    "encrypted under a key not configured); answered without running again",
    "completed": "idempotent response stored",
    "deferred": "idempotent interim response stored; the work completes the key later",
    "transaction_conflict": "a condition of the transaction failed; nothing written, key released",
    "transaction_rejected": "the transaction cannot be committed as written; key released",
    "released": "idempotency claim released",
    "lost": "idempotency claim was taken over while the handler ran; response sent, not stored",
    # store_error and fail_open are worded per event (see ``_store_failure``); the breaker's
    # events are logged once by the breaker itself (``breaker.py``), not per door.
}

# The refusals a door that is not HTTP (a function, a consumer, an MCP tool) words without
# a status: it answers none (it raises, gives up on a message, or answers a tool error).
_NON_HTTP_MESSAGES: dict[str, str] = {
    "conflict": "idempotency key in progress; refused without running",
    "mismatch": "idempotency key reused with different input; refused without running",
    "not_stored": "idempotency key completed without a stored result; refused without running",
}

# A store failure's log line names the operation, why it failed and the key, so the cause
# shows with default logging, not only in the record's ``extra`` fields.
_STORE_ERROR = "idempotency store failed: %s: %s (key %s; %s %s)"
_FAIL_OPEN = (
    "idempotency store failed on %s: %s; handler run WITHOUT idempotency protection (key %s; %s %s)"
)


# The kinds of door an event comes from (``IdempotencyEvent.door``).
DoorKind = Literal["http", "function", "consumer", "mcp"]

# The ``route_label`` of an HTTP request no rule (nor route opt-in) matched: never its path,
# so a metric labelled by route keeps a bounded number of series.
UNMATCHED = "unmatched"


# Sets a frozen instance's attributes at once (its own ``__setattr__`` refuses).
_set_attribute = object.__setattr__


@dataclass(frozen=True, init=False)
class IdempotencyEvent:
    """One thing the middleware did. ``key_hash`` is the stored (hashed) partition key.

    ``door`` is the kind of door that reported it (``"http"``, ``"function"``,
    ``"consumer"``, ``"mcp"``; ``None`` for an event of a store's own hook), ``store`` the
    kind of store (``"dynamodb"``, ``"redis"``, ``"postgresql"``, ``"sqlite"``,
    ``"memory"``), ``route_label`` the route as a metric label: the template of the rule
    that matched, the function's or consumer's name, or ``"unmatched"`` (never a concrete
    path, unlike ``route``). ``waited_seconds`` is how long a duplicate waited for the
    first attempt (``wait_seconds``) before this event, when it waited.
    """

    kind: EventKind
    key_hash: str
    method: str
    route: str
    status: int | None = None  # HTTP status sent, where one was (never for functions)
    operation: str | None = None  # store operation, for store_error
    error: str | None = None  # repr of the store error
    store_latency_ms: float | None = None  # duration of the store call behind the event
    cause: str | None = None  # why the store failed (StoreUnavailableError.cause), if it did
    door: DoorKind | None = None
    store: str | None = None
    route_label: str = ""
    waited_seconds: float | None = None

    # Written out rather than generated: a frozen dataclass's own ``__init__`` sets each of
    # the 13 fields through ``object.__setattr__``, twice the cost of the whole ``__dict__``
    # at once, and an event is built for every step of every attempt a hook listens to.
    def __init__(
        self,
        kind: EventKind,
        key_hash: str,
        method: str,
        route: str,
        status: int | None = None,
        operation: str | None = None,
        error: str | None = None,
        store_latency_ms: float | None = None,
        cause: str | None = None,
        door: DoorKind | None = None,
        store: str | None = None,
        route_label: str = "",
        waited_seconds: float | None = None,
    ) -> None:
        _set_attribute(
            self,
            "__dict__",
            {
                "kind": kind,
                "key_hash": key_hash,
                "method": method,
                "route": route,
                "status": status,
                "operation": operation,
                "error": error,
                "store_latency_ms": store_latency_ms,
                "cause": cause,
                "door": door,
                "store": store,
                "route_label": route_label,
                "waited_seconds": waited_seconds,
            },
        )


# A breaker event is about the store, not one request: it carries no key, method or route.
_NO_KEY = ""


EventHook = Callable[[IdempotencyEvent], None]
# What ``on_event`` takes: one hook, several, or none.
OnEvent = EventHook | Sequence[EventHook] | None

_NOT_A_HOOK = "on_event must be a callable taking an IdempotencyEvent, or a sequence of them"


@dataclass(frozen=True)
class Hooks:
    """Several ``on_event`` hooks heard as one, in order; one that raises costs only its own
    delivery. Compared by value, so doors given the same hooks hear a store's breaker once."""

    hooks: tuple[EventHook, ...]

    def __call__(self, event: IdempotencyEvent) -> None:
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:
                logger.exception("on_event hook %r raised; event dropped for it", hook)


def check_hooks(on_event: object) -> tuple[EventHook, ...]:
    """``on_event`` as a tuple of hooks (empty for ``None``); ``ValueError`` for anything
    but a callable or a sequence (list, tuple) of callables."""
    if on_event is None:
        return ()
    if callable(on_event):
        return (on_event,)
    if isinstance(on_event, (str, bytes)) or not isinstance(on_event, Sequence):
        raise ValueError(f"{_NOT_A_HOOK}, got {on_event!r}")
    hooks = tuple(on_event)
    for hook in hooks:
        if not callable(hook):
            raise ValueError(f"{_NOT_A_HOOK}; the sequence holds {hook!r}")
    return hooks


def one_hook(on_event: object) -> EventHook | None:
    """``on_event`` checked (``check_hooks``) and made one callable: ``None`` for no hook,
    the hook itself for one, a ``Hooks`` for several."""
    hooks = check_hooks(on_event)
    if not hooks:
        return None
    return hooks[0] if len(hooks) == 1 else Hooks(hooks)


def hooks_of(hook: EventHook | None) -> tuple[EventHook, ...]:
    """The hooks ``hook`` (from ``one_hook``) stands for."""
    if hook is None:
        return ()
    return hook.hooks if isinstance(hook, Hooks) else (hook,)


class _Policy(Protocol):
    @property
    def route(self) -> str | None: ...


class _Attempt(Protocol):
    # What an event is about (core.Attempt); a protocol to keep this module import-free.
    @property
    def policy(self) -> _Policy: ...
    @property
    def method(self) -> str: ...
    @property
    def route(self) -> str: ...
    @property
    def key_hash(self) -> str: ...


class Reporter:
    """Logs every event under the ``idempotency_middleware`` logger and feeds the hook.

    An event is only built when someone listens (a hook, or the logger enabled for its
    level): on the hot path with neither, reporting costs one level check.
    """

    __slots__ = ("__weakref__", "_door", "_hook", "_http", "_store")

    def __init__(
        self,
        hook: EventHook | None,
        *,
        http: bool = True,
        door: DoorKind | None = None,
        store: str | None = None,
    ) -> None:
        """``door`` and ``store`` (their kinds) are set on every event reported."""
        if hook is not None and not callable(hook):
            raise ValueError("on_event must be a callable taking an IdempotencyEvent")
        self._hook = hook
        # A function call (``idempotent``) sends no HTTP status: its events carry none.
        self._http = http
        self._door: DoorKind | None = door if door is not None else "http" if http else None
        self._store = store

    @property
    def hook(self) -> EventHook | None:
        return self._hook

    def wants(self, kind: EventKind) -> bool:
        """Whether an event of ``kind`` reaches anyone (the hook, or the logger at its
        level): the engine skips the events of every request when nobody listens."""
        return self._hook is not None or logger.isEnabledFor(_LEVELS[kind])

    def wants_routine(self) -> bool:
        """``wants`` for every kind in ``ROUTINE_KINDS``: one question where an attempt
        would ask about each of its usual events (two on a new key, nobody listening)."""
        return self._hook is not None or logger.isEnabledFor(logging.DEBUG)

    def report_store(
        self,
        kind: EventKind,
        *,
        failure: BaseException | None = None,
        key_hash: str = _NO_KEY,
        operation: str | None = None,
    ) -> None:
        """Hand on an event about the store itself (the breaker's, a write not replicated),
        which has no request: its ``method`` and ``route`` are empty, and so is its
        ``key_hash`` unless one key is concerned. Not logged here: the store logs it once,
        however many doors share the store."""
        if self._hook is None:
            return
        cause = None
        if failure is not None:
            cause = failure.cause if isinstance(failure, StoreUnavailableError) else "unknown"
        event = IdempotencyEvent(
            kind,
            key_hash,
            _NO_KEY,
            _NO_KEY,
            operation=operation,
            error=repr(failure) if failure is not None else None,
            cause=cause,
            door=self._door,
            store=self._store,
        )
        try:
            self._hook(event)
        except Exception:
            logger.exception("on_event hook raised; event dropped")

    def report(
        self,
        attempt: _Attempt,
        kind: EventKind,
        *,
        status: int | None = None,
        operation: str | None = None,
        error: str | None = None,
        store_latency_ms: float | None = None,
        failure: BaseException | None = None,
        note: str | None = None,
        waited_seconds: float | None = None,
    ) -> None:
        """Log and hand on one event. For a store failure, ``failure`` is the store's error
        (its ``cause`` and ``reason`` reach the event and the log line; ``error`` defaults
        to its repr) and ``note`` what came of it ("gave up after 4 attempts")."""
        self.report_fields(
            attempt,
            kind,
            status,
            store_latency_ms,
            operation,
            error,
            failure,
            note,
            waited_seconds,
        )

    def report_fields(
        self,
        attempt: _Attempt,
        kind: EventKind,
        status: int | None,
        store_latency_ms: float | None,
        operation: str | None,
        error: str | None,
        failure: BaseException | None,
        note: str | None,
        waited_seconds: float | None,
    ) -> None:
        """``report`` with every field given by position, in the order of the engine's
        ``Emit`` effect: what the drivers call for each event (keywords cost more)."""
        level = _LEVELS[kind]
        log = logger.isEnabledFor(level)
        if not log and self._hook is None:
            return
        if not self._http:
            status = None
        cause = None
        if failure is not None:
            cause = failure.cause if isinstance(failure, StoreUnavailableError) else "unknown"
            if error is None:
                error = repr(failure)
        event = IdempotencyEvent(
            kind,
            attempt.key_hash,
            attempt.method,
            attempt.route,
            status,
            operation,
            error,
            store_latency_ms,
            cause,
            self._door,
            self._store,
            attempt.policy.route or UNMATCHED,
            waited_seconds,
        )
        if log:
            extra = {
                "idempotency_event": kind,
                "idempotency_key_hash": event.key_hash,
                "idempotency_route": f"{event.method} {event.route}",
                "idempotency_status": status,
                "idempotency_operation": operation,
                "idempotency_error": error,
                "idempotency_cause": cause,
                "idempotency_store_latency_ms": store_latency_ms,
            }
            if kind in ("store_error", "fail_open"):
                message, *args = _store_failure(event, failure, note)
                logger.log(level, message, *args, extra=extra)
            else:
                logger.log(level, _message(kind, self._http), extra=extra)
        if self._hook is not None:
            try:
                self._hook(event)
            except Exception:
                # A metrics bug must not turn a stored response into a 500.
                logger.exception("on_event hook raised; event dropped")


def _message(kind: EventKind, http: bool) -> str:
    """The log line of an event of ``kind``: with an HTTP status only from an HTTP door."""
    if http:
        return _MESSAGES[kind]
    return _NON_HTTP_MESSAGES.get(kind) or _MESSAGES[kind]


def _store_failure(
    event: IdempotencyEvent, failure: BaseException | None, note: str | None
) -> tuple[str, ...]:
    """The log format and arguments of a ``store_error`` or ``fail_open`` event."""
    reason = (
        failure.reason
        if isinstance(failure, StoreUnavailableError)
        else event.error or "no reason given"
    )
    if isinstance(failure, StoreUnavailableError) and failure.misconfigured:
        # (What the 503 and the function's exception tell the caller to wait for.)
        reason = f"{reason}; the store is misconfigured, not retryable; fix: {failure.fix}"
    if note:
        reason = f"{reason}; {note}"
    operation = event.operation or "store call"
    template = _FAIL_OPEN if event.kind == "fail_open" else _STORE_ERROR
    return template, operation, reason, event.key_hash, event.method, event.route
