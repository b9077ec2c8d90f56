"""``OpenTelemetry``: every door's attempts and every store call as OpenTelemetry metrics
and spans."""

from __future__ import annotations

from collections.abc import Iterable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..events import IdempotencyEvent
from ..stores.breaker import CircuitBreaker
from ..stores.observers import CallEnd
from . import conventions as names
from .breakers import WatchedBreakers
from .extras import import_extra

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import TracerProvider

SCOPE = "idempotency_middleware"


class OpenTelemetry:
    """Records every door's attempts as OpenTelemetry metrics and spans.

    Give it as ``on_event=`` to any door (and to its store, or let the door hand it on):
    ``idempotency.attempts`` counts events by outcome, door, route and store;
    ``idempotency.store.duration`` and ``idempotency.wait.duration`` are histograms in
    seconds; ``idempotency.breaker.open`` is 0 or 1 per store. Each event sets
    ``idempotency.outcome`` and ``idempotency.key_hash`` on the current span (the server's,
    or the consumer's), and each store call made under a recording span is a child span,
    ``idempotency claim`` (``complete``, ``release``, ``renew``...), with ``db.system.name``.
    Keys and scope values are never attributes.

    ``tracer_provider`` and ``meter_provider``: the global ones by default (read at each
    use, so providers set up after this is built are used). Needs the ``otel`` extra.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        trace = import_extra("opentelemetry.trace", "otel", "OpenTelemetry")
        metrics = import_extra("opentelemetry.metrics", "otel", "OpenTelemetry")
        self._current_span: Any = trace.get_current_span
        self._client_kind = trace.SpanKind.CLIENT
        self._error_status = trace.Status(trace.StatusCode.ERROR)
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self._attempts = meter.create_counter(
            names.ATTEMPTS, unit="{attempt}", description="Idempotency events, by outcome"
        )
        self._store_duration = _histogram(
            meter,
            names.STORE_DURATION,
            "Duration of idempotency store calls",
            names.STORE_DURATION_BUCKETS,
        )
        self._wait_duration = _histogram(
            meter,
            names.WAIT_DURATION,
            "How long a duplicate waited for the first attempt's outcome",
            names.WAIT_DURATION_BUCKETS,
        )
        self._observation = metrics.Observation
        self._breakers = WatchedBreakers()
        meter.create_observable_gauge(
            names.BREAKER_OPEN,
            callbacks=[self._observe_breakers],
            unit="1",
            description="1 while the store's circuit breaker is open, else 0",
        )
        # Attribute sets built once per label values: every value is bounded (outcomes,
        # doors, route templates, stores, operations), so these stay small.
        self._attempt_attributes: dict[tuple[str, str, str, str], dict[str, str]] = {}
        self._wait_attributes: dict[tuple[str, str, str, str], dict[str, str]] = {}
        self._call_attributes: dict[tuple[str, str, str], dict[str, str]] = {}
        # A store call's span name and attributes, by (store, operation).
        self._call_spans: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}

    def __repr__(self) -> str:
        return "OpenTelemetry()"

    def __call__(self, event: IdempotencyEvent) -> None:
        """Count the event, record its wait, and mark the current span with its outcome."""
        kind = event.kind
        if kind in names.STORE_EVENTS:
            return
        # (``conventions.attempt_labels``, inlined: this runs for every event.)
        labels = (kind, event.door or "", event.route_label, event.store or "")
        try:
            attributes = self._attempt_attributes[labels]
        except KeyError:
            attributes = self._attempt_attributes[labels] = dict(
                zip((names.OUTCOME, names.DOOR, names.ROUTE, names.STORE), labels, strict=True)
            )
        self._attempts.add(1, attributes)
        if event.waited_seconds is not None:
            self._wait_duration.record(event.waited_seconds, self._waited_attributes(labels))
        span = self._current_span()
        if span.is_recording():
            span.set_attribute(names.OUTCOME, kind)
            span.set_attribute(names.KEY_HASH, event.key_hash)

    def watch_store(self, store: str, breaker: CircuitBreaker) -> None:
        """Report ``breaker`` in the breaker gauge as a ``store``'s."""
        self._breakers.watch(store, breaker)

    def store_call_started(self, store: str, operation: str) -> CallEnd:
        """Time a store call, as a child span of the current one when that is recording."""
        span: Any = None
        if self._current_span().is_recording():
            try:
                name, attributes = self._call_spans[store, operation]
            except KeyError:
                name, attributes = self._call_spans[store, operation] = (
                    names.span_name(operation),
                    {
                        names.DB_SYSTEM_NAME: names.db_system(store),
                        names.STORE: store,
                        names.OPERATION: operation,
                    },
                )
            # (The SDK copies the attributes into the span's own.)
            span = self._tracer.start_span(name, kind=self._client_kind, attributes=attributes)
        started = perf_counter()

        def end(error: BaseException | None) -> None:
            seconds = perf_counter() - started
            cause = "" if error is None else names.error_type(error)
            self._store_duration.record(seconds, self._store_attributes(operation, store, cause))
            if span is not None:
                if error is not None:
                    span.set_attribute(names.ERROR_TYPE, cause)
                    span.set_status(self._error_status)
                span.end()

        return end

    def _waited_attributes(self, labels: tuple[str, str, str, str]) -> dict[str, str]:
        """A wait's attributes: an attempt's without its outcome."""
        attributes = self._wait_attributes.get(labels)
        if attributes is None:
            attributes = self._wait_attributes[labels] = {
                key: value
                for key, value in self._attempt_attributes[labels].items()
                if key != names.OUTCOME
            }
        return attributes

    def _store_attributes(self, operation: str, store: str, cause: str) -> dict[str, str]:
        labels = (operation, store, cause)
        attributes = self._call_attributes.get(labels)
        if attributes is None:
            attributes = {names.OPERATION: operation, names.STORE: store}
            if cause:
                attributes[names.ERROR_TYPE] = cause
            self._call_attributes[labels] = attributes
        return attributes

    def _observe_breakers(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            self._observation(opened, {names.STORE: store})
            for store, opened in self._breakers.open_by_store().items()
        ]


def _histogram(meter: Any, name: str, description: str, buckets: tuple[float, ...]) -> Any:
    """A histogram in seconds with ``buckets`` advised (an API before 1.23 takes none)."""
    try:
        return meter.create_histogram(
            name,
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=list(buckets),
        )
    except TypeError:  # pragma: no cover - opentelemetry-api before 1.23
        return meter.create_histogram(name, unit="s", description=description)


__all__ = ["OpenTelemetry"]
