"""The stores a hook watches, for the breaker gauge: read at collection, never pushed, so
the gauge is right however many doors share a store and whichever heard its transitions."""

from __future__ import annotations

import threading
import weakref

from ..stores.breaker import CircuitBreaker


class WatchedBreakers:
    """The breakers of the stores a hook watches, held weakly (a store that is gone drops
    out), by the kind of store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._breakers: list[tuple[str, weakref.ref[CircuitBreaker]]] = []

    def watch(self, store: str, breaker: CircuitBreaker) -> None:
        with self._lock:
            if not any(known() is breaker for _, known in self._breakers):
                self._breakers.append((store, weakref.ref(breaker)))

    def open_by_store(self) -> dict[str, int]:
        """Per kind of store, 1 when a breaker of that kind is open (or probing), else 0."""
        states: dict[str, int] = {}
        with self._lock:
            self._breakers = [(store, ref) for store, ref in self._breakers if ref() is not None]
            watched = list(self._breakers)
        for store, ref in watched:
            breaker = ref()
            if breaker is not None:
                opened = 0 if breaker.state == "closed" else 1
                states[store] = max(states.get(store, 0), opened)
        return states
