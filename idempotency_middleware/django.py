"""The Django door, as ``MIDDLEWARE`` names it:
``"idempotency_middleware.django.IdempotencyDjangoMiddleware"``.

The public path of :mod:`idempotency_middleware.web.django`; import from here.
"""

from __future__ import annotations

from .web.django import (
    SETTING,
    IdempotencyDjangoMiddleware,
    problem_response,
    replay_response,
)

__all__ = [
    "SETTING",
    "IdempotencyDjangoMiddleware",
    "problem_response",
    "replay_response",
]
