"""The one shape of a fixture that runs a real server for the tests (``redis_url``,
``postgres_dsn``, ``rabbitmq_url``, ``nats_url``): start it on first use, skip the tests that
need it with the reason where it cannot be had (fail them under CI), stop it at the end.

A fixture is ``yield from session_server("Redis", run_redis)``: ``run_redis`` is a context
manager that yields the server's address and raises ``ServerUnavailable`` (saying why) when
the machine cannot run one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import NoReturn, TypeVar

import pytest

T = TypeVar("T")


class ServerUnavailable(Exception):
    """The server cannot be had on this machine; the message says why."""


def require_or_skip(reason: str) -> NoReturn:
    """Skip with ``reason``; under CI, fail: CI installs the servers (make test)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must run these tests: scripts/install-servers.sh)")
    pytest.skip(reason)


def session_server(name: str, run: Callable[[], AbstractContextManager[T]]) -> Iterator[T]:
    """The body of a server fixture: ``run()``'s address for the fixture's scope.

    Only a ``ServerUnavailable`` raised while the server starts skips ("``name`` server
    unavailable: why"); anything else, at start or later, is an error of the tests that
    asked for it. The server stops when the fixture is torn down.
    """
    with contextlib.ExitStack() as stack:
        try:
            address = stack.enter_context(run())
        except ServerUnavailable as error:
            require_or_skip(f"{name} server unavailable: {error}")
        yield address
