"""The store author's kit: ``ThreadedStore`` derives a blocking store's async half, every store
takes an injected clock, and the DynamoDB claim survives a backend that returns no ``ALL_OLD``
item on a failed condition.

The DynamoDB cases go over the wire through ``AnswerRewritingProxy``, a small HTTP proxy on
127.0.0.1 in front of moto that changes moto's answers the way another DynamoDB
implementation could (no ``Item`` on ``ConditionalCheckFailedException``, a table still
``CREATING``).
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import boto3
import orjson
import pytest

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore, MemoryStore, SQLiteStore
from idempotency_middleware.stores import (
    CLAIMED,
    SYSTEM_CLOCK,
    AsyncOperations,
    AsyncStore,
    Claimed,
    ClaimRequest,
    ClaimResult,
    Completion,
    Held,
    StoreUnavailable,
    ThreadedStore,
)
from idempotency_middleware.stores.records import Record, Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION
from tests.support.servers import HOST, BackgroundHTTPServer

CONDITION_FAILED_BODY = orjson.dumps(
    {
        "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
        "message": "The conditional request failed",
    }
)
# Hop-by-hop or describing the original body: the proxy sets its own.
_NOT_COPIED = {"content-length", "connection", "transfer-encoding", "keep-alive", "x-amz-crc32"}


class AnswerRewritingProxy(BackgroundHTTPServer):
    """Forwards DynamoDB requests to moto and rewrites some answers, as switched by the test.

    - ``strip_held_item``: a failed conditional write comes back without its ``Item``.
    - ``on_condition_failed``: called before such an answer is sent (another writer acting
      between the failed put and the claim's fallback read).
    - ``refuse_every_put``: every PutItem fails its condition at once, without an ``Item``.
    - ``creating_answers``: that many DescribeTable answers say ``CREATING``.

    ``operations`` lists every operation that reached the proxy, in order.
    """

    def __init__(self, upstream_url: str) -> None:
        upstream = urlsplit(upstream_url)
        assert upstream.hostname == HOST and upstream.port is not None
        self._upstream = (upstream.hostname, upstream.port)
        self.strip_held_item = False
        self.on_condition_failed: Callable[[], None] | None = None
        self.refuse_every_put = False
        self.creating_answers = 0
        self.operations: list[str] = []
        self._lock = threading.Lock()
        super().__init__(self._handler_class())

    def _answer(
        self, operation: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        with self._lock:
            self.operations.append(operation)
            refuse = self.refuse_every_put and operation == "PutItem"
        if refuse:
            return 400, [("Content-Type", "application/x-amz-json-1.0")], CONDITION_FAILED_BODY
        connection = http.client.HTTPConnection(*self._upstream, timeout=10)
        try:
            connection.request("POST", "/", body=body, headers=headers)
            response = connection.getresponse()
            status, answer = response.status, response.read()
            copied = [(k, v) for k, v in response.getheaders() if k.lower() not in _NOT_COPIED]
        finally:
            connection.close()
        return status, copied, self._rewrite(operation, status, answer)

    def _rewrite(self, operation: str, status: int, answer: bytes) -> bytes:
        document = orjson.loads(answer) if answer else {}
        error_type = str(document.get("__type", ""))
        if status == 400 and error_type.endswith("ConditionalCheckFailedException"):
            if self.strip_held_item:
                document.pop("Item", None)
                if self.on_condition_failed is not None:
                    self.on_condition_failed()
            return orjson.dumps(document)
        if operation == "DescribeTable" and status == 200:
            with self._lock:
                creating = self.creating_answers > 0
                self.creating_answers -= creating
            if creating:
                document["Table"]["TableStatus"] = "CREATING"
                return orjson.dumps(document)
        return answer

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pools expect

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                operation = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                status, copied, answer = proxy._answer(operation, body, headers)
                self.send_response(status)
                for name, value in copied:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: pytest shows failures, not every request

        return Handler


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[AnswerRewritingProxy]:
    with AnswerRewritingProxy(moto_endpoint) as running:
        yield running


FLAVOURS = ["sync", "async"]


def claim_through(flavour: str, endpoint: str, table: str, request: ClaimRequest) -> ClaimResult:
    """One claim by a fresh DynamoDB store of ``flavour`` on ``endpoint``."""
    if flavour == "sync":
        with DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION) as store:
            return store.claim(request)

    async def claim() -> ClaimResult:
        async with AsyncDynamoDBStore(table, endpoint_url=endpoint, region_name=REGION) as store:
            return await store.aclaim(request)

    return asyncio.run(claim())


def create_table_through(
    flavour: str, endpoint: str, table: str, clock: FakeClock, wait_seconds: float
) -> None:
    """``create_table`` by a fresh DynamoDB store of ``flavour`` timed by ``clock``."""
    if flavour == "sync":
        with DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION, clock=clock) as store:
            store.create_table(wait_seconds=wait_seconds)
            return

    async def create() -> None:
        async with AsyncDynamoDBStore(
            table, endpoint_url=endpoint, region_name=REGION, clock=clock
        ) as store:
            await store.acreate_table(wait_seconds=wait_seconds)

    asyncio.run(create())


def request_for(key_hash: str, *, lock: float = 30.0, now: float | None = None) -> ClaimRequest:
    return ClaimRequest(key_hash, "fp", uuid.uuid4().hex, time.time() if now is None else now, lock)


# --- the DynamoDB claim's fallback read -------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_claim_reads_the_holder_when_a_failed_put_returns_no_item(
    flavour: str, proxy: AnswerRewritingProxy, moto_endpoint: str, dynamodb_table: str
) -> None:
    key_hash = uuid.uuid4().hex
    holder = request_for(key_hash)
    assert claim_through(flavour, moto_endpoint, dynamodb_table, holder) == CLAIMED
    proxy.strip_held_item = True

    held = claim_through(flavour, proxy.url, dynamodb_table, request_for(key_hash))

    assert isinstance(held, Held)
    assert held.record.owner == holder.owner
    assert held.record.status is Status.IN_PROGRESS
    assert proxy.operations == ["PutItem", "GetItem"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_claim_tries_again_when_the_holder_is_gone_by_the_fallback_read(
    flavour: str, proxy: AnswerRewritingProxy, moto_endpoint: str, dynamodb_table: str
) -> None:
    key_hash = uuid.uuid4().hex
    holder = request_for(key_hash)
    assert claim_through(flavour, moto_endpoint, dynamodb_table, holder) == CLAIMED
    direct = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)

    def holder_releases() -> None:
        proxy.on_condition_failed = None
        direct.delete_item(TableName=dynamodb_table, Key={"pk": {"S": key_hash}})

    proxy.strip_held_item = True
    proxy.on_condition_failed = holder_releases
    claimer = request_for(key_hash)

    assert claim_through(flavour, proxy.url, dynamodb_table, claimer) == Claimed(taken_over=False)
    assert proxy.operations == ["PutItem", "GetItem", "PutItem"]
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        record = store.get(key_hash)
    assert record is not None and record.owner == claimer.owner


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_claim_that_keeps_losing_without_a_holder_answers_store_unavailable(
    flavour: str, proxy: AnswerRewritingProxy, dynamodb_table: str
) -> None:
    proxy.refuse_every_put = True

    with pytest.raises(StoreUnavailable, match="racing"):
        claim_through(flavour, proxy.url, dynamodb_table, request_for(uuid.uuid4().hex))

    assert proxy.operations == ["PutItem", "GetItem"] * 3


# --- an injected clock ------------------------------------------------------------------


@pytest.mark.parametrize(
    "store_class", [MemoryStore, SQLiteStore, DynamoDBStore, AsyncDynamoDBStore]
)
def test_every_store_takes_a_keyword_only_clock_defaulting_to_the_system_clock(
    store_class: type[object],
) -> None:
    clock = inspect.signature(store_class).parameters["clock"]
    assert clock.kind is inspect.Parameter.KEYWORD_ONLY
    assert clock.default is SYSTEM_CLOCK


def test_memory_store_times_its_first_purge_by_its_clock() -> None:
    clock = FakeClock()
    store = MemoryStore(purge_interval_seconds=60, clock=clock)
    start = clock.now()
    store.claim(request_for("lapsed", lock=1, now=start))
    store.claim(request_for("trigger-1", now=start + 59))
    assert store.get("lapsed") is not None  # the first purge is not due yet
    store.claim(request_for("trigger-2", now=start + 61))
    assert store.get("lapsed") is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_create_table_waits_for_active_on_the_stores_clock(
    flavour: str, proxy: AnswerRewritingProxy
) -> None:
    proxy.creating_answers = 2
    clock = FakeClock()
    create_table_through(flavour, proxy.url, f"idem-{uuid.uuid4().hex[:10]}", clock, 60)
    assert clock.slept == [0.5, 0.5]
    assert proxy.operations.count("DescribeTable") == 3


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_create_table_gives_up_after_its_wait_on_the_stores_clock(
    flavour: str, proxy: AnswerRewritingProxy
) -> None:
    proxy.creating_answers = 1_000_000
    clock = FakeClock()
    start = clock.now()
    with pytest.raises(StoreUnavailable, match="did not become ACTIVE"):
        create_table_through(flavour, proxy.url, f"idem-{uuid.uuid4().hex[:10]}", clock, 5)
    assert clock.now() - start > 5
    # The wait went through the store's clock, not real sleeps (a wall-clock bound here
    # failed on a loaded machine, where the polls through the proxy alone took 5 s).
    assert sum(clock.slept) > 5


# --- ThreadedStore ----------------------------------------------------------------------


class BlockingDictStore(ThreadedStore):
    """The smallest store on ``ThreadedStore``: a dict, noting which thread runs each call."""

    def __init__(self) -> None:
        super().__init__(async_threads=2, thread_name_prefix="kit-test")
        self.records: dict[str, Record] = {}
        self.threads: dict[str, str] = {}

    def _note(self, operation: str) -> None:
        self.threads[operation] = threading.current_thread().name

    def claim(self, request: ClaimRequest) -> ClaimResult:
        self._note("claim")
        if request.key_hash == "unreachable":
            raise StoreUnavailable("the backend is down")
        existing = self.records.get(request.key_hash)
        if existing is not None:
            return Held(existing)
        self.records[request.key_hash] = Record(
            request.key_hash,
            Status.IN_PROGRESS,
            request.fingerprint,
            request.owner,
            request.lock_expires_at,
            request.expires_at,
        )
        return CLAIMED

    def complete(self, completion: Completion) -> bool:
        self._note("complete")
        return completion.key_hash in self.records

    def release(self, key_hash: str, owner: str) -> bool:
        self._note("release")
        return self.records.pop(key_hash, None) is not None

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        self._note("renew")
        return key_hash in self.records

    def get(self, key_hash: str) -> Record | None:
        self._note("get")
        return self.records.get(key_hash)

    def delete(self, key_hash: str) -> bool:
        self._note("delete")
        return self.records.pop(key_hash, None) is not None

    def create_table(self) -> None:
        self._note("create_table")


async def test_threaded_store_runs_every_async_method_on_its_threads_off_the_loop() -> None:
    async with BlockingDictStore() as store:
        assert isinstance(store, AsyncStore) and isinstance(store, AsyncOperations)
        request = request_for("k")
        assert await store.aclaim(request) == CLAIMED
        assert await store.arenew("k", request.owner, time.time() + 60) is True
        completion = Completion("k", request.owner, time.time(), 60, StoredResponse(200, [], b""))
        assert await store.acomplete(completion) is True
        assert await store.aget("k") is not None
        assert await store.arelease("k", request.owner) is True
        assert await store.adelete("k") is False
        await store.acreate_table()
    loop_thread = threading.current_thread().name
    assert set(store.threads) == {
        "claim",
        "renew",
        "complete",
        "get",
        "release",
        "delete",
        "create_table",
    }
    assert all(name.startswith("kit-test") for name in store.threads.values()), store.threads
    assert loop_thread not in store.threads.values()


async def test_threaded_store_raises_the_sync_methods_errors_from_the_async_ones() -> None:
    async with BlockingDictStore() as store:
        with pytest.raises(StoreUnavailable, match="the backend is down"):
            await store.aclaim(request_for("unreachable"))


async def test_a_threaded_store_without_deferral_says_so_from_the_async_forms() -> None:
    # A store that does not override complete_deferred / release_deferred supports no
    # deferred completion: its async forms raise the same, from its threads.
    async with BlockingDictStore() as store:
        with pytest.raises(NotImplementedError, match="BlockingDictStore does not support"):
            await store.acomplete_deferred("token", 200)
        with pytest.raises(NotImplementedError, match="BlockingDictStore does not support"):
            await store.arelease_deferred("token")


def test_threaded_store_refuses_a_store_missing_a_sync_method() -> None:
    written = ("claim", "complete", "release", "get", "delete", "create_table")
    without_renew = type(
        "WithoutRenew",
        (ThreadedStore,),
        {name: getattr(BlockingDictStore, name) for name in written},
    )
    with pytest.raises(TypeError, match="renew"):
        without_renew()
