"""Exactly-once writes behind ``IdempotencyDjangoMiddleware``: a view's transaction commits
with its completion, and a streaming response is held until the writes landed (Django on a
DynamoDBStore on moto, served by waitress)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import httpx
import orjson
import pytest

from idempotency_middleware import DynamoDBStore
from tests.conftest import REGION, new_table
from tests.e2e.test_django import DjangoServers, django_servers, keyed, new_key
from tests.support import django_project as project
from tests.support.apps import STREAM_FIRST_CHUNK, STREAM_LAST_CHUNK

__all__ = ["django_servers"]  # the fixture, imported for these tests


@pytest.fixture
def orders_table(moto_endpoint: str) -> Iterator[str]:
    """A business table (partition key ``id``) on moto."""
    name = f"orders-{uuid.uuid4().hex[:12]}"
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    yield name
    client.close()


def orders(moto_endpoint: str, table: str) -> list[str]:
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    try:
        return sorted(item["id"]["S"] for item in client.scan(TableName=table)["Items"])
    finally:
        client.close()


@pytest.fixture
def dynamodb_store(moto_endpoint: str) -> Iterator[DynamoDBStore]:
    with DynamoDBStore(
        new_table(moto_endpoint), endpoint_url=moto_endpoint, region_name=REGION
    ) as store:
        yield store


def test_a_views_writes_commit_with_its_completion_and_the_retry_writes_nothing(
    django_servers: DjangoServers,
    dynamodb_store: DynamoDBStore,
    orders_table: str,
    moto_endpoint: str,
) -> None:
    served = django_servers.start(store=dynamodb_store)
    key = new_key()
    body = {"id": "order-1"}

    first = served.client.post(f"/txn?table={orders_table}", json=body, headers=keyed(key))
    retry = served.client.post(f"/txn?table={orders_table}", json=body, headers=keyed(key))

    assert first.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert orders(moto_endpoint, orders_table) == ["order-1"]
    assert served.state.calls(project.POST_TXN) == 1


def test_a_failed_condition_of_the_views_writes_answers_409_and_releases_the_key(
    django_servers: DjangoServers,
    dynamodb_store: DynamoDBStore,
    orders_table: str,
    moto_endpoint: str,
) -> None:
    served = django_servers.start(store=dynamodb_store)
    body = {"id": "order-2"}
    assert (
        served.client.post(
            f"/txn?table={orders_table}", json=body, headers=keyed(new_key())
        ).status_code
        == 201
    )
    key = new_key()

    conflict = served.client.post(f"/txn?table={orders_table}", json=body, headers=keyed(key))
    again = served.client.post(f"/txn?table={orders_table}", json=body, headers=keyed(key))

    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == "application/problem+json"
    problem = orjson.loads(conflict.content)
    assert problem["type"].endswith("transaction-conflict")
    assert (problem["position"], problem["reason"]) == (0, "ConditionalCheckFailed")
    assert again.status_code == 409  # released, so the view ran again (and failed again)
    assert served.state.calls(project.POST_TXN) == 3


def test_a_streaming_response_with_writes_is_held_until_they_landed_then_replayed(
    django_servers: DjangoServers,
    dynamodb_store: DynamoDBStore,
    orders_table: str,
    moto_endpoint: str,
) -> None:
    served = django_servers.start(store=dynamodb_store)
    key = new_key()
    url = f"/txn?table={orders_table}&stream=1"

    first = served.client.post(url, json={"id": "order-3"}, headers=keyed(key))
    retry = served.client.post(url, json={"id": "order-3"}, headers=keyed(key))

    assert first.status_code == 200
    assert first.content == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert first.headers["content-length"] == str(len(first.content))  # sent whole
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content  # stored, unlike a live stream (410)
    assert orders(moto_endpoint, orders_table) == ["order-3"]


def test_a_request_without_a_key_has_no_transaction(
    django_servers: DjangoServers, dynamodb_store: DynamoDBStore, orders_table: str
) -> None:
    served = django_servers.start(store=dynamodb_store)

    response = served.client.post(f"/txn?table={orders_table}", json={"id": "order-4"})

    assert (response.status_code, response.text) == (501, "LookupError")


def test_a_streaming_response_with_writes_that_fails_midway_is_cut_and_writes_nothing(
    django_servers: DjangoServers,
    dynamodb_store: DynamoDBStore,
    orders_table: str,
    moto_endpoint: str,
) -> None:
    served = django_servers.start(store=dynamodb_store)
    key = new_key()
    url = f"/txn?table={orders_table}&stream=cut"

    for _ in range(2):
        # Held for its writes, it failed midway: the client sees waitress's cut of a stream
        # failing after its first chunk, not a whole response nor a 500.
        with pytest.raises(httpx.RemoteProtocolError):
            served.client.post(url, json={"id": "order-4"}, headers=keyed(key))

    assert served.state.calls(project.POST_TXN) == 2  # released: the retry ran it again
    assert orders(moto_endpoint, orders_table) == []
