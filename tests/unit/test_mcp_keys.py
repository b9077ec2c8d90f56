"""The MCP door's keys: read from ``_meta`` or the declared key argument, never from a
per-call id; refused when sent wrongly; asked for, saying how, when required."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import InvalidKeyError, MemoryStore
from idempotency_middleware.agents.keys import call_key, tool_key_hash
from idempotency_middleware.functions.attempts import function_key_hash
from tests.support.mcp_servers import KINDS, Kind, build, connect, runs_of


def test_the_key_is_read_from_meta_idempotency_key() -> None:
    assert call_key("charge", {"idempotencyKey": "task-1"}, {}, "idempotency_key") == "task-1"


def test_the_key_is_read_from_meta_idempotency_dash_key_as_commerce_protocols_spell_it() -> None:
    assert call_key("charge", {"idempotency-key": "task-1"}, {}, "idempotency_key") == "task-1"


def test_meta_idempotency_key_is_read_before_its_dashed_spelling() -> None:
    meta = {"idempotency-key": "dashed", "idempotencyKey": "camel"}
    assert call_key("charge", meta, {}, "idempotency_key") == "camel"


def test_a_key_in_meta_is_read_before_the_key_argument() -> None:
    meta = {"idempotencyKey": "from-meta"}
    arguments = {"idempotency_key": "from-argument"}
    assert call_key("charge", meta, arguments, "idempotency_key") == "from-meta"


def test_without_one_in_meta_the_key_is_the_declared_key_argument() -> None:
    arguments = {"order": 7, "request_key": "task-1"}
    assert call_key("charge", None, arguments, "request_key") == "task-1"


@pytest.mark.parametrize("left_at_default", [None, ""])
def test_a_key_argument_left_at_its_default_sends_no_key(left_at_default: object) -> None:
    arguments = {"order": 7, "idempotency_key": left_at_default}
    assert call_key("charge", None, arguments, "idempotency_key") is None


@pytest.mark.parametrize(
    "per_call",
    [
        {"progressToken": "p-81"},  # the client's progress token, new on every request
        {"id": 81},  # a JSON-RPC request id
        {"toolCallId": "call_Xb2"},  # a model's per-turn tool-call id
        {"requestId": "r-81"},
    ],
)
def test_a_per_call_id_is_never_a_key(per_call: dict[str, Any]) -> None:
    assert call_key("charge", per_call, {"order": 7}, "idempotency_key") is None


@pytest.mark.parametrize("sent", [7, "", None, ["task-1"]])
def test_a_key_in_meta_that_is_not_a_non_empty_string_is_refused_naming_where(
    sent: object,
) -> None:
    with pytest.raises(InvalidKeyError, match=r"tool charge: .*_meta\['idempotencyKey'\]"):
        call_key("charge", {"idempotencyKey": sent}, {}, "idempotency_key")


def test_a_key_argument_that_is_not_a_string_is_refused_naming_the_argument() -> None:
    with pytest.raises(InvalidKeyError, match="argument 'idempotency_key'"):
        call_key("charge", None, {"idempotency_key": 7}, "idempotency_key")


def test_a_tools_keys_are_apart_from_a_functions_of_the_same_name() -> None:
    assert tool_key_hash("charge", None, "k-1") != function_key_hash("charge", "k-1")


def test_a_tools_keys_are_apart_from_another_tools_and_another_scopes() -> None:
    hashes = {
        tool_key_hash("charge", None, "k-1"),
        tool_key_hash("refund", None, "k-1"),
        tool_key_hash("charge", "alice", "k-1"),
        tool_key_hash("charge", "bob", "k-1"),
    }
    assert len(hashes) == 4


# --- through the door, with each SDK's client in process -----------------------------------


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


async def test_calls_carrying_only_per_call_ids_each_run(kind: Kind, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    server = build(kind, MemoryStore(), runs)
    async with connect(kind, server=server) as call:
        for turn in ("call_1", "call_2"):
            await call("charge", {"order": 7}, None, meta={"toolCallId": turn})
    assert runs_of(runs) == ["charge 7", "charge 7"]


async def test_required_answers_a_call_without_a_key_with_a_tool_error_saying_how_to_send_one(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    server = build(kind, MemoryStore(), runs, required=True, key_argument="request_key")
    async with connect(kind, server=server) as call:
        refused = await call("charge", {"order": 7}, None)
    assert runs_of(runs) == []
    assert refused["isError"] is True
    text = refused["content"][0]["text"]
    assert "tool charge: this tool needs an idempotency key and was not run" in text
    assert '{"idempotencyKey": "..."}' in text
    assert "'request_key' argument" in text
    assert "derive it from the task" in text


async def test_a_key_sent_wrongly_is_a_tool_error_and_the_tool_does_not_run(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    server = build(kind, MemoryStore(), runs)
    async with connect(kind, server=server) as call:
        refused = await call("charge", {"order": 7}, None, meta={"idempotencyKey": 7})
    assert runs_of(runs) == []
    assert refused["isError"] is True
    assert "must be a non-empty string" in refused["content"][0]["text"]
