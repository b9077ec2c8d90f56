"""The API reference's examples for stores."""

# --8<-- [start:stores]
from idempotency_middleware import (
    AsyncDynamoDBStore,
    AsyncStore,
    DynamoDBStore,
    MemoryStore,
    PostgresStore,
    RedisStore,
    SQLiteStore,
    SyncStore,
)

# Every store is built without connecting: clients and pools open on first use.
stores = [
    AsyncDynamoDBStore("idempotency", region_name="eu-west-1"),  # ASGI, async functions
    DynamoDBStore("idempotency", region_name="eu-west-1"),  # WSGI, Django, sync functions
    RedisStore("redis://cache.internal:6379/0"),  # both flavours
    PostgresStore("postgresql://app@db.internal/app", table="idempotency"),  # both
    SQLiteStore("idempotency.sqlite3"),  # both; the processes of one machine
    MemoryStore(),  # both; one process
]
assert all(isinstance(store, SyncStore | AsyncStore) for store in stores)
# --8<-- [end:stores]

# --8<-- [start:protocols]
from idempotency_middleware import AsyncStore, DynamoDBStore, MemoryStore, SyncStore

assert isinstance(MemoryStore(), SyncStore) and isinstance(MemoryStore(), AsyncStore)
assert not isinstance(DynamoDBStore("idempotency", region_name="eu-west-1"), AsyncStore)
# --8<-- [end:protocols]

# --8<-- [start:StoreUnavailable]
from idempotency_middleware import SQLiteStore, StoreUnavailable

try:
    SQLiteStore("/nonexistent/idempotency.sqlite3").get("key")
except StoreUnavailable as error:
    print(error.cause, "-", error)
# --8<-- [end:StoreUnavailable]
