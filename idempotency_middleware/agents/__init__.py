"""Agents' tool calls: the MCP door (``idempotency_middleware.mcp`` is its public path).

``keys`` reads a call's key, scope and fingerprint; ``results`` stores and words tool
results; ``calls`` runs a tool call through the one attempt; ``middleware`` (fastmcp) and
``decorator`` (either SDK) are the translations from each SDK.
"""

from __future__ import annotations

from .decorator import idempotent_tool
from .middleware import IdempotencyMCPMiddleware

__all__ = ["IdempotencyMCPMiddleware", "idempotent_tool"]
