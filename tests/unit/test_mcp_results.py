"""The MCP door's answers: a replay is the stored tool result marked in ``_meta``; its
refusals are tool errors a model can act on, with ``retryAfter`` where waiting helps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from idempotency_middleware import MemoryStore
from idempotency_middleware.agents import results
from idempotency_middleware.engine.refusals import STORE_UNAVAILABLE_RETRY_AFTER
from idempotency_middleware.stores.protocol import ClaimRequest, StoreUnavailable
from idempotency_middleware.testing import FakeClock
from tests.support.mcp_servers import KINDS, Kind, build, connect, runs_of

STORED: dict[str, Any] = {
    "content": [{"type": "text", "text": '{"order":7}'}],
    "structuredContent": {"order": 7},
    "isError": False,
    "_meta": {"traceId": "t-1"},
}


class DownStore(MemoryStore):
    """A store whose claims fail as an unreachable store's do."""

    def claim(self, request: ClaimRequest) -> Any:
        raise StoreUnavailable("the store is down", cause="unreachable")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


def test_a_replay_is_the_stored_result_marked_replayed_in_meta() -> None:
    replay = results.replayed(STORED)
    assert replay["_meta"]["idempotentReplayed"] is True
    for part in ("content", "structuredContent", "isError"):
        assert replay[part] == STORED[part]


def test_a_replay_keeps_the_stored_results_own_meta_and_leaves_it_unchanged() -> None:
    replay = results.replayed(STORED)
    assert replay["_meta"]["traceId"] == "t-1"
    assert "idempotentReplayed" not in STORED["_meta"]


def test_a_result_without_meta_is_replayed_with_one() -> None:
    assert results.replayed({"content": []})["_meta"] == {"idempotentReplayed": True}


def test_a_stored_result_decodes_to_what_was_encoded() -> None:
    assert results.decode(results.encode(STORED, None), None) == STORED


def test_a_serializers_dumps_that_returns_no_bytes_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match="serializer's dumps returned str"):
        results.encode(STORED, (lambda value: "text", orjson.loads))  # type: ignore[arg-type, return-value]


def test_a_stored_result_that_is_no_json_object_is_refused() -> None:
    with pytest.raises(TypeError, match="a stored tool result is a JSON object, got list"):
        results.decode(b"[1]", None)


@pytest.mark.parametrize(("seconds", "retry_after"), [(0, 1), (0.2, 1), (1, 1), (2.1, 3)])
def test_still_running_asks_to_retry_after_whole_seconds_at_least_one(
    seconds: float, retry_after: int
) -> None:
    answer = results.still_running("charge", seconds)
    assert answer["isError"] is True
    assert answer["_meta"] == {"retryAfter": retry_after}
    assert f"Retry with the same key in {retry_after} s" in answer["content"][0]["text"]


def test_a_tool_error_is_never_kept_and_a_result_is() -> None:
    assert results.is_error(results.key_reused("charge"))
    assert not results.is_error(STORED)


# --- through the door, with each SDK's client in process -----------------------------------


async def test_a_duplicate_of_a_running_call_is_told_to_retry_when_its_lease_runs_out(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    clock = FakeClock()
    server = build(kind, MemoryStore(), runs, clock=clock, wait_seconds=0, lock_timeout_seconds=30)
    async with connect(kind, server=server) as first, connect(kind, server=server) as second:
        running = first("slow_charge", {"order": 7}, "task-1")
        task = asyncio.ensure_future(running)
        while runs_of(runs) != ["slow_charge 7"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        duplicate = await second("slow_charge", {"order": 7}, "task-1")
        runs.with_suffix(".gate").touch()
        await task
    assert duplicate["isError"] is True
    assert duplicate["_meta"]["retryAfter"] == 30  # the clock stood still: all the lease
    assert "still running" in duplicate["content"][0]["text"]


async def test_a_store_that_is_down_answers_a_tool_error_with_retry_after_and_nothing_runs(
    kind: Kind, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    server = build(kind, DownStore(), runs)
    async with connect(kind, server=server) as call:
        refused = await call("charge", {"order": 7}, "task-1")
    assert runs_of(runs) == []
    assert refused["isError"] is True
    assert refused["_meta"]["retryAfter"] == STORE_UNAVAILABLE_RETRY_AFTER
    assert "the idempotency store is unavailable" in refused["content"][0]["text"]
