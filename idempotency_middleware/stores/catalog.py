"""The package's stores, by the kind of door that takes them: a door given a store of the
other kind names these in its ``TypeError``. A store takes sync doors when it has the sync
protocol's methods and async doors when it has the async ones (Redis, PostgreSQL, SQLite and
memory have both); the list is read from the classes, so a new store is named once it is
added to ``STORES``."""

from __future__ import annotations

from .dynamodb import AsyncDynamoDBStore, DynamoDBStore
from .memory import MemoryStore
from .postgres import PostgresStore
from .redis import RedisStore
from .sqlite import SQLiteStore

STORES: tuple[type, ...] = (
    DynamoDBStore,
    AsyncDynamoDBStore,
    RedisStore,
    PostgresStore,
    SQLiteStore,
    MemoryStore,
)
_SYNC_METHODS = ("claim", "complete", "release", "renew")
_ASYNC_METHODS = ("aclaim", "acomplete", "arelease", "arenew")


def _names(methods: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(
        store.__name__
        for store in STORES
        if all(callable(getattr(store, method, None)) for method in methods)
    )


SYNC_STORE_NAMES = _names(_SYNC_METHODS)
ASYNC_STORE_NAMES = _names(_ASYNC_METHODS)
A_SYNC_STORE = f"a sync store ({', '.join(SYNC_STORE_NAMES)})"
AN_ASYNC_STORE = f"an async store ({', '.join(ASYNC_STORE_NAMES)})"
