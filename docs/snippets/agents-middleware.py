"""The agents page's fastmcp example: every keyed tool call runs once. Run here with
fastmcp's in-process client; tests/e2e/test_agents_page.py serves it over Streamable HTTP to
the page's client, docs/snippets/agents-client.py."""

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

    async with Client(server) as client:  # in process
        meta = {"idempotencyKey": "invoice-acme-2026-11"}
        arguments = {"customer": "acme", "amount_cents": 1200}
        first = await client.call_tool_mcp("send_invoice", arguments, meta=meta)
        retry = await client.call_tool_mcp("send_invoice", arguments, meta=meta)
        assert retry.meta is not None and retry.meta["idempotentReplayed"] is True
        assert retry.structured_content == first.structured_content


asyncio.run(check())
