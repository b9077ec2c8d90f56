"""Ports for servers the tests and benchmarks start on 127.0.0.1.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range,
the same range every outgoing connection on the machine takes its source port from: between
the probe closing and the server binding, a client somewhere (another test's, another
worker's) can take it, and the server dies with "Address already in use" (a Sentinel set did,
once, in CI). A port below that range is never handed to a connection, so only another
server picking the same number can collide: random numbers out of thousands, probed first,
make that rare, and ``bind(0)`` stays as the fallback should the range be crowded.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
_LOWEST = 10_000
_TRIES = 100


def _ephemeral_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default; macOS's starts at 49152
    return max(low, _LOWEST + 1_000)


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(upper: int | None = None) -> int:
    """A port on 127.0.0.1 nothing listens on now, outside the ephemeral range; below
    ``upper`` when given (a Redis Cluster node needs its port + 10000 free too)."""
    top = min(_ephemeral_start(), upper or 65_536) - 1
    for _ in range(_TRIES):
        port = random.randint(_LOWEST, top)
        if _binds(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        found: int = probe.getsockname()[1]
    return found


def cluster_port() -> int:
    """A free port whose Redis Cluster bus port (10000 above it) is free too, both outside
    the ephemeral range."""
    top = _ephemeral_start() - 10_000 - 1
    for _ in range(_TRIES):
        port = random.randint(_LOWEST, top)
        if _binds(port) and _binds(port + 10_000):
            return port
    raise OSError("no free port pair for a Redis Cluster node below the ephemeral range")
