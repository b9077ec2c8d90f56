"""The lag of the replicated test servers (``tests/support/replicated_servers.LagProxy``).

What must hold: a byte from the upstream (a primary) reaches the downstream (its replica)
``lag_seconds`` late, and the bytes still held when the upstream dies are lost with it, as
the backlog of a crashed primary's host is: a proxy that delivered them after the crash hid
every write a failover loses. So on the lagged servers a write the primary acknowledged just
before its crash is missing after the failover, on Redis with Sentinel (which must keep its
replicas behind the proxy) and on PostgreSQL: the loss the failover options exist for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.replicated_servers import (
    LagProxy,
    postgres_pair,
    redis_sentinel_set,
    wait_for,
)
from tests.support.session_servers import ServerUnavailable, require_or_skip

LAG_SECONDS = 0.3
HELD_SECONDS = 30.0  # (far beyond the test: a byte held this long is never sent in time)
# Far more than a loaded machine takes between a write's answer and the crash that follows
# it; for Sentinel, less than its failover (over a second), so a proxy that delivered late
# would have delivered the write before the promotion.
BEHIND_SECONDS = 1.0
STANDBY_BEHIND_SECONDS = 3.0


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


def node(port: int) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)


@pytest.mark.servers
def test_a_write_acknowledged_just_before_the_crash_is_lost_by_a_sentinel_failover() -> None:
    with contextlib.ExitStack() as stack:
        try:
            servers = stack.enter_context(redis_sentinel_set(lag_seconds=BEHIND_SECONDS))
        except ServerUnavailable as error:
            require_or_skip(f"Redis Sentinel set unavailable: {error}")
        assert servers.replicas_lagged()  # (Sentinel left its replica behind the proxy)
        node(servers.primary_port).set("acknowledged", "1")
        old = servers.crash_primary()

        def link_down() -> bool:
            replication: dict[str, Any] = node(servers.replica_port).info("replication")
            return bool(replication["master_link_status"] == "down")

        wait_for(link_down, "the replica losing its primary")
        promoted = servers.wait_for_failover(old)
        assert node(promoted).get("acknowledged") is None


@pytest.mark.servers
def test_a_commit_acknowledged_just_before_the_crash_is_lost_by_promoting_the_standby() -> None:
    import psycopg

    with contextlib.ExitStack() as stack:
        try:
            pair = stack.enter_context(postgres_pair(lag_seconds=STANDBY_BEHIND_SECONDS))
        except ServerUnavailable as error:
            require_or_skip(f"PostgreSQL primary and standby unavailable: {error}")

        def standby_has_the_table() -> bool:
            with psycopg.connect(pair.node_dsn(pair.standby_port)) as standby:
                row = standby.execute("SELECT to_regclass('acknowledged')").fetchone()
                return row is not None and row[0] is not None

        with psycopg.connect(pair.node_dsn(pair.primary_port), autocommit=True) as primary:
            primary.execute("CREATE TABLE acknowledged (id int)")
            wait_for(standby_has_the_table, "the table replayed on the standby")
            primary.execute("INSERT INTO acknowledged VALUES (1)")
        pair.crash_primary()

        def receiver_stopped() -> bool:
            with psycopg.connect(pair.node_dsn(pair.standby_port)) as standby:
                query = "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
                return standby.execute(query).fetchone() == (0,)

        wait_for(receiver_stopped, "the standby losing its primary")
        pair.promote()
        with psycopg.connect(pair.node_dsn(pair.standby_port)) as promoted:
            assert promoted.execute("SELECT count(*) FROM acknowledged").fetchone() == (0,)
