"""The MCP door's core cases on stores beside the in-memory one: SQLite, and Redis (a real
server, started by the session fixture), each under a real uvicorn server of each SDK.

The store contract already proves the stores; this proves the door drives them: the same
call sent twice runs once and is replayed, two concurrent calls with one key run once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import RedisStore, SQLiteStore
from idempotency_middleware.stores.protocol import AsyncStore
from tests.support.mcp_servers import (
    KINDS,
    Kind,
    build,
    connect,
    http_app,
    runs_of,
    two_calls_at_once,
)
from tests.support.servers import serve_asgi


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AsyncStore]:
    made: Any
    if request.param == "sqlite":
        made = SQLiteStore(tmp_path / "keys.sqlite3")
        made.create_table()
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisStore(url, prefix=f"mcp-{uuid.uuid4().hex}:")
    yield made
    made.close()


@pytest.fixture
def url(kind: Kind, store: AsyncStore, tmp_path: Path) -> Iterator[str]:
    """A server of ``kind`` on ``store``, its tools' runs in ``tmp_path / "runs"``."""
    server = build(kind, store, tmp_path / "runs")
    with serve_asgi(http_app(kind, server), lifespan=True) as base:
        yield base


async def test_the_same_call_sent_twice_runs_once_and_the_retry_is_replayed(
    kind: Kind, url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    async with connect(kind, url) as call:
        first = await call("charge", {"order": 7}, "task-1")
        second = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == ["charge 7"]
    assert second["_meta"]["idempotentReplayed"] is True
    for part in ("content", "structuredContent", "isError"):
        assert second.get(part) == first.get(part), part


async def test_two_concurrent_calls_with_one_key_run_once_and_the_other_gets_the_replay(
    kind: Kind, url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    results = await two_calls_at_once(kind, url, runs)
    assert runs_of(runs) == ["slow_charge 7"]
    replayed = [result["_meta"].get("idempotentReplayed", False) for result in results]
    assert sorted(replayed) == [False, True]
    assert results[0]["structuredContent"] == results[1]["structuredContent"] == {"order": 7}
