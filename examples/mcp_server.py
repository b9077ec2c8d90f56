"""An MCP server whose ``create_order`` tool runs once per idempotency key (stdio).

Run it from an MCP client: ``python examples/mcp_server.py`` as the server command. A
client sends the key in the request's ``_meta`` (``{"idempotencyKey": "..."}``); a retry
with the same key gets the first call's result, marked ``_meta["idempotentReplayed"]``.
The keys live in an SQLite file (``ORDERS_IDEMPOTENCY_DB``, default ``orders-keys.db``), so
a restarted server still knows them.
"""

from __future__ import annotations

import os
import uuid

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from idempotency_middleware import SQLiteStore
from idempotency_middleware.mcp import idempotent_tool

store = SQLiteStore(os.environ.get("ORDERS_IDEMPOTENCY_DB", "orders-keys.db"))
server = MCPServer("orders")


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
@idempotent_tool(store=store)
async def create_order(item: str, quantity: int) -> dict[str, str | int]:
    """Place an order; the same key never places it twice."""
    return {"order_id": uuid.uuid4().hex, "item": item, "quantity": quantity}


if __name__ == "__main__":
    server.run()  # stdio
