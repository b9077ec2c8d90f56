"""Real RabbitMQ and NATS servers for the tests, on 127.0.0.1, one of each per test session.

``rabbitmq_url`` and ``nats_url`` (session fixtures) start the server on first use in a
temporary directory, on free ports, and stop it when the session ends (or when the test
process dies: ``PR_SET_PDEATHSIG``, as for ``tests/support/db_servers.py``). The binaries come from
Debian's ``rabbitmq-server`` and ``nats-server`` packages, which
``scripts/install-servers.sh`` installs (as root) without letting them start their own
services; a machine without them skips the tests with the reason (fails them under CI).

RabbitMQ runs from its own ``sbin`` script (not Debian's wrapper, which switches to the
``rabbitmq`` user and its fixed directories), with every directory and port of its own: the
node name, the AMQP and distribution ports, Mnesia and logs under the temporary directory,
its Erlang cookie in a temporary ``HOME``, and its own ``epmd`` on a free port bound to
127.0.0.1, stopped with it (an ``epmd`` started by Erlang would outlive the session).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.db_servers import HOST, _die_with_parent, _stop, _wait_until
from tests.support.in_process import refuse_in_an_in_process_run
from tests.support.ports import free_port
from tests.support.session_servers import ServerUnavailable, session_server

# RabbitMQ's boot (Erlang, Mnesia, its plugins) takes several seconds on 2 busy cores.
RABBITMQ_START_TIMEOUT_SECONDS = 90.0
_RABBITMQ_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)


def rabbitmq_server_binary() -> str:
    for candidate in _RABBITMQ_SCRIPTS:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("rabbitmq-server")
    if found:
        return found
    raise ServerUnavailable(
        "no rabbitmq-server: install Debian's rabbitmq-server (scripts/install-servers.sh)"
    )


def _amqp_ready(port: int) -> bool:
    """The server answers the AMQP 0-9-1 protocol header with a Connection.Start frame."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as connection:
            connection.sendall(b"AMQP\x00\x00\x09\x01")
            connection.settimeout(2)
            return connection.recv(1)[:1] == b"\x01"  # frame type 1: a method frame
    except OSError:
        return False


def _epmd_ready(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def run_rabbitmq() -> Iterator[str]:
    """A RabbitMQ node on 127.0.0.1 for the block; its URL (``amqp://guest:guest@...``)."""
    refuse_in_an_in_process_run("A RabbitMQ server")
    script = rabbitmq_server_binary()
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    if not os.access(epmd, os.X_OK):
        raise ServerUnavailable("no epmd (Erlang's port mapper): reinstall rabbitmq-server")
    with tempfile.TemporaryDirectory(prefix="idem-rabbitmq-") as directory:
        base = Path(directory)
        log = base / "rabbitmq.out"
        log.touch()
        epmd_port, amqp_port, dist_port = free_port(), free_port(), free_port()
        environment = {
            **os.environ,
            "HOME": directory,  # the Erlang cookie is written here
            "ERL_EPMD_ADDRESS": HOST,
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"idem{amqp_port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_LOGS": "-",  # to standard output, which goes to rabbitmq.out
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),  # none: the defaults
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
        }
        (base / "enabled_plugins").write_text("[].\n")
        with log.open("ab") as output:
            epmd_process = subprocess.Popen(
                [epmd, "-port", str(epmd_port), "-address", HOST],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=environment,
                preexec_fn=_die_with_parent,
            )
            try:
                _wait_until(lambda: _epmd_ready(epmd_port), epmd_process, log)
                process = subprocess.Popen(
                    [script],
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=environment,
                    cwd=directory,
                    preexec_fn=_die_with_parent,
                    start_new_session=True,  # its Erlang children are stopped with it
                )
                try:
                    _wait_until(
                        lambda: _amqp_ready(amqp_port),
                        process,
                        log,
                        timeout=RABBITMQ_START_TIMEOUT_SECONDS,
                    )
                    yield f"amqp://guest:guest@{HOST}:{amqp_port}/"
                finally:
                    _stop_group(process)
            finally:
                _stop(epmd_process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (the script, beam, its port helpers)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # what outlived the script


# --- NATS ----------------------------------------------------------------------------------


def nats_server_binary() -> str:
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerUnavailable(
        "no nats-server: install Debian's nats-server (scripts/install-servers.sh)"
    )


def _nats_ready(port: int) -> bool:
    """The server greets a client with its INFO line."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as connection:
            connection.settimeout(2)
            return connection.recv(5) == b"INFO "
    except OSError:
        return False


@contextlib.contextmanager
def run_nats() -> Iterator[str]:
    """A NATS server with JetStream on 127.0.0.1 for the block; its URL."""
    refuse_in_an_in_process_run("A NATS server")
    binary = nats_server_binary()
    with tempfile.TemporaryDirectory(prefix="idem-nats-") as directory:
        log = Path(directory) / "nats.log"
        log.touch()
        port = free_port()
        arguments = [
            binary,
            "--addr",
            HOST,
            "--port",
            str(port),
            "--jetstream",
            "--store_dir",
            directory,
            "--log",
            str(log),
        ]
        process = subprocess.Popen(
            arguments,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            _wait_until(lambda: _nats_ready(port), process, log)
            yield f"nats://{HOST}:{port}"
        finally:
            _stop(process)


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """URL of a RabbitMQ node on 127.0.0.1 for the whole session (tests use their own
    queues); skipped with the reason where none can be had."""
    yield from session_server("RabbitMQ", run_rabbitmq)


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """URL of a NATS server (JetStream on) on 127.0.0.1 for the whole session (tests use
    their own streams and subjects); skipped with the reason where none can be had."""
    yield from session_server("NATS", run_nats)
