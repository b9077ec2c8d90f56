"""Ports for servers the tests and benchmarks start on 127.0.0.1.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range,
the same range every outgoing connection on the machine takes its source port from: between
the probe closing and the server binding, a client somewhere (another test's, another
worker's) can take it, and the server dies with "Address already in use" (a Sentinel set did,
once, in CI). A port outside that range is never handed to a connection, so only another
server picking the same number can collide: random numbers out of thousands, probed first,
make that rare. Where the range leaves too few ports outside it, ``bind(0)`` it is.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
_LOWEST = 10_000
_HIGHEST = 65_535
_TRIES = 100
_ENOUGH = 2_000  # ports outside the ephemeral range, for picking at random to be worth it


def _outside_ephemeral() -> list[range]:
    """The ranges of ports from 10000 up that the ephemeral range leaves out."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32_768, 60_999  # Linux's default
    return [
        span
        for span in (range(_LOWEST, low), range(max(high + 1, _LOWEST), _HIGHEST + 1))
        if len(span) >= _ENOUGH
    ]


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _any_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
    return port


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now, outside the ephemeral range where it
    leaves room (for a server to bind, or as an endpoint that refuses connections)."""
    spans = _outside_ephemeral()
    for _ in range(_TRIES if spans else 0):
        port = random.choice(random.choice(spans))
        if _binds(port):
            return port
    return _any_port()


def cluster_port() -> int:
    """A free port whose Redis Cluster bus port (10000 above it) is free too; both outside
    the ephemeral range where it leaves room (in one span: the bus's is never a client's)."""
    spans = [range(span.start, span.stop - 10_000) for span in _outside_ephemeral()]
    candidates = [span for span in spans if len(span) >= _ENOUGH] or [range(20_000, 45_001)]
    for _ in range(_TRIES):
        port = random.choice(random.choice(candidates))
        if _binds(port) and _binds(port + 10_000):
            return port
    from tests.support.session_servers import ServerUnavailable

    raise ServerUnavailable("no free port pair (a node's and its bus's) for a Redis Cluster node")
