"""The fingerprint of an MCP tool call: its tool and its arguments as canonical JSON, the
key argument left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from idempotency_middleware import MemoryStore
from idempotency_middleware.agents.keys import tool_fingerprint
from tests.support.mcp_servers import KINDS, Kind, build, connect, runs_of

KEY = "idempotency_key"


def test_the_order_of_the_arguments_does_not_change_the_fingerprint() -> None:
    one = tool_fingerprint("charge", {"order": 7, "amount": 5}, KEY)
    other = tool_fingerprint("charge", {"amount": 5, "order": 7}, KEY)
    assert one == other


def test_the_order_of_a_nested_objects_members_does_not_change_the_fingerprint() -> None:
    one = tool_fingerprint("charge", {"card": {"last4": "4242", "brand": "visa"}}, KEY)
    other = tool_fingerprint("charge", {"card": {"brand": "visa", "last4": "4242"}}, KEY)
    assert one == other


def test_the_key_argument_is_left_out_of_the_fingerprint() -> None:
    keyed = tool_fingerprint("charge", {"order": 7, KEY: "task-1"}, KEY)
    assert keyed == tool_fingerprint("charge", {"order": 7}, KEY)


def test_another_argument_value_is_another_fingerprint() -> None:
    assert tool_fingerprint("charge", {"order": 7}, KEY) != tool_fingerprint(
        "charge", {"order": 8}, KEY
    )


def test_another_tool_with_the_same_arguments_is_another_fingerprint() -> None:
    assert tool_fingerprint("charge", {"order": 7}, KEY) != tool_fingerprint(
        "refund", {"order": 7}, KEY
    )


def test_a_list_argument_keeps_its_order() -> None:
    assert tool_fingerprint("ship", {"items": [1, 2]}, KEY) != tool_fingerprint(
        "ship", {"items": [2, 1]}, KEY
    )


def test_a_null_argument_differs_from_an_absent_one() -> None:
    assert tool_fingerprint("charge", {"order": 7, "note": None}, KEY) != tool_fingerprint(
        "charge", {"order": 7}, KEY
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
def test_an_argument_without_a_json_form_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        tool_fingerprint("charge", {"amount": value}, KEY)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_same_arguments_sent_in_another_order_replay_the_first_call(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    server = build(kind, MemoryStore(), runs)
    async with connect(kind, server=server) as call:
        await call("keyed", {"order": 7, "idempotency_key": "task-1"}, None)
        again = await call("keyed", {"idempotency_key": "task-1", "order": 7}, None)
    assert runs_of(runs) == ["keyed 7"]
    assert again["_meta"]["idempotentReplayed"] is True
