"""The MCP door over Streamable HTTP: a real uvicorn server of each SDK, and its real client.

Each test runs on the three ways a server is made idempotent (fastmcp's middleware, the
decorator on fastmcp, the decorator on the official SDK's ``MCPServer``); the runs are
counted in the file the tools append to.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import MemoryStore
from idempotency_middleware.stores.protocol import AsyncStore
from idempotency_middleware.testing import FakeClock
from tests.support.mcp_servers import (
    KINDS,
    Kind,
    build,
    client_header,
    connect,
    http_app,
    runs_of,
    two_calls_at_once,
    until,
)
from tests.support.servers import serve_asgi

Serve = Callable[..., str]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def serve(kind: Kind, runs: Path) -> Iterator[Serve]:
    """Serves a server of ``kind`` built with the options given (its store a
    ``MemoryStore`` unless one is given); its base URL."""
    with contextlib.ExitStack() as stack:

        def start(store: AsyncStore | None = None, **options: Any) -> str:
            server = build(kind, store if store is not None else MemoryStore(), runs, **options)
            return stack.enter_context(serve_asgi(http_app(kind, server), lifespan=True))

        yield start


def order_of(result: dict[str, Any]) -> int:
    """The order a tool result's structured content names (both SDKs give a
    ``dict[str, int]`` result unwrapped, as the undecorated tool's)."""
    return int(result["structuredContent"]["order"])


def text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


async def test_the_same_call_sent_twice_runs_once_and_the_retry_is_replayed(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve()
    async with connect(kind, url) as call:
        first = await call("charge", {"order": 7}, "task-1")
        second = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7"]
    assert first["_meta"].get("idempotentReplayed") is None
    assert second["_meta"]["idempotentReplayed"] is True
    for part in ("content", "structuredContent", "isError"):
        assert second.get(part) == first.get(part), part


async def test_a_sync_tool_runs_once_per_key(kind: Kind, serve: Serve, runs: Path) -> None:
    url = serve()
    async with connect(kind, url) as call:
        for _ in range(2):
            result = await call("sync_charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["sync_charge 7"]
    assert order_of(result) == 7


async def test_two_concurrent_calls_with_one_key_run_once_and_the_other_gets_the_replay(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve()
    results = await two_calls_at_once(kind, url, runs)
    assert runs_of(runs) == ["slow_charge 7"]
    replayed = [result["_meta"].get("idempotentReplayed", False) for result in results]
    assert sorted(replayed) == [False, True]
    assert [order_of(result) for result in results] == [7, 7]


async def test_a_call_whose_connection_dropped_mid_call_is_retried_with_its_key_and_runs_once(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve()

    async def call_and_drop() -> None:
        async with connect(kind, url) as call:
            await call("slow_charge", {"order": 7}, "task-1")

    dropped = asyncio.create_task(call_and_drop())
    await until(lambda: runs_of(runs) == ["slow_charge 7"])
    dropped.cancel()  # the client goes away mid-call, its connection closed
    with contextlib.suppress(asyncio.CancelledError):
        await dropped
    runs.with_suffix(".gate").touch()
    async with connect(kind, url) as call:
        retried = await call("slow_charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["slow_charge 7"]
    assert retried["_meta"]["idempotentReplayed"] is True
    assert order_of(retried) == 7


async def test_a_key_reused_with_other_arguments_is_a_tool_error_naming_the_reuse(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve()
    async with connect(kind, url) as call:
        await call("charge", {"order": 7}, "task-1")
        reused = await call("charge", {"order": 8}, "task-1")
    assert runs_of(runs) == ["charge 7"]
    assert reused["isError"] is True
    assert "already used with other arguments" in text(reused)


async def test_two_clients_with_one_key_under_a_scope_both_run(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve(scope=client_header)
    async with connect(kind, url, client="alice") as alice, connect(kind, url, client="bob") as bob:
        for call in (alice, bob, alice):
            await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7", "charge 7"]


async def test_a_tool_that_raises_is_not_stored_and_a_retry_runs_again(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve()
    async with connect(kind, url) as call:
        first = await call("failing", {"order": 7}, "task-1")
        second = await call("failing", {"order": 7}, "task-1")
    assert runs_of(runs) == ["failing 7", "failing 7"]
    assert first["isError"] is True
    assert second["isError"] is True
    assert "idempotentReplayed" not in second.get("_meta", {})


async def test_a_key_argument_the_tool_declares_is_the_key_and_not_part_of_the_fingerprint(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve()
    async with connect(kind, url) as call:
        await call("keyed", {"order": 7, "idempotency_key": "task-1"}, None)
        again = await call("keyed", {"order": 7, "idempotency_key": "task-1"}, None)
    assert runs_of(runs) == ["keyed 7"]
    assert again["_meta"]["idempotentReplayed"] is True


async def test_a_call_without_a_key_runs_unprotected(kind: Kind, serve: Serve, runs: Path) -> None:
    url = serve()
    async with connect(kind, url) as call:
        for _ in range(2):
            await call("charge", {"order": 7}, None)
    assert runs_of(runs) == ["charge 7", "charge 7"]


async def test_required_true_answers_a_call_without_a_key_with_a_tool_error_saying_how(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve(required=True)
    async with connect(kind, url) as call:
        refused = await call("charge", {"order": 7}, None)
    assert runs_of(runs) == []
    assert refused["isError"] is True
    assert "idempotencyKey" in text(refused)


async def test_a_duplicate_that_waited_past_wait_seconds_gets_a_tool_error_with_retry_after(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    url = serve(wait_seconds=0)
    async with connect(kind, url) as first, connect(kind, url) as second:
        running = asyncio.create_task(first("slow_charge", {"order": 7}, "task-1"))
        await until(lambda: runs_of(runs) == ["slow_charge 7"])
        duplicate = await second("slow_charge", {"order": 7}, "task-1")
        runs.with_suffix(".gate").touch()
        await running
    assert duplicate["isError"] is True
    assert "still running" in text(duplicate)
    assert duplicate["_meta"]["retryAfter"] >= 1


class RenewalCountingStore(MemoryStore):
    """A ``MemoryStore`` counting the lease renewals it granted."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed = 0

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        renewed = super().renew(key_hash, owner, lock_expires_at)
        self.renewed += renewed
        return renewed


async def test_a_long_tools_lease_is_renewed_so_a_retry_past_the_first_lease_does_not_run_it(
    kind: Kind, serve: Serve, runs: Path
) -> None:
    clock = FakeClock()
    store = RenewalCountingStore()
    # Renewed every 0.1 s of the clock; the duplicate answered at once (no waiting on a
    # clock that would move the lease with it).
    url = serve(store=store, clock=clock, lock_timeout_seconds=0.3, wait_seconds=0)
    async with connect(kind, url) as first, connect(kind, url) as second:
        running = asyncio.create_task(first("slow_charge", {"order": 7}, "task-1"))
        await until(lambda: runs_of(runs) == ["slow_charge 7"])
        clock.advance(0.2)  # a renewal is due; the first lease (0.3) still holds
        await until(lambda: store.renewed >= 1)
        clock.advance(0.2)  # past the first lease, inside the renewed one
        duplicate = await second("slow_charge", {"order": 7}, "task-1")
        runs.with_suffix(".gate").touch()
        completed = await running
        retried = await second("slow_charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["slow_charge 7"]
    assert duplicate["isError"] is True
    assert "still running" in text(duplicate)
    assert completed.get("isError") is not True
    assert retried["_meta"]["idempotentReplayed"] is True
