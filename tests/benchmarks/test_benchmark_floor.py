"""``benchmarks/floor.py``: the floor must do the work it claims to (the same hashes as ours,
a fenced claim and completion, the handler once), or its figure would be no lower bound."""

from __future__ import annotations

import asyncio
import re

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchmarks._apps import HandlerRuns, order_app
from benchmarks._common import BODY, call_once
from benchmarks.floor import FloorMiddleware, Unsupported, run
from idempotency_middleware.policy.fingerprint import fingerprint_request
from idempotency_middleware.policy.keys import storage_key


def test_floor_runs_the_handler_once_and_stores_what_ours_would_hash() -> None:
    floor = FloorMiddleware(order_app())
    before = HandlerRuns.count
    bare = asyncio.run(call_once(order_app(), None))
    exchange = asyncio.run(call_once(floor, b"floor-key-1"))

    assert HandlerRuns.count - before == 2  # the bare app's run and the floor's one
    assert exchange.status == 201
    assert exchange.body_size == bare.body_size
    assert exchange.headers == bare.headers
    expected_key = storage_key("POST", "/orders", None, "floor-key-1")
    fingerprint, _owner, _expires, response = floor.records[expected_key]
    assert fingerprint == fingerprint_request("POST", "/orders", b"", b"application/json", BODY)
    assert response is not None
    assert response[0] == 201


@pytest.mark.parametrize("canonical_json", [True, False])
def test_floor_canonicalizes_json_only_when_asked(canonical_json: bool) -> None:
    floor = FloorMiddleware(order_app(), canonical_json=canonical_json)
    reordered = orjson.dumps(dict(reversed(orjson.loads(BODY).items())))
    assert reordered != BODY
    asyncio.run(call_once(floor, b"order-a", BODY))
    asyncio.run(call_once(floor, b"order-b", reordered))
    first = floor.records[storage_key("POST", "/orders", None, "order-a")][0]
    second = floor.records[storage_key("POST", "/orders", None, "order-b")][0]
    assert (first == second) is canonical_json


def test_floor_refuses_a_key_it_already_holds() -> None:
    floor = FloorMiddleware(order_app())
    asyncio.run(call_once(floor, b"held-key"))
    before = HandlerRuns.count
    with pytest.raises(Unsupported, match="already held"):
        asyncio.run(call_once(floor, b"held-key"))
    assert HandlerRuns.count == before


def test_floor_releases_the_claim_when_the_handler_raises() -> None:
    async def broken(request: Request) -> Response:
        await request.body()
        raise RuntimeError("handler failed")

    floor = FloorMiddleware(Starlette(routes=[Route("/orders", broken, methods=["POST"])]))
    with pytest.raises(RuntimeError, match="handler failed"):
        asyncio.run(call_once(floor, b"failing-key"))
    assert floor.records == {}


def test_floor_table_gives_ours_and_both_floors_an_overhead() -> None:
    output = run(rounds=1, requests=5)
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in output.splitlines()
        if line.startswith("| ")
    }
    for label in (
        "ours, MemoryStore (canonical JSON)",
        "floor, canonical JSON",
        "floor, raw body (as the peer)",
    ):
        assert re.fullmatch(r"[+-]\d+\.\d", rows[label]), rows
    # The peer is a benchmark-only dependency: its row is there, measured or saying why not.
    assert any(label.startswith("fastapi-idempotency-key") for label in rows)
