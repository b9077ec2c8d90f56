"""The agents page's official-SDK example: one tool made idempotent with the decorator,
announced idempotent with the SDK's annotations. Run here with the SDK's in-process client."""

import asyncio

# --8<-- [start:show]
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from idempotency_middleware import SQLiteStore
from idempotency_middleware.mcp import idempotent_tool

store = SQLiteStore("agent-tools.sqlite3")
server = MCPServer("orders")


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
@idempotent_tool(store=store)  # under @server.tool(): the SDK registers the idempotent tool
def book_table(restaurant: str, seats: int) -> dict[str, str | int]:
    """Book a table (a sync tool runs in a worker thread)."""
    return {"restaurant": restaurant, "seats": seats}


# --8<-- [end:show]


async def check() -> None:
    from mcp import Client

    async with Client(server) as client:
        meta = {"idempotencyKey": "book-luigi-friday"}
        arguments = {"restaurant": "luigi", "seats": 4}
        await client.call_tool("book_table", arguments, meta=meta)  # type: ignore[arg-type]
        retry = await client.call_tool("book_table", arguments, meta=meta)  # type: ignore[arg-type]
        assert (retry.meta or {})["idempotentReplayed"] is True


asyncio.run(check())
