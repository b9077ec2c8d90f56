"""The names both hooks export, written once: metrics, attributes, spans, buckets.

OpenTelemetry has no semantic conventions for idempotency yet, so these are the package's
own, in its style: dotted lower-case names under ``idempotency.``, seconds for durations,
``error.type`` and ``db.system.name`` where the general conventions already name the thing.
Prometheus takes the same names with ``_`` and the unit's suffix, and labels without the
``idempotency.`` prefix.
"""

from __future__ import annotations

from ..events import EventKind, IdempotencyEvent

ATTEMPTS = "idempotency.attempts"
STORE_DURATION = "idempotency.store.duration"
WAIT_DURATION = "idempotency.wait.duration"
BREAKER_OPEN = "idempotency.breaker.open"

OUTCOME = "idempotency.outcome"
DOOR = "idempotency.door"
ROUTE = "idempotency.route"
STORE = "idempotency.store"
OPERATION = "idempotency.operation"
KEY_HASH = "idempotency.key_hash"
ERROR_TYPE = "error.type"
DB_SYSTEM_NAME = "db.system.name"

# Prometheus: the metric names without the namespace, and the label names.
PROMETHEUS_ATTEMPTS = "attempts"  # exported with _total
PROMETHEUS_STORE_DURATION = "store_duration_seconds"
PROMETHEUS_WAIT_DURATION = "wait_duration_seconds"
PROMETHEUS_BREAKER_OPEN = "breaker_open"
ATTEMPT_LABELS = ("outcome", "door", "route", "store")
STORE_CALL_LABELS = ("operation", "store", "error_type")
WAIT_LABELS = ("door", "route", "store")

# Store calls take from well under a millisecond (memory, a local Redis) to seconds (a
# store failing over); a wait, up to ``wait_seconds``.
STORE_DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
WAIT_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# The breaker's events are about a store, not an attempt: they are the breaker gauge's (read
# from the breaker itself), not counted as attempts.
STORE_EVENTS: frozenset[EventKind] = frozenset({"breaker_open", "breaker_closed"})

# ``db.system.name`` where the general conventions name the store differently.
_DB_SYSTEMS = {"dynamodb": "aws.dynamodb"}


def db_system(store: str) -> str:
    """The ``db.system.name`` of a kind of store."""
    return _DB_SYSTEMS.get(store, store)


def span_name(operation: str) -> str:
    """The name of a store call's span: ``idempotency claim``, ``idempotency complete``..."""
    return f"idempotency {operation}"


def attempt_labels(event: IdempotencyEvent) -> tuple[str, str, str, str]:
    """An attempt's label values, in ``ATTEMPT_LABELS`` order: never a key, a scope value
    or a concrete path, so the series stay as few as the routes."""
    return (event.kind, event.door or "", event.route_label, event.store or "")


def error_type(error: BaseException) -> str:
    """``error.type`` of a failed store call: the store's cause (``timed_out``,
    ``throttled``...), else the exception's class name."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, str) and cause else type(error).__qualname__


__all__ = [
    "ATTEMPTS",
    "BREAKER_OPEN",
    "STORE_DURATION",
    "WAIT_DURATION",
    "attempt_labels",
    "db_system",
    "error_type",
    "span_name",
]
