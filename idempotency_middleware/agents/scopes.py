"""The default scope of an MCP tool call: the authenticated client's id.

A session id is no scope: on current transports it changes with every request, so a retry
would never find its first call. Without authentication every caller shares one scope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The scope callables: they receive the SDK's request context (its ``Context``).
Scope = Callable[[Any], "str | None"]


def fastmcp_client(context: Any) -> str | None:
    """The client id of the request's access token under fastmcp; ``None`` unauthenticated."""
    from fastmcp.server.dependencies import get_access_token

    token = get_access_token()
    return None if token is None else token.client_id


def sdk_client(context: Any) -> str | None:
    """The client id of the request's access token under the official SDK."""
    from mcp.server.auth.middleware.auth_context import get_access_token

    token = get_access_token()
    return None if token is None else token.client_id


__all__ = ["Scope", "fastmcp_client", "sdk_client"]
