"""The lag of the replicated test servers (``tests/support/replicated_servers.LagProxy``).

What must hold: a byte from the upstream (a primary) reaches the downstream (its replica)
``lag_seconds`` late, and the bytes still held when the upstream dies are lost with it, as
the backlog of a crashed primary's host is: a proxy that delivered them after the crash hid
every write a failover loses.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from tests.support.replicated_servers import LagProxy

LAG_SECONDS = 0.3
HELD_SECONDS = 30.0  # (far beyond the test: a byte held this long is never sent in time)


@contextlib.contextmanager
def upstream_sending(data: bytes, then_close: bool) -> Iterator[int]:
    """A server on a free port that sends ``data`` to its first connection, then closes it
    at once (``then_close``) or keeps it open for the block; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(data)
            if not then_close:
                release.wait(60)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield listener.getsockname()[1]
    finally:
        release.set()
        server.join(60)
        listener.close()


def read_all(port: int) -> bytes:
    """Everything the proxy sends one connection, until it closes or resets it."""
    received = b""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=60) as connection,
        contextlib.suppress(ConnectionResetError),
    ):
        while chunk := connection.recv(65536):
            received += chunk
    return received


def test_a_byte_from_a_live_upstream_arrives_lag_seconds_late() -> None:
    with (
        upstream_sending(b"replicated", then_close=False) as port,
        LagProxy(port, LAG_SECONDS) as proxy,
    ):
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as connection:
            received = connection.recv(65536)
        assert received == b"replicated"
        assert time.monotonic() - started >= LAG_SECONDS


def test_the_bytes_held_when_the_upstream_dies_are_lost_with_it() -> None:
    with (
        upstream_sending(b"acknowledged, never sent", then_close=True) as port,
        LagProxy(port, HELD_SECONDS) as proxy,
    ):
        started = time.monotonic()
        assert read_all(proxy.port) == b""
        assert time.monotonic() - started < HELD_SECONDS  # (closed at the death, not after)
