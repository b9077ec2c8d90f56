"""The MCP door: ``IdempotencyMCPMiddleware`` (fastmcp) and ``idempotent_tool`` (either SDK).

The public path of :mod:`idempotency_middleware.agents`; import from here.
"""

from __future__ import annotations

from .agents import IdempotencyMCPMiddleware, idempotent_tool

__all__ = ["IdempotencyMCPMiddleware", "idempotent_tool"]
