"""The decorator's conversion of a tool's return value under the official SDK: the
registered tool's own (read from the SDK's private tool manager), else the function's own,
which must give the same result, so a release that reshapes the private part cannot break
the door silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

from idempotency_middleware import MemoryStore
from idempotency_middleware.agents import decorator
from idempotency_middleware.mcp import idempotent_tool
from tests.support.mcp_servers import connect


class Receipt(BaseModel):
    order: int
    status: str


def server_of(store: MemoryStore) -> MCPServer:
    """An official SDK server whose tools return each kind of value the SDK converts."""
    server = MCPServer("orders")

    @server.tool()
    @idempotent_tool(store=store)
    async def charge(order: int) -> dict[str, int]:
        return {"order": order}

    @server.tool()
    @idempotent_tool(store=store)
    def receipt(order: int) -> Receipt:
        return Receipt(order=order, status="paid")

    @server.tool()
    @idempotent_tool(store=store)
    async def note(order: int) -> str:
        return f"order {order} paid"

    return server


async def results_of(server: MCPServer) -> list[dict[str, Any]]:
    """Each tool called once, then again (the replay), in wire form."""
    answers = []
    async with connect("mcp-decorator", server=server) as call:
        for tool in ("charge", "receipt", "note"):
            for _ in range(2):
                answers.append(await call(tool, {"order": 7}, f"{tool}-1"))
    return answers


def test_the_installed_sdk_gives_the_registered_tool_so_its_own_conversion_is_used() -> None:
    """A canary: fails when a release moves the SDK's private tool lookup (the fallback then
    serves, and ``structured_output=False`` of ``@server.tool()`` is no longer honoured)."""
    server = server_of(MemoryStore())
    registered = decorator.registered_tool(server, "charge")
    assert callable(getattr(getattr(registered, "fn_metadata", None), "convert_result", None))


@pytest.mark.parametrize("server", [object(), MCPServer("orders")])
def test_no_registered_tool_is_found_where_the_sdk_has_none(server: object) -> None:
    assert decorator.registered_tool(server, "charge") is None


async def test_without_the_sdks_private_tool_lookup_a_tool_answers_the_same_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    registered = await results_of(server_of(MemoryStore()))
    # A release that renamed its tool manager: the lookup finds nothing.
    monkeypatch.setattr(decorator, "registered_tool", lambda server, name: None)
    fallback = await results_of(server_of(MemoryStore()))
    assert fallback == registered
    assert fallback[1]["structuredContent"] == {"order": 7}
    assert fallback[3]["structuredContent"] == {"order": 7, "status": "paid"}
    assert [answer["_meta"].get("idempotentReplayed") for answer in fallback] == [
        None,
        True,
    ] * 3


async def test_structured_output_false_is_honoured_through_the_registered_tool() -> None:
    server = MCPServer("orders")

    @server.tool(structured_output=False)
    @idempotent_tool(store=MemoryStore())
    async def charge(order: int) -> dict[str, int]:
        return {"order": order}

    async with connect("mcp-decorator", server=server) as call:
        result = await call("charge", {"order": 7}, "task-1")
    assert "structuredContent" not in result


async def plain_charge(order: int) -> dict[str, int]:
    return {"order": order}


async def test_a_decorated_tool_announces_the_schemas_of_the_undecorated_function() -> None:
    """Its input and output schemas both: the annotations, strings under ``from __future__
    import annotations`` as in this module, are evaluated for the SDK."""
    plain, decorated = MCPServer("plain"), MCPServer("decorated")
    plain.tool(name="charge")(plain_charge)
    decorated.tool(name="charge")(idempotent_tool(store=MemoryStore())(plain_charge))
    [plain_tool] = await plain.list_tools()
    [decorated_tool] = await decorated.list_tools()
    assert decorated_tool.input_schema == plain_tool.input_schema
    assert decorated_tool.output_schema == plain_tool.output_schema
