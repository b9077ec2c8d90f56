"""Which backend carries out action steps on which store.

A backend is a small module with a class that takes the store and offers ``write(step)``
(a sync store) and/or ``async awrite(step)`` (an async store), each carrying out one
:mod:`~.steps` step atomically and returning its :class:`~.steps.Written`: either by stating
the step's condition in the backend's own terms (a DynamoDB condition expression, a Redis
Lua script, a PostgreSQL ``WHERE``), or by evaluating
:func:`~.steps.apply` under the backend's lock or transaction (MemoryStore, SQLite).
Supporting another store is one such module and one line in :data:`_BACKENDS`.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from ..stores.dynamodb import AsyncDynamoDBStore, DynamoDBStore
from ..stores.memory import MemoryStore
from ..stores.postgres import PostgresStore
from ..stores.redis import RedisStore
from ..stores.sqlite import SQLiteStore
from .steps import Step, Written


class SyncBackend(Protocol):
    """Carries out steps on a sync store."""

    def write(self, step: Step) -> Written: ...


class AsyncBackend(Protocol):
    """Carries out steps on an async store."""

    async def awrite(self, step: Step) -> Written: ...


# (store class, backend module, backend class): the module is imported on first use.
_BACKENDS: tuple[tuple[type[Any], str, str], ...] = (
    (MemoryStore, "memory", "MemoryActions"),
    (SQLiteStore, "sqlite", "SQLiteActions"),
    (DynamoDBStore, "dynamodb", "DynamoDBActions"),
    (AsyncDynamoDBStore, "dynamodb", "AsyncDynamoDBActions"),
    (RedisStore, "redis", "RedisActions"),
    (PostgresStore, "postgres", "PostgresActions"),
)

SUPPORTED_STORES = ", ".join(store.__name__ for store, _, _ in _BACKENDS)


def backend_for(store: object) -> tuple[SyncBackend | None, AsyncBackend | None]:
    """The store's backend as its sync and async flavours (``None`` where it has none);
    ``TypeError`` for a store one-time actions do not support."""
    for store_type, module_name, class_name in _BACKENDS:
        if isinstance(store, store_type):
            module = importlib.import_module(f"{__package__}.{module_name}")
            backend = getattr(module, class_name)(store)
            sync = backend if callable(getattr(backend, "write", None)) else None
            asynchronous = backend if callable(getattr(backend, "awrite", None)) else None
            return sync, asynchronous
    raise TypeError(
        f"one-time actions need one of these stores: {SUPPORTED_STORES}; got {type(store).__name__}"
    )
