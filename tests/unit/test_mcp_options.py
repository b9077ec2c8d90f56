"""The MCP door's own readings of the shared options: ``on_store_error="allow"`` (this
door's word for ``"run"``), its defaults, and its own options refused when wrong."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import DynamoDBStore, IdempotencyEvent, MemoryStore
from idempotency_middleware.mcp import IdempotencyMCPMiddleware, idempotent_tool
from idempotency_middleware.stores.protocol import ClaimRequest, StoreUnavailable
from idempotency_middleware.testing import FakeClock
from tests.support.mcp_servers import KINDS, Kind, build, connect, runs_of

DOORS: list[Any] = [idempotent_tool, IdempotencyMCPMiddleware]


class DownStore(MemoryStore):
    """A store whose claims fail as an unreachable store's do."""

    def claim(self, request: ClaimRequest) -> Any:
        raise StoreUnavailable("the store is down", cause="unreachable")


@pytest.mark.parametrize("kind", KINDS)
async def test_on_store_error_allow_runs_the_tool_unprotected_while_the_store_is_down(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    events: list[IdempotencyEvent] = []
    server = build(kind, DownStore(), runs, on_store_error="allow", on_event=events.append)
    async with connect(kind, server=server) as call:
        for _ in range(2):
            result = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7", "charge 7"]  # unprotected: each call runs
    assert result.get("isError") is not True
    assert [event.kind for event in events].count("fail_open") == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_on_store_error_fail_is_the_default_and_runs_nothing_while_the_store_is_down(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    server = build(kind, DownStore(), runs)
    async with connect(kind, server=server) as call:
        refused = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == []
    assert refused["isError"] is True


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("value", ["allow", "run", "fail"])
def test_on_store_error_takes_allow_run_and_fail(door: Any, value: str) -> None:
    door(store=MemoryStore(), on_store_error=value)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("value", ["retry", "", None, ["allow"]])
def test_another_on_store_error_is_refused_listing_the_values_allow_included(
    door: Any, value: object
) -> None:
    with pytest.raises(ValueError, match=r"on_store_error must be 'fail', 'run' or 'allow'"):
        door(store=MemoryStore(), on_store_error=value)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("value", ["", 7, None])
def test_a_key_argument_that_is_no_name_is_refused(door: Any, value: object) -> None:
    with pytest.raises(TypeError, match="key_argument must be a non-empty string"):
        door(store=MemoryStore(), key_argument=value)


@pytest.mark.parametrize("door", DOORS)
def test_a_sync_only_store_is_refused_naming_the_door(door: Any) -> None:
    store = DynamoDBStore("keys", region_name="eu-west-1")
    with pytest.raises(TypeError, match=r"tool calls \(always awaited by the MCP server\)"):
        door(store=store)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_duplicate_waits_ten_seconds_by_default(kind: Kind, tmp_path: Path) -> None:
    """(The default is read back from the attempt a duplicate makes: its wait deadline.)"""
    runs = tmp_path / "runs"
    clock = FakeClock()
    server = build(kind, MemoryStore(), runs, clock=clock)
    async with connect(kind, server=server) as first, connect(kind, server=server) as second:
        running = asyncio.ensure_future(first("slow_charge", {"order": 7}, "task-1"))
        while runs_of(runs) != ["slow_charge 7"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        duplicate = await second("slow_charge", {"order": 7}, "task-1")
        runs.with_suffix(".gate").touch()
        await running
    assert "still running" in duplicate["content"][0]["text"]
    assert 9 <= sum(clock.slept) < 10 + 1e-6


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_calls_events_name_the_mcp_door_and_the_tool_as_its_route(
    kind: Kind, tmp_path: Path
) -> None:
    events: list[IdempotencyEvent] = []
    server = build(kind, MemoryStore(), tmp_path / "runs", on_event=events.append)
    async with connect(kind, server=server) as call:
        for _ in range(2):
            await call("charge", {"order": 7}, "task-1")
    attempts = [event for event in events if event.kind in {"claimed", "completed", "replayed"}]
    assert [event.kind for event in attempts] == ["claimed", "completed", "replayed"]
    assert {(event.door, event.route_label) for event in attempts} == {("mcp", "charge")}
