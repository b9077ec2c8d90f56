"""``tests/support/in_process.py``: which tests ``make check`` leaves out (those that need a
server outside the test process), and the guard that fails one that slipped through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.support import in_process
from tests.support.in_process import is_server_kind, needs_a_server


@dataclass
class CallSpec:
    params: dict[str, Any]


@dataclass
class Item:
    fixturenames: list[str] = field(default_factory=list)
    callspec: CallSpec | None = None


@dataclass(frozen=True)
class Combo:
    adapter: str
    store: str


def needs(item: Item) -> bool:
    return needs_a_server(cast(pytest.Item, item))


@pytest.mark.parametrize(
    "kind",
    ["dynamodb", "dynamodb-local-async", "dynamodb-sdk", "redis", "postgres-processes", "moto"],
)
def test_a_store_kind_on_a_server_needs_one(kind: str) -> None:
    assert is_server_kind(kind)
    assert is_server_kind(Combo("asgi", kind))
    assert needs(Item(callspec=CallSpec({"store_kind": kind})))


@pytest.mark.parametrize(
    "value",
    ["memory", "sqlite-async", "sqlite-changes", "kv", "asgi-memory", "redis://", 3, None],
)
def test_an_in_process_kind_or_another_parameter_does_not(value: object) -> None:
    assert not is_server_kind(value)
    assert not needs(Item(["tmp_path"], CallSpec({"kind": value})))


@pytest.mark.parametrize("fixture", sorted(in_process.SERVER_FIXTURES))
def test_a_server_fixture_among_a_tests_fixtures_needs_a_server(fixture: str) -> None:
    assert needs(Item(["tmp_path", fixture]))


def test_a_server_started_in_an_in_process_run_fails_its_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(in_process, "IN_PROCESS", False)
    in_process.refuse_in_an_in_process_run("A Redis server")
    monkeypatch.setattr(in_process, "IN_PROCESS", True)
    with pytest.raises(pytest.fail.Exception, match="A Redis server was started in an in-proc"):
        in_process.refuse_in_an_in_process_run("A Redis server")
