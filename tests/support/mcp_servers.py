"""MCP servers and clients of both SDKs for the MCP door's tests.

``build(kind, store, runs)`` makes a server with the same tools three ways: fastmcp with
``IdempotencyMCPMiddleware``, fastmcp with ``idempotent_tool``, and the official SDK's
``MCPServer`` with ``idempotent_tool``. Each tool's run appends a line to the ``runs`` file
(the tests count runs there, whichever process the server is in). ``slow_charge`` waits
until its gate file exists. Run as a module, it serves one over stdio.

``connect(kind, target, client=...)`` opens that SDK's client on a URL (Streamable HTTP,
``client`` sent as the ``X-Client`` header), on a stdio command, or on a server object in
this process (the SDK's in-memory transport); ``call`` sends one ``tools/call`` and gives
the result in wire form.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, Protocol

from idempotency_middleware import SQLiteStore
from idempotency_middleware.mcp import IdempotencyMCPMiddleware, idempotent_tool
from idempotency_middleware.stores.protocol import AsyncStore

Kind = Literal["fastmcp-middleware", "fastmcp-decorator", "mcp-decorator"]
KINDS: list[Kind] = ["fastmcp-middleware", "fastmcp-decorator", "mcp-decorator"]


class Call(Protocol):
    """One ``tools/call`` of ``tool``: ``key`` in the request's ``_meta``
    (``idempotencyKey``) beside ``meta``; the result in wire form."""

    def __call__(
        self,
        tool: str,
        arguments: dict[str, Any],
        key: str | None,
        *,
        meta: dict[str, Any] | None = None,
    ) -> Coroutine[Any, Any, dict[str, Any]]: ...


def request_meta(key: str | None, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """A request's ``_meta``: ``meta`` and the key, ``None`` when both are empty."""
    sent = {**(meta or {}), **({"idempotencyKey": key} if key else {})}
    return sent or None


def client_header(context: Any) -> str | None:
    """A test scope: the ``X-Client`` header of the HTTP request (either SDK's context)."""
    request = context.request_context.request
    return None if request is None else request.headers.get("x-client")


def build(kind: Kind, store: AsyncStore, runs: Path, **options: Any) -> Any:
    """A server of ``kind`` with the test tools, their calls idempotent over ``store``."""
    gate = runs.with_suffix(".gate")

    def ran(line: str) -> None:
        with runs.open("a") as file:
            file.write(line + "\n")

    async def charge(order: int) -> dict[str, int]:
        ran(f"charge {order}")
        return {"order": order}

    def sync_charge(order: int) -> dict[str, int]:
        ran(f"sync_charge {order}")
        return {"order": order}

    async def slow_charge(order: int) -> dict[str, int]:
        ran(f"slow_charge {order}")
        # A file, not an event: the test may be in another process (stdio).
        while not gate.exists():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return {"order": order}

    async def failing(order: int) -> dict[str, int]:
        ran(f"failing {order}")
        raise RuntimeError("the payment provider is down")

    async def keyed(order: int, idempotency_key: str | None = None) -> dict[str, int]:
        ran(f"keyed {order}")
        return {"order": order}

    tools = [charge, sync_charge, slow_charge, failing, keyed]
    if kind == "mcp-decorator":
        from mcp.server.mcpserver import MCPServer

        sdk = MCPServer("orders")
        for tool in tools:
            sdk.tool()(idempotent_tool(store=store, **options)(tool))
        return sdk
    from fastmcp import FastMCP

    if kind == "fastmcp-middleware":
        server = FastMCP("orders", middleware=[IdempotencyMCPMiddleware(store=store, **options)])
        for tool in tools:
            server.tool()(tool)
        return server
    server = FastMCP("orders")
    for tool in tools:
        server.tool()(idempotent_tool(store=store, **options)(tool))
    return server


def http_app(kind: Kind, server: Any) -> Any:
    """The server's Streamable HTTP ASGI app (at ``/mcp``)."""
    if kind == "mcp-decorator":
        return server.streamable_http_app()
    return server.http_app()


def stdio_command(kind: Kind, store_path: Path, runs: Path) -> tuple[str, list[str]]:
    """The command serving a ``kind`` server over stdio, its store an SQLite file."""
    return sys.executable, ["-m", "tests.support.mcp_servers", kind, str(store_path), str(runs)]


@contextlib.asynccontextmanager
async def connect(
    kind: Kind,
    url: str | None = None,
    command: tuple[str, list[str]] | None = None,
    client: str | None = None,
    server: Any = None,
) -> AsyncIterator[Call]:
    """A connected client of ``kind``'s SDK, on ``url``, ``command`` or ``server``."""
    headers = {"x-client": client} if client else {}
    if kind == "mcp-decorator":
        import httpx2
        from mcp import Client as SDKClient
        from mcp.client.stdio import StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client

        target: Any = server
        if url is not None:
            http = httpx2.AsyncClient(headers=headers, timeout=60)
            target = streamable_http_client(f"{url}/mcp", http_client=http)
        elif command is not None:
            target = StdioServerParameters(command=command[0], args=command[1], cwd=Path.cwd())
        async with SDKClient(target) as sdk_client:

            async def sdk_call(
                tool: str,
                arguments: dict[str, Any],
                key: str | None,
                *,
                meta: dict[str, Any] | None = None,
            ) -> Any:
                sent: Any = request_meta(key, meta)
                result = await sdk_client.call_tool(tool, arguments, meta=sent)
                return result.model_dump(by_alias=True, exclude_none=True, mode="json")

            yield sdk_call
        return
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

    transport: Any = server
    if url is not None:
        transport = StreamableHttpTransport(f"{url}/mcp", headers=headers)
    elif command is not None:
        transport = StdioTransport(command[0], command[1], cwd=str(Path.cwd()))
    async with Client(transport) as fastmcp_client:

        async def call(
            tool: str,
            arguments: dict[str, Any],
            key: str | None,
            *,
            meta: dict[str, Any] | None = None,
        ) -> Any:
            sent = request_meta(key, meta)
            result = await fastmcp_client.call_tool_mcp(tool, arguments, meta=sent)
            return result.model_dump(by_alias=True, exclude_none=True, mode="json")

        yield call


def runs_of(runs: Path) -> list[str]:
    """The tools' runs so far."""
    return runs.read_text().splitlines() if runs.exists() else []


async def until(condition: Callable[[], bool]) -> None:
    """Waits for ``condition`` (the tools write their runs from another thread)."""
    deadline = asyncio.get_running_loop().time() + 60
    # (Polled: the runs file is written from the server's thread, no event to await.)
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


async def two_calls_at_once(kind: Kind, url: str, runs: Path) -> list[dict[str, Any]]:
    """``slow_charge`` with one key from two sessions at once, the tool held (its gate
    file) until its first run began; both results."""
    async with connect(kind, url) as first, connect(kind, url) as second:
        calls = [
            asyncio.create_task(call("slow_charge", {"order": 7}, "task-1"))
            for call in (first, second)
        ]
        await until(lambda: runs_of(runs) == ["slow_charge 7"])
        runs.with_suffix(".gate").touch()
        return list(await asyncio.gather(*calls))


def main() -> None:
    kind, store_path, runs = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    server = build(kind, SQLiteStore(store_path), runs)  # type: ignore[arg-type]
    server.run()  # stdio, either SDK


if __name__ == "__main__":
    main()
