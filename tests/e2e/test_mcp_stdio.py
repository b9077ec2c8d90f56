"""The MCP door over stdio: a server subprocess of each SDK (its store an SQLite file), and
the SDK's real client; and the example server an MCP client runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.support.mcp_servers import KINDS, Kind, connect, runs_of, stdio_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_same_call_sent_twice_over_stdio_runs_once_and_is_replayed(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    command = stdio_command(kind, tmp_path / "keys.db", runs)
    async with connect(kind, command=command) as call:
        first = await call("charge", {"order": 7}, "task-1")
        second = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7"]
    assert second["_meta"]["idempotentReplayed"] is True
    assert second["content"] == first["content"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_that_raises_over_stdio_runs_again_on_retry(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    command = stdio_command(kind, tmp_path / "keys.db", runs)
    async with connect(kind, command=command) as call:
        for _ in range(2):
            assert (await call("failing", {"order": 7}, "task-1"))["isError"] is True
    assert runs_of(runs) == ["failing 7", "failing 7"]


async def test_the_example_server_replays_a_retried_order_even_after_a_restart(
    tmp_path: Path,
) -> None:
    # The command the agents page gives (docs/snippets/run/mcp_server.sh), in this venv.
    python, script = (ROOT / "docs/snippets/run/mcp_server.sh").read_text().splitlines()[-1].split()
    assert python == ".venv/bin/python", python
    server = StdioServerParameters(
        command=sys.executable,
        args=[str(ROOT / script)],
        env={"ORDERS_IDEMPOTENCY_DB": str(tmp_path / "keys.db"), "PYTHONPATH": str(ROOT)},
    )
    arguments = {"item": "tea", "quantity": 2}
    meta = {"idempotencyKey": "order-tea-for-task-42"}
    async with Client(server) as client:
        first = await client.call_tool("create_order", arguments, meta=meta)  # type: ignore[arg-type]
    async with Client(server) as client:  # a new server process, the same keys file
        retried = await client.call_tool("create_order", arguments, meta=meta)  # type: ignore[arg-type]
        listed = await client.list_tools()
    assert retried.structured_content == first.structured_content
    assert (retried.meta or {})["idempotentReplayed"] is True
    assert listed.tools[0].annotations is not None
    assert listed.tools[0].annotations.idempotent_hint is True
