"""``IdempotencyMCPMiddleware``: a fastmcp server middleware running every keyed tool call once.

A translation only: the call's tool, arguments and the caller's ``_meta`` (on the request
context: fastmcp rebuilds the middleware context's own) go to ``ToolCalls``, the tool runs
as the rest of the chain, and a replay or a refusal comes back as fastmcp's ``ToolResult``.
Every tool it covers is announced with ``idempotentHint: true`` in ``tools/list``.

Importing this module does not import fastmcp (an official-SDK-only install uses
``idempotent_tool``); building the middleware does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..stores.protocol import AsyncStore, SyncStore
from .calls import ToolCalls, tool_options
from .keys import DEFAULT_KEY_ARGUMENT
from .results import WireResult
from .scopes import Scope, fastmcp_client

if TYPE_CHECKING:
    from fastmcp.server.context import Context
    from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
    from fastmcp.tools.base import Tool, ToolResult
    from mcp_types import CallToolRequestParams, ListToolsRequest
    from typing_extensions import Unpack

    from ..functions.options import CallableKeywords
else:
    try:
        from fastmcp.server.middleware import Middleware
    except ModuleNotFoundError:  # fastmcp needs Python 3.11; the decorator does not
        Middleware = object

_OWN = ("key_argument", "scope")


class IdempotencyMCPMiddleware(Middleware):
    """Run every ``tools/call`` that carries an idempotency key once per key; a retry gets
    the first call's result, marked ``_meta["idempotentReplayed"]``.

    ``FastMCP(..., middleware=[IdempotencyMCPMiddleware(store=...)])``. The key is the
    request's ``_meta["idempotencyKey"]`` (or ``"idempotency-key"``), else the tool's
    ``key_argument`` argument. ``scope(context)`` (the fastmcp ``Context``) keeps clients
    apart; default: the authenticated client's id. Every shared option of ``idempotent``
    applies, with ``required=False`` (a call without a key runs unprotected) and
    ``wait_seconds=10`` as this door's defaults. Needs an async store.
    """

    def __init__(
        self,
        *,
        store: SyncStore | AsyncStore,
        key_argument: str = DEFAULT_KEY_ARGUMENT,
        scope: Scope | None = None,
        **options: Unpack[CallableKeywords],
    ) -> None:
        if Middleware is object:
            raise ModuleNotFoundError(
                "IdempotencyMCPMiddleware needs fastmcp, which is not installed: "
                'pip install "fastmcp>=4" (or use idempotent_tool with the mcp SDK)',
                name="fastmcp",
            )
        if not (isinstance(key_argument, str) and key_argument):
            raise TypeError(f"key_argument must be a non-empty string, got {key_argument!r}")
        if scope is not None and not callable(scope):
            raise TypeError(f"scope must be a callable taking the request context, got {scope!r}")
        built = tool_options("IdempotencyMCPMiddleware", store, _OWN, options)
        self._calls: ToolCalls[ToolResult] = ToolCalls(built, key_argument)
        self._scope: Scope = scope or fastmcp_client

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        from fastmcp.tools.base import ToolResult

        params = context.message
        fastmcp_context = context.fastmcp_context
        request = fastmcp_context.request_context if fastmcp_context is not None else None

        async def run() -> tuple[WireResult, ToolResult]:
            made = await call_next(context)
            return wire_result(made), made

        answer = await self._calls.call(
            params.name,
            request.meta if request is not None else None,
            params.arguments or {},
            _scope_of(self._scope, fastmcp_context),
            run,
        )
        if isinstance(answer, ToolResult):
            return answer
        return tool_result(answer)

    async def on_list_tools(
        self,
        context: MiddlewareContext[ListToolsRequest],
        call_next: CallNext[ListToolsRequest, Sequence[Tool]],
    ) -> Sequence[Tool]:
        return [hinted(tool) for tool in await call_next(context)]


def _scope_of(scope: Scope, context: Context | None) -> str | None:
    found = scope(context)
    if found is not None and not isinstance(found, str):
        raise TypeError(f"scope must return a str or None, got {found!r}")
    return found


def wire_result(made: ToolResult) -> WireResult:
    """A fastmcp ``ToolResult`` in the wire form the client gets."""
    from mcp_types import CallToolResult

    wire = CallToolResult(
        content=made.content,
        structured_content=made.structured_content,
        is_error=made.is_error,
        _meta=made.meta,
    )
    dumped: WireResult = wire.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


def tool_result(wire: WireResult) -> ToolResult:
    """A wire result as fastmcp's ``ToolResult``."""
    from fastmcp.tools.base import ToolResult
    from mcp_types import CallToolResult

    return ToolResult.from_mcp_result(CallToolResult.model_validate(wire))


def hinted(tool: Tool) -> Tool:
    """``tool`` announced as idempotent (``idempotentHint: true``), its other hints kept."""
    from mcp_types import ToolAnnotations

    annotations = tool.annotations or ToolAnnotations()
    if annotations.idempotent_hint:
        return tool
    updated = annotations.model_copy(update={"idempotent_hint": True})
    return tool.model_copy(update={"annotations": updated})


__all__ = ["IdempotencyMCPMiddleware"]
