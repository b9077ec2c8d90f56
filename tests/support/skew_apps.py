"""Doors for tests/e2e/test_clock_skew.py: the test app behind either middleware on 127.0.0.1,
each door with its own options (its own clock), and the stores two doors share.

Two doors are two hosts of one deployment: they share the store's records, not their clocks.
A ``MemoryStore`` is one instance for both doors (they run in this process); a ``SQLiteStore``
is one instance per door on one file, as two worker processes of a machine open it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    SQLiteStore,
)
from tests.support.apps import AppState, build_asgi_app, build_wsgi_app
from tests.support.servers import Adapter, serve_asgi, serve_wsgi

SharedKind = Literal["memory", "sqlite"]
SHARED_KINDS: tuple[SharedKind, ...] = ("memory", "sqlite")


@contextlib.contextmanager
def serve_door(adapter: Adapter, state: AppState, store: Any, **options: Any) -> Iterator[str]:
    """The test app (FastAPI on uvicorn, or Flask on waitress) counting its calls in
    ``state``, wrapped in that adapter's middleware with ``store`` and ``options``; its URL."""
    if adapter == "asgi":
        wrapped = IdempotencyMiddleware(build_asgi_app(state), store=store, **options)
        with serve_asgi(wrapped) as url:
            yield url
        return
    app = build_wsgi_app(state)
    app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, store=store, **options
    )
    with serve_wsgi(app) as url:
        yield url


@contextlib.contextmanager
def shared_stores(kind: SharedKind, directory: Path) -> Iterator[tuple[Any, Any]]:
    """The stores of door A and door B, holding the same records; closed after the block
    (so after the servers that use them, when entered before them)."""
    if kind == "memory":
        memory = MemoryStore()
        yield memory, memory
        return
    path = directory / "shared.sqlite3"
    with SQLiteStore(path) as store_a, SQLiteStore(path) as store_b:
        yield store_a, store_b
