"""``Prometheus``: every door's attempts and every store call as Prometheus metrics."""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from time import perf_counter
from typing import Any

from ..events import IdempotencyEvent
from ..stores.breaker import CircuitBreaker
from ..stores.observers import CallEnd
from . import conventions as names
from .breakers import WatchedBreakers
from .extras import import_extra

_NAMESPACE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


class _Metrics:
    """One registry's metrics under one namespace. Shared by every ``Prometheus`` built for
    that pair: a registry refuses the same metric registered twice."""

    def __init__(self, client: Any, registry: Any, namespace: str) -> None:
        common = {"namespace": namespace, "registry": registry}
        self.attempts = client.Counter(
            names.PROMETHEUS_ATTEMPTS,
            "Idempotency events, by outcome",
            names.ATTEMPT_LABELS,
            **common,
        )
        self.store_duration = client.Histogram(
            names.PROMETHEUS_STORE_DURATION,
            "Duration of idempotency store calls",
            names.STORE_CALL_LABELS,
            buckets=names.STORE_DURATION_BUCKETS,
            **common,
        )
        self.wait_duration = client.Histogram(
            names.PROMETHEUS_WAIT_DURATION,
            "How long a duplicate waited for the first attempt's outcome",
            names.WAIT_LABELS,
            buckets=names.WAIT_DURATION_BUCKETS,
            **common,
        )
        self.breakers = WatchedBreakers()
        gauge = f"{namespace}_{names.PROMETHEUS_BREAKER_OPEN}"
        registry.register(_BreakerCollector(gauge, self.breakers))
        # Label children by their values: ``labels()`` takes a lock, checks and joins the
        # values each time. Every value is bounded (outcomes, doors, route templates,
        # stores, operations, causes), so these stay small; a miss fills them (two threads
        # missing at once get the same child: ``labels()`` is idempotent).
        self.attempt_children: dict[tuple[str, ...], Any] = {}
        self.call_children: dict[tuple[str, ...], Any] = {}
        self.wait_children: dict[tuple[str, ...], Any] = {}

    def attempt_child(self, labels: tuple[str, ...]) -> Any:
        child = self.attempt_children[labels] = self.attempts.labels(*labels)
        return child

    def call_child(self, labels: tuple[str, ...]) -> Any:
        child = self.call_children[labels] = self.store_duration.labels(*labels)
        return child

    def wait_child(self, labels: tuple[str, ...]) -> Any:
        child = self.wait_children[labels] = self.wait_duration.labels(*labels)
        return child


class _BreakerCollector:
    """``<namespace>_breaker_open``, read from the watched breakers at each scrape."""

    def __init__(self, name: str, breakers: WatchedBreakers) -> None:
        core = import_extra("prometheus_client.core", "prometheus", "Prometheus")
        self._family = core.GaugeMetricFamily
        self._name = name
        self._breakers = breakers

    def describe(self) -> list[Any]:
        return [self._family(self._name, _BREAKER_HELP, labels=["store"])]

    def collect(self) -> Iterator[Any]:
        family = self._family(self._name, _BREAKER_HELP, labels=["store"])
        for store, opened in sorted(self._breakers.open_by_store().items()):
            family.add_metric([store], opened)
        yield family


_BREAKER_HELP = "1 while the store's circuit breaker is open, else 0"

_LOCK = threading.Lock()
_SHARED: weakref.WeakKeyDictionary[Any, dict[str, _Metrics]] = weakref.WeakKeyDictionary()


class Prometheus:
    """The same metrics as ``OpenTelemetry``, on a ``prometheus_client`` registry.

    ``<namespace>_attempts_total`` (labels ``outcome``, ``door``, ``route``, ``store``),
    ``<namespace>_store_duration_seconds`` (``operation``, ``store``, ``error_type``, empty
    when the call succeeded), ``<namespace>_wait_duration_seconds`` (``door``, ``route``,
    ``store``) and ``<namespace>_breaker_open`` (``store``). ``registry``: the default
    registry by default; several ``Prometheus`` on one registry and namespace share its
    metrics. Give it as ``on_event=`` to any door (and to its store, or let the door hand it
    on). Needs the ``prometheus`` extra.
    """

    def __init__(self, *, registry: Any = None, namespace: str = "idempotency") -> None:
        client = import_extra("prometheus_client", "prometheus", "Prometheus")
        if registry is None:
            registry = client.REGISTRY
        elif not isinstance(registry, client.CollectorRegistry):
            raise TypeError(
                f"registry must be a prometheus_client CollectorRegistry, got {registry!r}"
            )
        if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
            raise ValueError(
                "namespace must be a Prometheus metric name prefix (letters, digits, _ and :, "
                f"not starting with a digit), got {namespace!r}"
            )
        with _LOCK:
            by_namespace = _SHARED.setdefault(registry, {})
            metrics = by_namespace.get(namespace)
            if metrics is None:
                metrics = by_namespace[namespace] = _Metrics(client, registry, namespace)
        self._metrics = metrics
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"Prometheus(namespace={self.namespace!r})"

    # Equal when they share their metrics: a store timed for two of them is timed once, and
    # a breaker's transition is heard once.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prometheus) and other._metrics is self._metrics

    def __hash__(self) -> int:
        return id(self._metrics)

    def __call__(self, event: IdempotencyEvent) -> None:
        """Count the event, and record its wait."""
        kind = event.kind
        if kind in names.STORE_EVENTS:
            return
        metrics = self._metrics
        # (``conventions.attempt_labels``, inlined: this runs for every event.)
        labels = (kind, event.door or "", event.route_label, event.store or "")
        try:
            child = metrics.attempt_children[labels]
        except KeyError:
            child = metrics.attempt_child(labels)
        child.inc()
        waited_seconds = event.waited_seconds
        if waited_seconds is not None:
            wait_labels = labels[1:]
            try:
                waited = metrics.wait_children[wait_labels]
            except KeyError:
                waited = metrics.wait_child(wait_labels)
            waited.observe(waited_seconds)

    def watch_store(self, store: str, breaker: CircuitBreaker) -> None:
        """Report ``breaker`` in the breaker gauge as a ``store``'s."""
        self._metrics.breakers.watch(store, breaker)

    def store_call_started(self, store: str, operation: str) -> CallEnd:
        """Time a store call."""
        metrics = self._metrics
        children = metrics.call_children
        started = perf_counter()

        def end(error: BaseException | None) -> None:
            seconds = perf_counter() - started
            labels = (operation, store, "" if error is None else names.error_type(error))
            try:
                child = children[labels]
            except KeyError:
                child = metrics.call_child(labels)
            child.observe(seconds)

        return end


__all__ = ["Prometheus"]
