"""The scope of an MCP tool call: by default the authenticated client's id, so two clients
never share a key; ``scope=`` replaces it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.shared.exceptions import MCPError

from idempotency_middleware import MemoryStore
from idempotency_middleware.agents.scopes import fastmcp_client, sdk_client
from idempotency_middleware.mcp import IdempotencyMCPMiddleware, idempotent_tool
from tests.support.mcp_servers import KINDS, Kind, build, connect, runs_of


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


@contextlib.contextmanager
def authenticated(client_id: str) -> Iterator[None]:
    """The request context of a client the server's auth middleware authenticated (its
    access token in the SDK's context variable, as ``AuthContextMiddleware`` leaves it)."""
    token = AccessToken(token=f"token-of-{client_id}", client_id=client_id, scopes=["orders"])
    entered = auth_context_var.set(AuthenticatedUser(token))
    try:
        yield
    finally:
        auth_context_var.reset(entered)


@pytest.mark.parametrize("scope", [sdk_client, fastmcp_client])
def test_the_default_scope_is_the_authenticated_clients_id(scope: Any) -> None:
    with authenticated("alice"):
        assert scope(None) == "alice"


@pytest.mark.parametrize("scope", [sdk_client, fastmcp_client])
def test_an_unauthenticated_call_has_no_scope(scope: Any) -> None:
    assert scope(None) is None


# --- through the door, with each SDK's client in process -----------------------------------


async def test_two_authenticated_clients_with_one_key_both_run_and_each_replays_its_own(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    server = build(kind, MemoryStore(), runs)
    # (The in-process server's tasks start in the client's context: they see its token.)
    for client in ("alice", "bob", "alice"):
        with authenticated(client):
            async with connect(kind, server=server) as call:
                result = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7", "charge 7"]
    assert result["_meta"]["idempotentReplayed"] is True


async def test_a_scope_callable_receives_the_sdks_context_and_keeps_its_scopes_apart(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    seen: list[Any] = []
    tenants = iter(["tenant-a", "tenant-b", "tenant-a"])

    def tenant(context: Any) -> str:
        seen.append(context)
        return next(tenants)

    server = build(kind, MemoryStore(), runs, scope=tenant)
    async with connect(kind, server=server) as call:
        for _ in range(3):
            await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7", "charge 7"]
    assert all(hasattr(context, "request_context") for context in seen)


async def test_a_scope_that_returns_no_string_fails_the_call_and_nothing_runs(
    kind: Kind, tmp_path: Path
) -> None:
    """A server's bug (``TypeError`` naming the scope), not the agent's: each SDK answers it
    as it answers a tool that raised, and the tool never runs on an unscoped key."""
    runs = tmp_path / "runs"
    server = build(kind, MemoryStore(), runs, scope=lambda context: 42)
    answered: dict[str, Any] | None = None
    async with connect(kind, server=server) as call:
        with contextlib.suppress(MCPError):  # (fastmcp's middleware: a protocol error)
            answered = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == []
    assert answered is None or answered["isError"] is True


def test_a_scope_that_is_not_callable_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match="scope must be a callable"):
        idempotent_tool(store=MemoryStore(), scope="alice")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scope must be a callable"):
        IdempotencyMCPMiddleware(store=MemoryStore(), scope="alice")  # type: ignore[arg-type]
