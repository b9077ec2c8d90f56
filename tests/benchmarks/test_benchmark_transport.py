"""``benchmarks/transport.py`` and ``benchmarks/dynamodb_requests.py`` at a tiny scale on
DynamoDB Local: every row is there, and each contender did what its row claims (the
transport calls answered 200; every request was a 201, a new key ran the handler once, a
replay never, with 2 and 1 DynamoDB requests). Run by ``scripts/dynamodb-local.sh`` with the
other DynamoDB Local cases; skipped in a normal run (as
tests/benchmarks/test_benchmark_functions.py)."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from benchmarks import dynamodb_requests, transport
from idempotency_middleware import DynamoDBStore
from tests.conftest import REGION


def body_rows(report: str) -> list[list[str]]:
    rows = []
    for line in report.splitlines()[4:]:
        if line.startswith("| "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


@pytest.fixture(params=["dynamodb-local"])
def endpoint(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("dynamodb_local_endpoint")
    return url


def test_the_transport_table_has_every_client_pair_and_call(endpoint: str) -> None:
    table = f"bench-{uuid.uuid4().hex[:8]}"
    with DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION) as store:
        store.create_table()
        results = asyncio.run(transport.measure(endpoint, table, rounds=1, calls=2))
        store.client.delete_table(TableName=table)
    rows = body_rows(transport.report(results, 1, 2))
    assert [(row[0], row[1]) for row in rows] == [
        (f"{lean} vs {sdk}", call) for sdk, lean in transport.PAIRS for call in transport.OPERATIONS
    ]
    assert all(row[4].endswith("x") for row in rows)


def test_the_requests_table_compares_every_contender_with_powertools(endpoint: str) -> None:
    report = dynamodb_requests.run(endpoint, rounds=1, requests=2)
    contenders, floor = report.split("\n\n### ")
    rows = body_rows(contenders)
    assert [row[0] for row in rows] == [
        "ours WSGI (lean)",
        "ours WSGI (sdk)",
        "floor, Flask",
        "Powertools, Flask",
        "ours ASGI (lean)",
        "ours ASGI (sdk)",
        "floor, FastAPI",
        "Powertools, sync FastAPI route",
    ]
    for row in rows:
        assert (row[4], row[8]) == ("2", "1")  # DynamoDB requests: new key, replay
    assert rows[3][2] == rows[7][2] == "1.00x"
    # Ours against the floor: both doors, both cases, each with a ratio.
    floor_rows = body_rows("### " + floor)
    assert [(row[0], row[1]) for row in floor_rows] == [
        (door, case)
        for door in ("WSGI (Flask)", "ASGI (FastAPI)")
        for case in ("new key", "replay")
    ]
    assert all(re.fullmatch(r"\d+\.\d\dx", row[4]) for row in floor_rows), floor_rows
