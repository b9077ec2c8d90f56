"""CPU per MCP tool call: a replayed idempotent call against a plain (unwrapped) call.

Both SDKs, in-process (each SDK's in-memory client and server, so the figures are the
server's and client's CPU, no network). Rounds interleave the plain and the replayed call
in the same run; medians of CPU time per call (``time.process_time``).

    PYTHONPATH=. python benchmarks/mcp_replay.py
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

from idempotency_middleware import MemoryStore
from idempotency_middleware.mcp import IdempotencyMCPMiddleware, idempotent_tool

ROUNDS = 15
CALLS = 100
META = {"idempotencyKey": "bench-1"}


async def per_call(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.process_time()
    for _ in range(CALLS):
        await call()
    return (time.process_time() - started) / CALLS


async def compare(
    name: str, plain: Callable[[], Awaitable[Any]], replay: Callable[[], Awaitable[Any]]
) -> None:
    await replay()  # the first run: every later call is a replay
    plains, replays = [], []
    for _ in range(ROUNDS):
        plains.append(await per_call(plain))
        replays.append(await per_call(replay))
    p, r = statistics.median(plains) * 1e6, statistics.median(replays) * 1e6
    print(
        f"{name}: plain {p:.0f} us/call, replayed {r:.0f} us/call ({r - p:+.0f} us, x{r / p:.2f})"
    )


async def official_sdk() -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    async def plain(order: int) -> dict[str, int]:
        return {"order": order}

    @server.tool()
    @idempotent_tool(store=MemoryStore())
    async def keyed(order: int) -> dict[str, int]:
        return {"order": order}

    async with Client(server) as client:
        await compare(
            f"mcp {metadata.version('mcp')} idempotent_tool",
            lambda: client.call_tool("plain", {"order": 7}),
            lambda: client.call_tool("keyed", {"order": 7}, meta=META),  # type: ignore[arg-type]
        )


async def fastmcp_middleware() -> None:
    from fastmcp import Client, FastMCP

    plain_server = FastMCP("plain")
    covered = FastMCP("covered", middleware=[IdempotencyMCPMiddleware(store=MemoryStore())])
    for server in (plain_server, covered):

        @server.tool()
        async def charge(order: int) -> dict[str, int]:
            return {"order": order}

    async with Client(plain_server) as plain, Client(covered) as replay:
        await compare(
            f"fastmcp {metadata.version('fastmcp')} IdempotencyMCPMiddleware",
            lambda: plain.call_tool_mcp("charge", {"order": 7}),
            lambda: replay.call_tool_mcp("charge", {"order": 7}, meta=META),
        )


if __name__ == "__main__":
    asyncio.run(official_sdk())
    asyncio.run(fastmcp_middleware())
