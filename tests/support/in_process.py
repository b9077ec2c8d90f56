"""Which tests need a server outside the test process, for ``make check``'s quick run.

``make check`` runs the unit and contract tests on the in-process stores (``MemoryStore``,
``SQLiteStore``) only: ``pytest -m "not servers"``. A test gets the ``servers`` mark when it
asks for a server fixture (moto, DynamoDB Local, Redis, PostgreSQL, a broker), directly or
through its fixtures, or when one of its parameters is a store kind or adapter/store
combination on such a server (the store suites reach their server through
``request.getfixturevalue``, which a test's fixture list does not show).

The mark is checked, not trusted: ``make check`` sets ``IDEMPOTENCY_TESTS_IN_PROCESS=1``,
under which a server fixture fails the test that reached it unmarked
(:func:`refuse_in_an_in_process_run`), so a test cannot slip a server into the quick run.
"""

from __future__ import annotations

import os

import pytest

IN_PROCESS_VARIABLE = "IDEMPOTENCY_TESTS_IN_PROCESS"
IN_PROCESS = os.environ.get(IN_PROCESS_VARIABLE) == "1"
MARK = "servers"
# The fixtures that start or reach a server outside the test process.
SERVER_FIXTURES = frozenset(
    {
        "moto_endpoint",
        "dynamodb_local_endpoint",
        "redis_url",
        "postgres_dsn",
        "rabbitmq_url",
        "nats_url",
    }
)
# A store kind (tests/support/store_kinds.py), harness combination or backend on such a server
# names one of these among its dash-separated parts: "dynamodb-async", "asgi-dynamodb-local",
# "redis", "postgres-processes", "moto" ...
SERVER_KIND_PARTS = frozenset({"dynamodb", "moto", "redis", "postgres"})


def is_server_kind(value: object) -> bool:
    """A parameter naming a store on a server: a kind string, or an object with such a
    ``store`` (a harness ``Combo``)."""
    kind = getattr(value, "store", value)
    return isinstance(kind, str) and not SERVER_KIND_PARTS.isdisjoint(kind.split("-"))


def needs_a_server(item: pytest.Item) -> bool:
    """Whether ``item`` reaches a server outside the test process."""
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(map(is_server_kind, callspec.params.values()))


def mark_server_tests(items: list[pytest.Item]) -> None:
    """Adds the ``servers`` mark to every item that needs a server."""
    for item in items:
        if needs_a_server(item):
            item.add_marker(MARK)


def refuse_in_an_in_process_run(server: str) -> None:
    """In ``make check``'s run, fails the test that reached ``server``: its mark is missing."""
    if IN_PROCESS:
        pytest.fail(
            f"{server} was started in an in-process run ({IN_PROCESS_VARIABLE}=1, make check): "
            f"the test needs the {MARK!r} mark (tests/support/in_process.py decides it from "
            "its fixtures and parameters)"
        )
