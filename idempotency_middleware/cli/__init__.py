"""The ``idempotency-middleware`` command line: inspect, delete and check a store's records."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
