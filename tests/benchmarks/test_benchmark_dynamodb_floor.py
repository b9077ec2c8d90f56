"""``benchmarks/dynamodb_floor.py``: the DynamoDB floor must do the work it claims (claim with
one conditional PutItem, run the app once, store its response with one UpdateItem, replay
from the failed claim's ALL_OLD item, the same hashes as ours), or its figure would be no
lower bound for ours. On moto's server (HTTP/1.0: the floor reconnects) for both doors."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from benchmarks import dynamodb_requests
from benchmarks._common import BODY
from benchmarks.dynamodb_floor import FloorASGI, FloorWSGI, Unsupported, create_floor_table
from benchmarks.dynamodb_requests import Runs, _asgi_caller, _fastapi, _flask, _wsgi_caller
from idempotency_middleware.policy.fingerprint import fingerprint_request
from idempotency_middleware.policy.keys import storage_key
from tests.conftest import REGION


@pytest.fixture
def floor_table(moto_endpoint: str) -> Iterator[tuple[str, Any]]:
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    name = f"floor-{uuid.uuid4().hex[:12]}"
    create_floor_table(client, name)
    yield name, client
    client.delete_table(TableName=name)
    client.close()


def _floor(door: str, moto_endpoint: str, table: str, runs: Runs) -> tuple[Any, Any]:
    if door == "WSGI":
        wsgi = FloorWSGI(_flask(runs, door), moto_endpoint, REGION, table)
        return wsgi, _wsgi_caller(wsgi)
    asgi = FloorASGI(_fastapi(runs, door), moto_endpoint, REGION, table)
    return asgi, _asgi_caller(asgi)


@pytest.mark.parametrize("door", ["WSGI", "ASGI"])
def test_the_floor_claims_runs_once_stores_and_replays(
    door: str, moto_endpoint: str, floor_table: tuple[str, Any]
) -> None:
    table, client = floor_table
    runs = Runs()
    floor, call = _floor(door, moto_endpoint, table, runs)

    async def twice() -> list[int]:
        return [await call("floor-key"), await call("floor-key")]

    assert asyncio.run(twice()) == [201, 201]
    assert runs.counts[door] == 1  # the second was a replay from the ALL_OLD item
    assert floor.wire.calls == 3  # PutItem + UpdateItem, then one PutItem

    item = client.get_item(
        TableName=table, Key={"pk": {"S": storage_key("POST", "/orders", None, "floor-key")}}
    )["Item"]
    assert item["fp"]["S"] == fingerprint_request("POST", "/orders", b"", b"application/json", BODY)
    assert item["st"]["N"] == "201"
    assert json.loads(item["bd"]["B"])["status"] == "accepted"


@pytest.mark.parametrize("door", ["WSGI", "ASGI"])
def test_the_floor_refuses_another_body_under_a_key(
    door: str, moto_endpoint: str, floor_table: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    table, _client = floor_table
    runs = Runs()
    _floor_app, call = _floor(door, moto_endpoint, table, runs)
    assert asyncio.run(call("floor-key")) == 201
    other = json.loads(BODY)
    other["amount"] += 1  # the same length: only the fingerprint tells them apart
    monkeypatch.setattr(dynamodb_requests, "BODY", json.dumps(other).encode())
    with pytest.raises(Unsupported, match="another body"):
        asyncio.run(call("floor-key"))
    assert runs.counts[door] == 1
