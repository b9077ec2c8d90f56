"""FastAPI route opt-ins and OpenAPI documentation for ``IdempotencyMiddleware``.

The public path of :mod:`idempotency_middleware.web.fastapi`; import from here.
"""

from __future__ import annotations

from .web.fastapi import (
    COVERED_KEY,
    PROBLEM_SCHEMA_NAME,
    IdempotencyKey,
    IdempotencyNotCoveredError,
    document_idempotency,
    route_rules,
)

__all__ = [
    "COVERED_KEY",
    "PROBLEM_SCHEMA_NAME",
    "IdempotencyKey",
    "IdempotencyNotCoveredError",
    "document_idempotency",
    "route_rules",
]
