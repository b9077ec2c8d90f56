"""Waiters woken by the store's own news of a key (Redis pub/sub, PostgreSQL LISTEN/NOTIFY).

One daemon thread and one listening connection per store object, whatever the number of
waiters, sync or async. The backend part is a ``Listen`` function: subscribe, call
``ready()`` once subscribed, ``changed(key)`` per message, return or raise when the
connection is lost (the thread reconnects with backoff; waiters poll meanwhile).

No news is lost between a waiter's claim and its registration: ``mark()`` is read before
the claim is sent, and a key changed since (or a channel (re)subscribed since, when news
may have been missed) ends the wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

Listen = Callable[[Callable[[], None], Callable[[str], None], threading.Event], None]

_LOG = logging.getLogger("idempotency_middleware")
_MAX_REMEMBERED = 4096  # keys whose last change is kept; past it, every waiter re-polls once
_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0  # seconds between reconnections, doubling
# How long close() waits for the thread: past its receive timeout (0.5 s), not forever.
CLOSE_WAIT_SECONDS = 1.0
_JOIN_POLL_SECONDS = 0.01  # how often aclose() looks whether the thread ended


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Wakeups:
    """Who waits on which key, and the thread that hears the changes."""

    def __init__(self, listen: Listen, name: str, store: str = "") -> None:
        self._listen = listen
        self._name = name
        self._store = store or name  # how the logs name the store
        # Whether the channel was lost and not yet back (logged once per loss).
        self._lost = False
        self._lock = threading.Lock()
        self._seq = 0  # bumped by every change heard
        self._reset = 0  # the seq of the last (re)subscription: news before it may be lost
        self._changed: dict[str, int] = {}
        self._waiting: dict[str, list[Any]] = {}  # threading.Event | asyncio.Future
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry = _RETRY_FIRST
        self.subscribed = False

    def mark(self) -> int:
        """Read before a claim; a change heard after it ends a wait on the claim's key."""
        return self._seq

    def start(self) -> None:
        """Listen, if not yet (the first waiter calls it; so may an app at start-up)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._lock:
                if self._thread is thread:  # (forked, or first: one starter)
                    self._thread = threading.Thread(
                        target=self._run,
                        args=(self._stopping,),
                        name=f"idempotency-wakeups-{self._name}",
                        daemon=True,
                    )
                    self._thread.start()

    def _since(self, key: str, mark: int) -> bool:
        return max(self._changed.get(key, 0), self._reset) > mark

    def wait(self, key: str, mark: int, timeout: float) -> None:
        """Block up to ``timeout`` seconds, less when ``key`` changes."""
        self.start()
        event = threading.Event()
        with self._lock:
            if self._since(key, mark):
                return
            self._waiting.setdefault(key, []).append(event)
        try:
            event.wait(timeout)
        finally:
            self._forget(key, event)

    def watch(self, key: str, mark: int) -> asyncio.Future[None]:
        """A future of the running loop, settled when ``key`` changes; ``unwatch`` it."""
        self.start()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._since(key, mark):
                future.set_result(None)
            else:
                self._waiting.setdefault(key, []).append(future)
        return future

    def unwatch(self, key: str, future: asyncio.Future[None]) -> None:
        self._forget(key, future)

    def _forget(self, key: str, waiter: object) -> None:
        with self._lock:
            waiters = self._waiting.get(key)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiting[key]

    def _wake(self, waiters: list[Any]) -> None:
        for waiter in waiters:
            if isinstance(waiter, threading.Event):
                waiter.set()
            else:
                # (A closed loop raises RuntimeError: nobody is waiting on it any more.)
                with contextlib.suppress(RuntimeError):
                    waiter.get_loop().call_soon_threadsafe(_settle, waiter)

    def changed(self, key: str) -> None:
        with self._lock:
            self._seq += 1
            if len(self._changed) >= _MAX_REMEMBERED:
                self._changed.clear()
                self._reset = self._seq
            self._changed[key] = self._seq
            waiters = self._waiting.pop(key, [])
        self._wake(waiters)

    def ready(self) -> None:
        """Subscribed (again): news may have been missed meanwhile, so every waiter re-polls."""
        with self._lock:
            self._seq += 1
            self._reset = self._seq
            waiters = [waiter for each in self._waiting.values() for waiter in each]
            self._waiting.clear()
        if self.subscribed:
            # Subscribed again without the listener returning: its client lost the
            # connection and made it anew underneath (redis-py does), news lost meanwhile.
            self._lost_channel("the client reconnected it")
        self.subscribed = True
        self._retry = _RETRY_FIRST
        if self._lost:
            self._lost = False
            _LOG.info("wake-up channel of %s is back: waiters are pushed again", self._store)
        self._wake(waiters)

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            error: Exception | None = None
            try:
                self._listen(self.ready, self.changed, stopping)
            except Exception as raised:  # the channel is lost: waiters poll meanwhile
                error = raised
            self.subscribed = False
            if stopping.is_set():
                return  # closed: not a loss
            self._lost_channel(repr(error) if error is not None else "it ended")
            if stopping.wait(self._retry):
                return
            self._retry = min(self._retry * 2, _RETRY_MAX)

    def _lost_channel(self, reason: str) -> None:
        """A lost channel slows every waiter down to its polls: worth a warning, once per
        loss (the reconnection attempts that follow fail quietly until one succeeds)."""
        if self._lost:
            _LOG.debug("wake-up channel of %s still lost: %s", self._store, reason)
            return
        self._lost = True
        _LOG.warning(
            "wake-up channel of %s lost (%s): waiters poll the store until it is back",
            self._store,
            reason,
        )

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """Stop listening; the next waiter listens again, as a closed store's next call
        reconnects. The thread ends within its next receive timeout (0.5 s): ``timeout``
        seconds are waited for it."""
        thread = self._stop()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    async def aclose(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """``close()`` from a running loop: the wait for the thread does not block it."""
        thread = self._stop()
        if thread is None or thread is threading.current_thread():
            return
        deadline = time.monotonic() + timeout
        # (A thread's end cannot be awaited; a join would block the loop: look, bounded.)
        while thread.is_alive() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_JOIN_POLL_SECONDS)

    def _stop(self) -> threading.Thread | None:
        with self._lock:
            self._stopping.set()
            thread = self._thread
            self._stopping, self._thread = threading.Event(), None
            self.subscribed = False
            self._lost = False
        return thread
