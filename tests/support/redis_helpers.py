"""Private Redis servers for the RedisStore tests that change a server's state (a password,
a pause, a restart, cluster mode), and small readers of what a server saw.

Built on tests/support/db_servers.py (the binary, free ports, the wait for readiness); each server
runs on 127.0.0.1 in its own directory and is stopped when its block ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.support.db_servers import (
    HOST,
    _die_with_parent,
    _stop,
    _wait_until,
    redis_server_binary,
)
from tests.support.in_process import refuse_in_an_in_process_run
from tests.support.ports import cluster_port, free_port
from tests.support.session_servers import ServerUnavailable, require_or_skip


def _answers(port: int) -> bool:
    """The server takes commands (a password-protected one answers NOAUTH: it is up)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(64)[:1] in (b"+", b"-")
    except OSError:
        return False


@dataclass
class PrivateRedis:
    """A redis-server of one test: start, stop (kill) and start again on the same port."""

    arguments: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="idem-redis-")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> None:
        refuse_in_an_in_process_run("A Redis server")
        try:
            binary = redis_server_binary()
        except ServerUnavailable as error:
            require_or_skip(f"Redis server unavailable: {error}")
        log = self.directory / "redis.log"
        log.touch()
        self.process = subprocess.Popen(
            [
                binary,
                *("--bind", HOST, "--port", str(self.port), "--save", ""),
                *("--dir", str(self.directory), "--logfile", str(log)),
                *self.arguments,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        _wait_until(lambda: _answers(self.port), self.process, log)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL: no shutdown save, like a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)


@contextlib.contextmanager
def private_redis(*arguments: str) -> Iterator[PrivateRedis]:
    """A private redis-server with extra ``arguments`` (``--requirepass``, ...)."""
    server = PrivateRedis(arguments)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def single_node_cluster() -> Iterator[PrivateRedis]:
    """A one-node Redis Cluster owning every slot: multi-key commands across slots fail
    there (CROSSSLOT) exactly as on a real cluster."""
    node = PrivateRedis(
        ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"), cluster_port()
    )
    node.start()
    try:
        admin = redis.Redis(host=HOST, port=node.port)
        with contextlib.closing(admin):
            admin.execute_command("CLUSTER", "ADDSLOTS", *range(16384))  # type: ignore[no-untyped-call]
            deadline = time.monotonic() + 20
            while admin.cluster("info")["cluster_state"] != "ok":
                if time.monotonic() > deadline:
                    raise AssertionError("the one-node cluster did not become ok")
                time.sleep(0.05)
        yield node
    finally:
        node.stop()


def command_calls(client: Any) -> dict[str, int]:
    """Calls per command the server has run (INFO commandstats), INFO itself left out."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(values["calls"])
        for name, values in stats.items()
        if name != "cmdstat_info"
    }


def calls_since(client: Any, before: dict[str, int]) -> dict[str, int]:
    """The commands run since ``before`` (a ``command_calls`` reading), by name."""
    after = command_calls(client)
    return {
        name: count - before.get(name, 0)
        for name, count in after.items()
        if count != before.get(name, 0)
    }


@dataclass
class Command:
    """One command the server ran: who sent it (``"lua"``: a script) and its words."""

    source: str
    words: list[str]


class CommandLog:
    """The commands a server runs, read with MONITOR on a thread of its own.

    :meth:`take` returns what ran since the previous call: it sends a marker (``ECHO``) on
    another connection and waits until MONITOR shows it, so nothing is still in flight. A
    command sent by a client is one round trip; the ones a script runs are ``"lua"``'s.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._client = redis.Redis.from_url(url)
        self._seen: list[Command] = []
        self._lock = threading.Lock()
        self._marks = 0
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._ready = threading.Event()
        self._stop = f"stop-{uuid.uuid4().hex}"

    def _watch(self) -> None:
        client = redis.Redis.from_url(self._url)
        with contextlib.closing(client), client.monitor() as monitor:  # type: ignore[no-untyped-call]
            self._ready.set()
            for entry in monitor.listen():
                command = Command(entry["client_type"], entry["command"].split())
                with self._lock:
                    self._seen.append(command)
                if self._stop in command.words:
                    return

    def __enter__(self) -> CommandLog:
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("MONITOR did not start")
        self.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.echo(self._stop)
        self._thread.join(10)
        self._client.close()

    def take(self) -> list[Command]:
        """The commands run since the last call (the markers left out)."""
        self._marks += 1
        marker = f"mark-{self._marks}-{uuid.uuid4().hex}"
        deadline = time.monotonic() + 10
        while True:
            # (MONITOR may see the first markers only once it is fully registered.)
            self._client.echo(marker)
            wait_until = time.monotonic() + 0.2
            while time.monotonic() < wait_until:
                with self._lock:
                    if any(marker in command.words for command in self._seen):
                        taken, self._seen = self._seen, []
                        return [c for c in taken if not any("mark-" in w for w in c.words)]
                time.sleep(0.002)
            if time.monotonic() > deadline:
                raise AssertionError("MONITOR did not show the marker")

    def round_trips(self) -> list[str]:
        """The commands clients sent since the last call, by name (scripts' left out)."""
        return [c.words[0].lower() for c in self.take() if c.source != "lua"]
