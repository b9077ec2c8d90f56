"""The DynamoDB stores at their edges, over moto's server: S3 overflow failures, the async
store's fenced-out clean-up, create_table's error handling (TTL races with another replica),
and the connection settings' validation."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import boto3
import orjson
import pytest

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore
from idempotency_middleware.stores.dynamodb.errors import held_item
from idempotency_middleware.stores.protocol import (
    Claimed,
    ClaimRequest,
    ClaimResult,
    Completion,
    Held,
    StoreUnavailable,
)
from idempotency_middleware.stores.records import StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION
from tests.contract.test_store_kit import AnswerRewritingProxy
from tests.support.faultproxy import FaultProxy

FLAVOURS = ["sync", "async"]
LARGE_BODY = os.urandom(600 * 1024)  # over the 400 KB item limit: overflows to S3
NOW = 1_700_000_000.0

VALIDATION_BODY = orjson.dumps(
    {
        "__type": "com.amazon.coral.validate#ValidationException",
        "message": "TimeToLive is already enabled",
    }
)


class TTLRaceProxy(AnswerRewritingProxy):
    """Answers UpdateTimeToLive with ValidationException, as DynamoDB does when TTL is
    already on; with ``other_replica_enables`` it first lets the update through to moto
    (another replica enabling TTL between our describe and our update)."""

    other_replica_enables = True

    def _answer(
        self, operation: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        if operation != "UpdateTimeToLive":
            return super()._answer(operation, body, headers)
        if self.other_replica_enables:
            super()._answer(operation, body, headers)
        else:
            with self._lock:
                self.operations.append(operation)
        return 400, [("Content-Type", "application/x-amz-json-1.0")], VALIDATION_BODY


@pytest.fixture
def ttl_race_proxy(moto_endpoint: str) -> Iterator[TTLRaceProxy]:
    running = TTLRaceProxy(moto_endpoint)
    with running:
        yield running


def _bucket(moto_endpoint: str) -> str:
    name = f"edges-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION).create_bucket(Bucket=name)
    return name


def _s3(moto_endpoint: str) -> object:
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)


def _claim(key: str, owner: str, now: float = NOW, lock: float = 30.0) -> ClaimRequest:
    return ClaimRequest(key, "fp", owner, now, lock_timeout_seconds=lock)


def _completion(key: str, owner: str, now: float = NOW) -> Completion:
    response = StoredResponse(201, [(b"content-type", b"application/octet-stream")], LARGE_BODY)
    return Completion(key, owner, now, ttl_seconds=60, response=response)


def _async_store(endpoint: str, table: str, bucket: str | None = None) -> AsyncDynamoDBStore:
    return AsyncDynamoDBStore(
        table,
        endpoint_url=endpoint,
        region_name=REGION,
        s3_bucket=bucket,
        s3_endpoint_url=endpoint if bucket else None,
    )


def _sync_store(endpoint: str, table: str, bucket: str | None = None) -> DynamoDBStore:
    return DynamoDBStore(
        table,
        endpoint_url=endpoint,
        region_name=REGION,
        s3_bucket=bucket,
        s3_endpoint_url=endpoint if bucket else None,
    )


def _complete_then_claim(
    flavour: str, endpoint: str, table: str, bucket: str, between: object
) -> ClaimResult:
    """owner-1 claims and completes ``k`` with a large body; ``between()`` runs; owner-2
    claims ``k``."""
    assert callable(between)
    if flavour == "sync":
        with _sync_store(endpoint, table, bucket) as store:
            assert store.claim(_claim("k", "owner-1")) == Claimed()
            assert store.complete(_completion("k", "owner-1"))
            between()
            return store.claim(_claim("k", "owner-2"))

    async def scenario() -> ClaimResult:
        async with _async_store(endpoint, table, bucket) as store:
            assert await store.aclaim(_claim("k", "owner-1")) == Claimed()
            assert await store.acomplete(_completion("k", "owner-1"))
            between()
            return await store.aclaim(_claim("k", "owner-2"))

    return asyncio.run(scenario())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_missing_s3_object_reads_as_not_stored(
    flavour: str, moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)
    client = _s3(moto_endpoint)

    def lose_the_object() -> None:
        client.delete_object(Bucket=bucket, Key="idempotency/k/owner-1")  # type: ignore[attr-defined]

    held = _complete_then_claim(flavour, moto_endpoint, dynamodb_table, bucket, lose_the_object)

    assert isinstance(held, Held)
    assert held.record.response is None
    assert held.record.response_not_stored  # replayed as "not stored", never run again
    assert held.record.response_size == len(LARGE_BODY)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_s3_failure_other_than_a_missing_object_answers_store_unavailable(
    flavour: str, moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)
    client = _s3(moto_endpoint)

    def lose_the_bucket() -> None:
        client.delete_object(Bucket=bucket, Key="idempotency/k/owner-1")  # type: ignore[attr-defined]
        client.delete_bucket(Bucket=bucket)  # type: ignore[attr-defined]

    with pytest.raises(StoreUnavailable, match="S3 get_object") as raised:
        _complete_then_claim(flavour, moto_endpoint, dynamodb_table, bucket, lose_the_bucket)
    assert raised.value.code == "NoSuchBucket"


def test_async_fenced_out_owner_leaves_no_s3_object_behind(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    bucket = _bucket(moto_endpoint)

    async def scenario() -> None:
        async with _async_store(moto_endpoint, dynamodb_table, bucket) as store:
            assert await store.aclaim(_claim("k", "dead-owner", lock=1.0)) == Claimed()
            later = NOW + 10  # past the dead owner's lock
            assert await store.aclaim(_claim("k", "new-owner", now=later)) == Claimed(
                taken_over=True
            )
            assert not await store.acomplete(_completion("k", "dead-owner", now=later))

    asyncio.run(scenario())
    listed = _s3(moto_endpoint).list_objects_v2(Bucket=bucket)  # type: ignore[attr-defined]
    assert listed.get("Contents", []) == []


def _create_table(flavour: str, endpoint: str, table: str) -> None:
    clock = FakeClock()
    if flavour == "sync":
        with DynamoDBStore(
            table, endpoint_url=endpoint, region_name=REGION, max_attempts=1, clock=clock
        ) as store:
            store.create_table()
            return

    async def create() -> None:
        async with AsyncDynamoDBStore(
            table, endpoint_url=endpoint, region_name=REGION, max_attempts=1, clock=clock
        ) as store:
            await store.acreate_table()

    asyncio.run(create())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_create_table_reports_a_failure_other_than_an_existing_table(
    flavour: str, fault_proxy: FaultProxy
) -> None:
    fault_proxy.set("error", operations={"CreateTable"})
    with pytest.raises(StoreUnavailable, match="create_table") as raised:
        _create_table(flavour, fault_proxy.url, f"edges-{uuid.uuid4().hex[:8]}")
    assert raised.value.code == "InternalServerError"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_create_table_accepts_ttl_enabled_by_another_replica_meanwhile(
    flavour: str, ttl_race_proxy: TTLRaceProxy, moto_endpoint: str
) -> None:
    table = f"edges-{uuid.uuid4().hex[:8]}"
    _create_table(flavour, ttl_race_proxy.url, table)

    ttl = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    described = ttl.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert described["TimeToLiveStatus"] == "ENABLED"
    operations = ttl_race_proxy.operations
    assert operations[-3:] == ["DescribeTimeToLive", "UpdateTimeToLive", "DescribeTimeToLive"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_create_table_reports_a_refused_ttl_update_when_ttl_stays_off(
    flavour: str, ttl_race_proxy: TTLRaceProxy
) -> None:
    ttl_race_proxy.other_replica_enables = False
    with pytest.raises(StoreUnavailable, match="update_time_to_live") as raised:
        _create_table(flavour, ttl_race_proxy.url, f"edges-{uuid.uuid4().hex[:8]}")
    assert raised.value.code == "ValidationException"


@pytest.mark.parametrize(
    "settings",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"connect_timeout": 0},
        {"read_timeout": -1.0},
        {"read_timeout": "2"},
        {"connect_timeout": True},
    ],
)
@pytest.mark.parametrize("store_class", [DynamoDBStore, AsyncDynamoDBStore])
def test_bad_connection_settings_are_refused_at_construction(
    store_class: type[DynamoDBStore] | type[AsyncDynamoDBStore], settings: dict[str, object]
) -> None:
    with pytest.raises(ValueError):
        store_class("table", region_name=REGION, **settings)  # type: ignore[arg-type]


def test_held_item_is_none_for_an_error_without_a_response() -> None:
    # A connection failure (no HTTP answer at all) carries no holder.
    assert held_item(ConnectionError("reset")) is None
    assert held_item(TypeError()) is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_create_table_reports_a_ttl_update_that_fails_outright(
    flavour: str, fault_proxy: FaultProxy
) -> None:
    fault_proxy.set("error", operations={"UpdateTimeToLive"})
    with pytest.raises(StoreUnavailable, match="update_time_to_live") as raised:
        _create_table(flavour, fault_proxy.url, f"edges-{uuid.uuid4().hex[:8]}")
    assert raised.value.code == "InternalServerError"
    assert fault_proxy.operations()[-1] == "UpdateTimeToLive"  # no second describe


def test_each_dynamodb_store_runs_its_flows_in_its_own_flavour_only() -> None:
    # The other flavour's methods are absent (the middlewares refuse the store by that), and
    # a flow handed to the other flavour's runner is refused before anything is sent.
    sync_store = DynamoDBStore("t", region_name=REGION)
    assert sync_store.aclaim is None and sync_store.aget is None
    with pytest.raises(TypeError, match="DynamoDBStore is sync: call its get"):
        asyncio.run(sync_store.arun_flow("get", sync_store._ops.get("k")))
    async_store = AsyncDynamoDBStore("t", region_name=REGION)
    assert async_store.claim is None and async_store.get is None
    with pytest.raises(TypeError, match="AsyncDynamoDBStore is async: await its aget"):
        async_store.run_flow("get", async_store._ops.get("k"))
    # Closing either way is safe (the async store's sync close releases closed loops' clients).
    asyncio.run(sync_store.aclose())
    async_store.close()
