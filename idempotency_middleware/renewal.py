"""Lease renewal for the WSGI adapter: one daemon thread per middleware renews every claim
whose handler is still running, so a slow but alive handler is not taken over.

(The ASGI adapter renews on the app's own event loop instead; see ``asgi.LeaseRenewal``.)
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import core
from .events import Reporter
from .stores.base import StoreUnavailable, SyncStore


@dataclass(order=True)
class Lease:
    due: float
    sequence: int
    attempt: core.Attempt = field(compare=False)
    active: bool = field(default=True, compare=False)


class LeaseRenewer:
    """Renews registered claims every ``lock_timeout / 3`` until they are cancelled.

    A process that dies takes this thread with it, so its claims expire and are taken over.
    A handler thread that hangs forever keeps its claim renewed; give such handlers their
    own timeouts.
    """

    def __init__(
        self, store: SyncStore, reporter: Reporter, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._reporter = reporter
        self._clock = clock
        self._heap: list[Lease] = []
        self._sequence = itertools.count()
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def register(self, attempt: core.Attempt) -> Lease:
        lease = Lease(
            time.monotonic() + core.renewal_interval(attempt.policy), next(self._sequence), attempt
        )
        with self._condition:
            heapq.heappush(self._heap, lease)
            if self._closed:
                self._closed = False  # used again after close(): start a fresh thread
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-lease-renewer", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is lease:
                self._condition.notify()
        return lease

    def cancel(self, lease: Lease) -> None:
        # Lazy deletion: the entry is dropped when it reaches the top of the heap.
        lease.active = False

    def close(self) -> None:
        """Stop the renewal thread (claims still running are no longer renewed)."""
        with self._condition:
            self._closed = True
            self._heap.clear()
            self._condition.notify()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._closed and (not self._heap or self._heap[0].due > time.monotonic()):
                    timeout = self._heap[0].due - time.monotonic() if self._heap else None
                    self._condition.wait(timeout)
                if self._closed:
                    return
                lease = heapq.heappop(self._heap)
            if lease.active and self._renew(lease.attempt):
                lease.due = time.monotonic() + core.renewal_interval(lease.attempt.policy)
                with self._condition:
                    heapq.heappush(self._heap, lease)

    def _renew(self, attempt: core.Attempt) -> bool:
        claim = attempt.claim
        try:
            return self._store.renew(
                claim.key, claim.owner, self._clock() + claim.lock_timeout_seconds
            )
        except StoreUnavailable as error:
            self._reporter.emit(attempt.event("store_error", operation="renew", error=repr(error)))
            return True  # keep trying: the lock may still hold until the next attempt
