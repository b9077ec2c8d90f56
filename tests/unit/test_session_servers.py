"""``session_server``, the shape of the real-server fixtures (tests/support/session_servers.py):
a server that cannot be had skips with the reason (fails under CI), any other error is raised, and
the server is stopped when the fixture ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.support.session_servers import ServerUnavailable, session_server


class Server:
    """A stand-in for ``run_redis`` and the like: records its start and stop."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.events: list[str] = []

    @contextlib.contextmanager
    def run(self) -> Iterator[str]:
        if self.error is not None:
            raise self.error
        self.events.append("started")
        try:
            yield "tcp://127.0.0.1:1"
        finally:
            self.events.append("stopped")


def test_yields_the_address_and_stops_the_server_at_teardown() -> None:
    server = Server()
    fixture = session_server("Thing", server.run)
    assert next(fixture) == "tcp://127.0.0.1:1"
    assert server.events == ["started"]
    with pytest.raises(StopIteration):
        next(fixture)  # what pytest does at teardown
    assert server.events == ["started", "stopped"]


def test_an_unavailable_server_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    fixture = session_server("Thing", Server(ServerUnavailable("no thing-server")).run)
    with pytest.raises(pytest.skip.Exception, match=r"^Thing server unavailable: no thing-server$"):
        next(fixture)


def test_under_ci_an_unavailable_server_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    fixture = session_server("Thing", Server(ServerUnavailable("no thing-server")).run)
    with pytest.raises(pytest.fail.Exception, match=r"Thing server unavailable: no thing-server"):
        next(fixture)


def test_another_start_error_is_raised_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    fixture = session_server("Thing", Server(PermissionError("port 1")).run)
    with pytest.raises(PermissionError, match="port 1"):
        next(fixture)
