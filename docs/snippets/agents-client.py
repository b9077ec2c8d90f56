import asyncio
import os

from fastmcp import Client

SERVER_URL = os.environ.get("MCP_SERVER_URL", "http://127.0.0.1:8000/mcp")


async def main() -> None:
    async with Client(SERVER_URL) as client:
        meta = {"idempotencyKey": "invoice-acme-2026-11"}  # from the task, not the turn
        arguments = {"customer": "acme", "amount_cents": 1200}
        first = await client.call_tool_mcp("send_invoice", arguments, meta=meta)
        retry = await client.call_tool_mcp("send_invoice", arguments, meta=meta)  # a retry
        assert retry.meta is not None and retry.meta["idempotentReplayed"] is True
        assert retry.structured_content == first.structured_content
        print("replayed:", retry.structured_content)


asyncio.run(main())
