"""Who watches a store's calls: the metrics and traces hooks (``observability``) time each
call and read the breaker's state through this, written once for every store.

A hook that has the :class:`StoreObserver` methods, given as ``on_event=`` to a store (or to
a door, which hands it on to its store), is told of every store call as it starts and as it
ends. A plain ``on_event`` function is not: it hears the events, not the calls. With no
observer, a store call pays one attribute read and a truth test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from ..events import OnEvent, Reporter, check_hooks, one_hook

if TYPE_CHECKING:
    from .breaker import CircuitBreaker

T = TypeVar("T")

# Called once a store call is over: with its error, or ``None`` when the store answered.
CallEnd = Callable[[BaseException | None], None]


@runtime_checkable
class StoreObserver(Protocol):
    """What a hook implements to watch store calls (``OpenTelemetry`` and ``Prometheus`` do)."""

    def watch_store(self, store: str, breaker: CircuitBreaker) -> None:
        """From now on, report ``breaker``'s state as the state of a ``store`` (its kind)."""

    def store_call_started(self, store: str, operation: str) -> CallEnd:
        """A call of ``operation`` to a ``store`` starts now; the result is called when it
        is over (the thread or task that started it calls it)."""


class StoreObservers:
    """One store's observers, and the kind of store they see it as (``"redis"``, ...)."""

    __slots__ = ("_breaker", "_lock", "_reporter", "kind", "observers")

    def __init__(self, kind: str, breaker: CircuitBreaker, on_event: OnEvent = None) -> None:
        """``on_event``: the store's own hooks (checked here, as a door checks its own).
        They hear the breaker's transitions; those that are observers watch every call."""
        self.kind = kind
        self._breaker = breaker
        self._lock = threading.Lock()
        # A tuple replaced whole (never changed in place): the hot path reads it unlocked.
        self.observers: tuple[StoreObserver, ...] = ()
        hooks = check_hooks(on_event)
        # Held here: the breaker holds its reporters weakly.
        self._reporter = Reporter(one_hook(hooks), http=False, store=kind) if hooks else None
        if self._reporter is not None:
            breaker.subscribe(self._reporter)
        for hook in hooks:
            if isinstance(hook, StoreObserver):
                self.add(hook)

    def add(self, observer: StoreObserver) -> None:
        """Watch this store with ``observer`` (once, however many doors hand it on: an
        observer equal to one already watching is that one)."""
        with self._lock:
            if observer in self.observers:
                return
            self.observers = (*self.observers, observer)
        observer.watch_store(self.kind, self._breaker)

    def started(self, operation: str) -> tuple[CallEnd, ...]:
        """Tell every observer a call of ``operation`` starts; what to call when it ends."""
        kind, observers = self.kind, self.observers
        if len(observers) == 1:  # the usual case: no generator to build and run
            return (observers[0].store_call_started(kind, operation),)
        return tuple([observer.store_call_started(kind, operation) for observer in observers])


def ended(ends: tuple[CallEnd, ...], error: BaseException | None) -> None:
    """Tell the observers of a call (``StoreObservers.started``) that it ended."""
    for end in ends:
        end(error)


def observe(
    observers: StoreObservers, operation: str, call: Callable[..., T], *arguments: object
) -> T:
    """``call(*arguments)``, its start and end told to ``observers``."""
    watching = observers.observers
    if len(watching) == 1:
        # The usual case, written out: no tuple of ends to build and walk for each call.
        end = watching[0].store_call_started(observers.kind, operation)
        try:
            result = call(*arguments)
        except BaseException as error:
            end(error)
            raise
        end(None)
        return result
    ends = observers.started(operation)
    try:
        result = call(*arguments)
    except BaseException as error:
        ended(ends, error)
        raise
    ended(ends, None)
    return result


def store_kind(store: object) -> str:
    """The kind of ``store`` as metrics name it: its ``observers.kind`` (every store of the
    package has one), else its class name, lower-cased, without ``Async`` and ``Store``."""
    observers = getattr(store, "observers", None)
    if isinstance(observers, StoreObservers):
        return observers.kind
    name = type(store).__name__.lower()
    return name.removeprefix("async").removesuffix("store") or name


__all__ = ["CallEnd", "StoreObserver", "StoreObservers", "ended", "observe", "store_kind"]
