"""A deadline on every PostgreSQL statement, kept on the client.

``statement_timeout`` is the server's: a server that hangs (stopped, swapping, wedged) or a
network that drops packets without a reset never sends its answer, and a read waiting for
it would wait for ever. A watchdog thread shuts the socket of a statement down once its
deadline passed: the blocked read fails at once (sync or asyncio alike), psycopg marks the
connection broken, the pool drops it, and the store answers ``timed_out`` (503 on a claim).
Arming costs a dict insert under a lock; the thread wakes a few times a second.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

# How often the watchdog looks: a statement may outlive its deadline by this much.
CHECK_INTERVAL_SECONDS = 0.25


class Watchdog:
    """Shuts down the sockets of statements past their deadlines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, int]] = {}  # token: (deadline, socket fd)
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, connection: Any, seconds: float) -> Iterator[None]:
        """Run the block with ``connection``'s socket shut down after ``seconds``; the error
        the shutdown caused comes out as psycopg's ``ConnectionTimeout`` (``timed_out``)."""
        token = next(self._tokens)
        with self._lock:
            self._armed[token] = (time.monotonic() + seconds, connection.pgconn.socket)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-postgres-deadlines", daemon=True
                )
                self._thread.start()
        try:
            yield
        except Exception as error:
            with self._lock:
                fired = token in self._fired
            if fired:
                import psycopg

                raise psycopg.errors.ConnectionTimeout(
                    f"no answer within {seconds:.1f} s: the connection was broken off"
                ) from error
            raise
        finally:
            with self._lock:
                self._armed.pop(token, None)
                self._fired.discard(token)

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_INTERVAL_SECONDS)
            now = time.monotonic()
            with self._lock:
                late = [
                    (token, fd) for token, (deadline, fd) in self._armed.items() if deadline <= now
                ]
                for token, _ in late:
                    del self._armed[token]
                    self._fired.add(token)
            for _, fd in late:
                _shut_down(fd)


def _shut_down(fd: int) -> None:
    # shutdown() acts on the socket itself, so a duplicate of its descriptor reaches it
    # without closing the descriptor psycopg still owns.
    with contextlib.suppress(OSError):
        duplicate = socket.socket(fileno=socket.dup(fd))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()


WATCHDOG = Watchdog()
