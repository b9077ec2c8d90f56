"""A door given a store of the wrong kind names the stores it takes: every one of the
package's stores that satisfies its protocol (RedisStore and PostgresStore are both kinds),
read from the classes listed in ``stores/catalog.py``, which this checks against the package's
stores."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import idempotency_middleware
from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    PostgresStore,
    RedisStore,
    SQLiteStore,
    idempotent,
)
from idempotency_middleware.stores.catalog import (
    A_SYNC_STORE,
    AN_ASYNC_STORE,
    ASYNC_STORE_NAMES,
    SYNC_STORE_NAMES,
)
from idempotency_middleware.stores.protocol import AsyncStore, SyncStore
from tests.conftest import REGION
from tests.support.ports import free_port


@pytest.fixture
def every_store(tmp_path: Path) -> Iterator[list[object]]:
    """One of each of the package's stores; none connects before its first call (the ports
    are closed)."""
    closed = f"127.0.0.1:{free_port()}"
    endpoint = f"http://{closed}"
    stores: list[object] = [
        DynamoDBStore("t", endpoint_url=endpoint, region_name=REGION),
        AsyncDynamoDBStore("t", endpoint_url=endpoint, region_name=REGION),
        RedisStore(f"redis://{closed}/0"),
        PostgresStore(f"postgresql://postgres@{closed}/postgres"),
        SQLiteStore(tmp_path / "idem.sqlite3"),
        MemoryStore(),
    ]
    yield stores
    for store in stores:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def test_the_named_stores_are_the_package_s_stores_each_protocol_takes(
    every_store: list[object],
) -> None:
    names = {type(store).__name__ for store in every_store}
    exported = {
        name
        for name in idempotency_middleware.__all__
        if name.endswith("Store") and name not in ("SyncStore", "AsyncStore")
    }
    assert names == exported  # a new store is added above, and so checked
    sync = {type(store).__name__ for store in every_store if isinstance(store, SyncStore)}
    asynchronous = {type(store).__name__ for store in every_store if isinstance(store, AsyncStore)}
    assert sorted(SYNC_STORE_NAMES) == sorted(sync)
    assert sorted(ASYNC_STORE_NAMES) == sorted(asynchronous)
    assert {"RedisStore", "PostgresStore"} <= sync & asynchronous


def asgi_door() -> None:
    IdempotencyMiddleware(lambda *_: None, store=DynamoDBStore("t", region_name=REGION))  # type: ignore[arg-type]


def wsgi_door() -> None:
    IdempotencyWSGIMiddleware(lambda *_: [], store=AsyncDynamoDBStore("t", region_name=REGION))  # type: ignore[arg-type]


def async_function_door() -> None:
    async def work(key: str) -> str:
        return key

    idempotent(store=DynamoDBStore("t", region_name=REGION), key="key")(work)


def sync_function_door() -> None:
    def work(key: str) -> str:
        return key

    idempotent(store=AsyncDynamoDBStore("t", region_name=REGION), key="key")(work)


@pytest.mark.parametrize(
    ("door", "said"),
    [
        (asgi_door, f"IdempotencyMiddleware needs {AN_ASYNC_STORE}; DynamoDBStore has no"),
        (wsgi_door, f"IdempotencyWSGIMiddleware needs {A_SYNC_STORE}; AsyncDynamoDBStore has"),
        (async_function_door, f"needs {AN_ASYNC_STORE}; DynamoDBStore has no aclaim"),
        (sync_function_door, f"needs {A_SYNC_STORE}; AsyncDynamoDBStore has no claim"),
    ],
    ids=["asgi", "wsgi", "async-function", "sync-function"],
)
def test_a_door_given_the_wrong_kind_names_every_store_it_takes(
    door: Callable[[], None], said: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(said)) as raised:
        door()
    message = str(raised.value)
    assert "RedisStore, PostgresStore, SQLiteStore, MemoryStore)" in message
