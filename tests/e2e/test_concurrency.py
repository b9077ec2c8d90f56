"""Simultaneous duplicates through real servers: the handler runs exactly once.

Each combination is hit by a burst of requests carrying one key to ``POST /sleep`` (a
handler that takes ``SLEEP_SECONDS``): from one ``httpx.AsyncClient`` (many connections on
one event loop) and from a pool of threads with their own ``httpx.Client``.

"Exactly once" rests on the store's conditional claim being atomic, so it is proven only on
stores where it is: ``MemoryStore``, ``SQLiteStore`` and, when the run has it (under
scripts/dynamodb-local.sh), DynamoDB on Amazon's DynamoDB Local. Not on moto: its threaded
server evaluates a ConditionExpression and writes the item without a lock, so two
simultaneous claims of one key can both win there (tests/contract/test_moto_atomicity.py shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aioboto3
import boto3
import httpx
import pytest

from idempotency_middleware import DynamoDBStore
from tests.conftest import REGION
from tests.support.apps import POST_SLEEP
from tests.support.db_stores import location
from tests.support.servers import (
    ATOMIC_COMBOS,
    CLIENT_TIMEOUT_SECONDS,
    AWSSessions,
    Combo,
    Harness,
)

BURST = 24
BODY = {"amount": 10, "currency": "EUR"}


@pytest.fixture(scope="module")
def local_aws_sessions(dynamodb_local_endpoint: str) -> Iterator[AWSSessions]:
    """Sessions for stores on DynamoDB Local, and a client there for looking into tables."""
    boto3_session = boto3.session.Session(region_name=REGION)
    dynamodb = boto3_session.client("dynamodb", endpoint_url=dynamodb_local_endpoint)
    try:
        yield AWSSessions(boto3_session, aioboto3.Session(region_name=REGION), dynamodb)
    finally:
        dynamodb.close()


@pytest.fixture(params=ATOMIC_COMBOS, ids=lambda combo: combo.id)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """This module's combinations, in place of conftest's: stores with atomic claims.

    The DynamoDB Local ones (ids ``asgi-dynamodb-local``, ``wsgi-dynamodb-local``, selected by
    scripts/dynamodb-local.sh's ``-k dynamodb-local``) are skipped unless the run has it.
    """
    combo: Combo = request.param
    table_name: str | None = None
    endpoint: str | None = None
    aws: AWSSessions | None = None
    db_location: str | None = None
    if combo.store in ("redis", "postgres"):
        db_location = location(request, combo.store)
    if combo.store == "dynamodb-local":
        endpoint = request.getfixturevalue("dynamodb_local_endpoint")
        aws = request.getfixturevalue("local_aws_sessions")
        table_name = f"burst-{uuid.uuid4().hex[:12]}"
        with DynamoDBStore(
            table_name, endpoint_url=endpoint, region_name=REGION, session=aws.boto3_session
        ) as creator:
            creator.create_table()
    with contextlib.ExitStack() as stack:
        yield Harness(
            combo,
            stack,
            table_name=table_name,
            dynamodb_endpoint=endpoint,
            region=REGION,
            aws=aws,
            db_location=db_location,
        )


def assert_ran_once(harness: Harness, responses: list[httpx.Response]) -> None:
    """One original 201; every other response a 409 with Retry-After or the replay."""
    assert len(responses) == BURST
    statuses = sorted(response.status_code for response in responses)
    assert all(status < 500 for status in statuses), statuses
    originals = [
        response
        for response in responses
        if response.status_code == 201 and "idempotent-replayed" not in response.headers
    ]
    assert len(originals) == 1, statuses
    for response in responses:
        if response is originals[0]:
            continue
        if response.status_code == 409:
            assert response.headers.get("retry-after", "").isdigit(), response.headers
            assert response.headers["content-type"] == "application/problem+json"
        else:
            assert response.status_code == 201, response.text
            assert response.headers.get("idempotent-replayed") == "true"
            assert response.content == originals[0].content
    assert harness.calls(POST_SLEEP) == 1


async def test_simultaneous_duplicates_from_async_clients_run_the_handler_once(
    harness: Harness,
) -> None:
    url = harness.start()
    headers = {"Idempotency-Key": f"burst-{uuid.uuid4()}"}
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)

    async with httpx.AsyncClient(
        base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS, limits=limits
    ) as client:
        responses = await asyncio.gather(
            *(client.post("/sleep", json=BODY, headers=headers) for _ in range(BURST))
        )

    assert_ran_once(harness, list(responses))


def test_simultaneous_duplicates_from_threads_run_the_handler_once(harness: Harness) -> None:
    url = harness.start()
    headers = {"Idempotency-Key": f"burst-{uuid.uuid4()}"}
    barrier = threading.Barrier(BURST, timeout=60)

    def send() -> httpx.Response:
        with httpx.Client(base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS) as client:
            barrier.wait(timeout=10)
            return client.post("/sleep", json=BODY, headers=headers)

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        responses = list(pool.map(lambda _: send(), range(BURST)))

    assert_ran_once(harness, responses)
