"""Responses too large for one DynamoDB item overflow to S3 when the store has a bucket."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import boto3

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest, Completion, Held
from idempotency_middleware.stores.records import StoredResponse
from tests.conftest import REGION

LARGE_BODY = os.urandom(600 * 1024)  # incompressible, over the 400 KB item limit


def _bucket(moto_endpoint: str) -> str:
    name = f"overflow-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION).create_bucket(Bucket=name)
    return name


def _objects(moto_endpoint: str, bucket: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    return [item["Key"] for item in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


def _store_with_bucket(moto_endpoint: str, table: str, bucket: str) -> DynamoDBStore:
    return DynamoDBStore(
        table,
        endpoint_url=moto_endpoint,
        region_name=REGION,
        s3_bucket=bucket,
        s3_endpoint_url=moto_endpoint,
    )


def _claim(key: str, owner: str, fingerprint: str = "fp") -> ClaimRequest:
    return ClaimRequest(key, fingerprint, owner, time.time(), lock_timeout_seconds=30)


def _completion(key: str, owner: str) -> Completion:
    response = StoredResponse(201, [(b"content-type", b"application/octet-stream")], LARGE_BODY)
    return Completion(key, owner, time.time(), ttl_seconds=60, response=response)


def test_sync_store_keeps_a_large_response_in_s3_and_replays_it(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)
    with _store_with_bucket(moto_endpoint, dynamodb_table, bucket) as store:
        assert store.claim(_claim("k", "owner-1")) == Claimed()
        assert store.complete(_completion("k", "owner-1"))
        held = store.claim(_claim("k", "owner-2"))
    assert isinstance(held, Held)
    assert held.record.response is not None
    assert held.record.response.body == LARGE_BODY
    assert held.record.response.status == 201
    assert not held.record.response_not_stored
    assert _objects(moto_endpoint, bucket) == ["idempotency/k/owner-1"]


def test_async_store_keeps_a_large_response_in_s3_and_replays_it(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)

    async def scenario() -> Held | Claimed:
        async with AsyncDynamoDBStore(
            dynamodb_table,
            endpoint_url=moto_endpoint,
            region_name=REGION,
            s3_bucket=bucket,
            s3_endpoint_url=moto_endpoint,
        ) as store:
            assert await store.aclaim(_claim("k", "owner-1")) == Claimed()
            assert await store.acomplete(_completion("k", "owner-1"))
            return await store.aclaim(_claim("k", "owner-2"))

    held = asyncio.run(scenario())
    assert isinstance(held, Held)
    assert held.record.response is not None
    assert held.record.response.body == LARGE_BODY


def test_without_a_bucket_a_large_response_is_marked_not_stored(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        store.claim(_claim("k", "owner-1"))
        assert store.complete(_completion("k", "owner-1"))
        held = store.claim(_claim("k", "owner-2"))
    assert isinstance(held, Held)
    assert held.record.response is None
    assert held.record.response_not_stored
    assert held.record.response_size == len(LARGE_BODY)


def test_a_fenced_out_owner_leaves_no_s3_object_behind(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)
    with _store_with_bucket(moto_endpoint, dynamodb_table, bucket) as store:
        store.claim(ClaimRequest("k", "fp", "dead-owner", time.time(), lock_timeout_seconds=0.05))
        time.sleep(0.1)
        assert store.claim(_claim("k", "new-owner")) == Claimed(taken_over=True)
        assert not store.complete(_completion("k", "dead-owner"))
    assert _objects(moto_endpoint, bucket) == []


def test_a_missing_s3_object_reads_as_not_stored_never_as_new(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)
    with _store_with_bucket(moto_endpoint, dynamodb_table, bucket) as store:
        store.claim(_claim("k", "owner-1"))
        store.complete(_completion("k", "owner-1"))
        client = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
        client.delete_object(Bucket=bucket, Key="idempotency/k/owner-1")
        held = store.claim(_claim("k", "owner-2"))
    assert isinstance(held, Held)
    assert held.record.response is None
    assert held.record.response_not_stored


def test_an_owners_second_completion_replaces_the_first_in_whichever_form_each_is_kept(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    # The last completion wins: a small body in the item, then a large one in S3 (the item's
    # body, preferred on a read, must go), then the small one again (the reference must go).
    small = StoredResponse(200, [], b"small")
    bucket = _bucket(moto_endpoint)
    key = f"k-{uuid.uuid4().hex[:8]}"
    with _store_with_bucket(moto_endpoint, dynamodb_table, bucket) as store:
        assert store.claim(_claim(key, "owner-1")) == Claimed()
        assert store.complete(Completion(key, "owner-1", time.time(), 60, small))
        assert store.complete(_completion(key, "owner-1"))
        large = store.get(key)
        assert large is not None and large.response is not None
        assert large.response.body == LARGE_BODY
        assert store.complete(Completion(key, "owner-1", time.time(), 60, small))
        again = store.get(key)
    assert again is not None and again.response == small
    assert not again.response_not_stored
