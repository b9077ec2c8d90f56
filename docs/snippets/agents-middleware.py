"""The agents page's fastmcp example: every keyed tool call runs once. Run here with
fastmcp's in-process client (tests/e2e/test_mcp_http.py runs it over Streamable HTTP)."""

import asyncio

# --8<-- [start:show]
from fastmcp import FastMCP

from idempotency_middleware import SQLiteStore
from idempotency_middleware.mcp import IdempotencyMCPMiddleware

store = SQLiteStore("agent-tools.sqlite3")  # RedisStore, PostgresStore... across hosts
server = FastMCP("orders", middleware=[IdempotencyMCPMiddleware(store=store)])


@server.tool()
async def send_invoice(customer: str, amount_cents: int) -> dict[str, str]:
    """Email an invoice (once per idempotency key)."""
    return {"sent_to": customer}


# --8<-- [end:show]


async def check() -> None:
    from fastmcp import Client

    async with Client(server) as client:
        # --8<-- [start:call]
        meta = {"idempotencyKey": "invoice-acme-2026-11"}  # from the task, not the turn
        first = await client.call_tool_mcp(
            "send_invoice", {"customer": "acme", "amount_cents": 1200}, meta=meta
        )
        retry = await client.call_tool_mcp(
            "send_invoice", {"customer": "acme", "amount_cents": 1200}, meta=meta
        )
        assert retry.meta is not None and retry.meta["idempotentReplayed"] is True
        # --8<-- [end:call]
        assert retry.structured_content == first.structured_content


asyncio.run(check())
