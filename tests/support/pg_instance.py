"""A PostgreSQL server of a test's own, which it may stop, restart and configure.

The session server (``postgres_dsn``) is shared, so the failover and password tests run on
their own: :class:`PostgresInstance` keeps its data directory and port across restarts, and
its ``pg_hba.conf`` asks one role (``secret_role``) for a password while trusting the rest.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.db_servers import (
    HOST,
    _die_with_parent,
    _postgres_ready,
    _server_user,
    _stop,
    _wait_until,
    postgres_bin_directory,
)
from tests.support.in_process import refuse_in_an_in_process_run
from tests.support.ports import free_port
from tests.support.session_servers import ServerUnavailable

SECRET_ROLE = "secret_role"
SECRET_PASSWORD = "right-password"


class PostgresInstance:
    """One server: :meth:`start`, :meth:`stop`, :meth:`restart`, same port and data."""

    def __init__(self, directory: Path) -> None:
        self.bin = postgres_bin_directory()
        self.user = _server_user()
        self.directory = directory
        self.data = directory / "data"
        self.log = directory / "postgres.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.dsn = f"postgresql://postgres@{HOST}:{self.port}/postgres"
        self._initdb()

    def _initdb(self) -> None:
        self.log.touch()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.directory, self.log):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        arguments = [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres"]
        arguments += ["-A", "trust", "-E", "UTF8", "--no-sync"]
        done = subprocess.run(arguments, capture_output=True, user=self.user, check=False)
        if done.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {done.stderr.decode(errors='replace')}")
        hba = self.data / "pg_hba.conf"
        hba.write_text(
            f"host all {SECRET_ROLE} {HOST}/32 scram-sha-256\nhost all all {HOST}/32 trust\n"
            "local all all trust\n"
        )

    def start(self) -> None:
        refuse_in_an_in_process_run("A PostgreSQL server")
        settings = {
            "listen_addresses": HOST,
            "port": str(self.port),
            "unix_socket_directories": str(self.directory),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
        }
        arguments = [str(self.bin / "postgres"), "-D", str(self.data)]
        for name, value in settings.items():
            arguments += ["-c", f"{name}={value}"]
        with self.log.open("ab") as log_file:
            self.process = subprocess.Popen(
                arguments,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                user=self.user,
                preexec_fn=_die_with_parent,
            )
        _wait_until(lambda: _postgres_ready(self.port), self.process, self.log)

    def stop(self) -> None:
        """Fast shutdown (SIGINT): clients are disconnected, as in a failover."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=10)
            _stop(self.process)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def postgres_instance() -> Iterator[PostgresInstance]:
    """A started :class:`PostgresInstance` with ``secret_role`` made, stopped at the end."""
    import psycopg

    with tempfile.TemporaryDirectory(prefix="idem-pg-own-") as directory:
        instance = PostgresInstance(Path(directory))
        instance.start()
        try:
            with psycopg.connect(instance.dsn, autocommit=True) as connection:
                connection.execute(
                    f"CREATE ROLE {SECRET_ROLE} LOGIN SUPERUSER PASSWORD '{SECRET_PASSWORD}'"
                )
            yield instance
        finally:
            instance.stop()
