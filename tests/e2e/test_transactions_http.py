"""Exactly-once business writes over HTTP: handlers add DynamoDB writes to
``completion_transaction()`` and the middleware commits them with the completion record in
one ``TransactWriteItems``, on real servers (uvicorn with ``AsyncDynamoDBStore`` behind
``IdempotencyMiddleware``, waitress with ``DynamoDBStore`` behind
``IdempotencyWSGIMiddleware``), httpx clients, and two DynamoDB implementations: moto's
server and Amazon's DynamoDB Local (ids containing ``dynamodb-local``, run by
``scripts/dynamodb-local.sh``, skipped otherwise).

Each adapter/backend pair shares one server for the module (through a ``FaultProxy`` left
in ``pass`` mode but for the outage tests); every test uses its own keys and skus. The
takeover test starts its own server, on a ``FakeClock``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
)
from idempotency_middleware.engine.decisions import FINISH_ATTEMPTS
from idempotency_middleware.testing import FakeClock
from tests.support.faultproxy import FaultProxy
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi, serve_wsgi
from tests.support.transaction_apps import (
    ORDERS,
    ORDERS_500,
    ORDERS_GATED,
    ORDERS_RAISE,
    ORDERS_STREAM,
    ORDERS_STREAM_CUT,
    ORDERS_SYNC,
    PROBE,
    STREAM_END,
    TransactionAppState,
    build_fastapi_app,
    build_flask_app,
)
from tests.support.transaction_tables import REGION, BusinessTables, create_business_tables

Adapter = Literal["asgi", "wsgi"]
Backend = Literal["moto", "dynamodb-local"]

HEADER = "Idempotency-Key"
PROBLEM_JSON = "application/problem+json"
# Long enough that no lease renewal fires while a test runs (the takeover test moves its
# FakeClock past it instead).
LOCK_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class Combo:
    adapter: Adapter
    backend: Backend

    @property
    def id(self) -> str:
        return f"{self.adapter}-{self.backend}"


COMBOS = tuple(
    Combo(adapter, backend)
    for backend in ("moto", "dynamodb-local")
    for adapter in ("asgi", "wsgi")
)


def new_key() -> str:
    return f"txn-{uuid.uuid4()}"


def order(sku: str, qty: int, order_id: str | None = None) -> bytes:
    document: dict[str, Any] = {"sku": sku, "qty": qty}
    if order_id is not None:
        document["id"] = order_id
    return orjson.dumps(document)


def post(client: httpx.Client, path: str, key: str | None, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers[HEADER] = key
    return client.post(path, content=body, headers=headers)


def replayed(response: httpx.Response) -> bool:
    marker: str | None = response.headers.get("idempotent-replayed")
    return marker == "true"


def problem(response: httpx.Response) -> dict[str, Any]:
    """The problem document of ``response``, after checking its media type."""
    assert response.headers["content-type"] == PROBLEM_JSON, response.text
    document: dict[str, Any] = response.json()
    return document


# -- servers -------------------------------------------------------------------------------


@contextlib.contextmanager
def serve_dynamodb(
    adapter: Adapter, state: TransactionAppState, endpoint: str, table: str, **options: Any
) -> Iterator[str]:
    """The adapter's app behind its middleware, with the adapter's DynamoDB store on
    ``endpoint``; the server's URL."""
    options.setdefault("lock_timeout_seconds", LOCK_TIMEOUT_SECONDS)
    # The deployment outlives its tests, some of which refuse every commit for the seconds a
    # completion is retried: a circuit breaker opened by one would refuse the next tests'
    # claims (the breaker has tests of its own).
    threshold = 1_000
    if adapter == "asgi":
        store = AsyncDynamoDBStore(
            table, endpoint_url=endpoint, region_name=REGION, breaker_threshold=threshold
        )
        app = IdempotencyMiddleware(build_fastapi_app(state), store=store, **options)
        # The store's client belongs to uvicorn's loop: closed there.
        with serve_asgi(app, on_shutdown=store.aclose) as url:
            yield url
        return
    with DynamoDBStore(
        table, endpoint_url=endpoint, region_name=REGION, breaker_threshold=threshold
    ) as sync_store:
        flask_app = build_flask_app(state)
        middleware = IdempotencyWSGIMiddleware(flask_app.wsgi_app, store=sync_store, **options)
        flask_app.wsgi_app = middleware  # type: ignore[method-assign]
        try:
            with serve_wsgi(flask_app) as url:
                yield url
        finally:
            middleware.close()


def http_client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False)


@dataclass
class Deployment:
    """One adapter/backend pair: the business tables, the idempotency table, the proxy in
    front of DynamoDB, and the server (its store on the proxy)."""

    combo: Combo
    endpoint: str  # DynamoDB itself
    table: str  # the idempotency table
    tables: BusinessTables
    state: TransactionAppState
    proxy: FaultProxy
    client: httpx.Client

    @property
    def adapter(self) -> Adapter:
        return self.combo.adapter

    def post(self, path: str, key: str | None, body: bytes) -> httpx.Response:
        return post(self.client, path, key, body)

    def stocked(self, count: int) -> str:
        """A new sku with ``count`` in stock."""
        sku = f"sku-{uuid.uuid4().hex[:12]}"
        self.tables.set_stock(sku, count)
        return sku

    def orders_of(self, sku: str) -> list[dict[str, Any]]:
        return [item for item in self.tables.orders() if item["sku"] == sku]


def new_idempotency_table(endpoint: str) -> str:
    name = f"idem-txn-{uuid.uuid4().hex[:12]}"
    with DynamoDBStore(name, endpoint_url=endpoint, region_name=REGION) as store:
        store.create_table()
    return name


@pytest.fixture(scope="module", params=COMBOS, ids=lambda combo: combo.id)
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    combo: Combo = request.param
    fixture = "moto_endpoint" if combo.backend == "moto" else "dynamodb_local_endpoint"
    endpoint: str = request.getfixturevalue(fixture)
    table = new_idempotency_table(endpoint)
    with (
        create_business_tables(endpoint, prefix="txn") as tables,
        FaultProxy(endpoint) as proxy,
    ):
        state = TransactionAppState(tables.orders_table, tables.inventory_table)
        with (
            serve_dynamodb(combo.adapter, state, proxy.url, table) as url,
            http_client(url) as client,
        ):
            yield Deployment(combo, endpoint, table, tables, state, proxy, client)


@pytest.fixture
def proxy(deployment: Deployment) -> Iterator[FaultProxy]:
    """The deployment's proxy, put back in ``pass`` mode (and forgetful) after the test."""
    deployment.proxy.forget()
    try:
        yield deployment.proxy
    finally:
        deployment.proxy.set("pass")
        deployment.proxy.forget()


# -- 1. success --------------------------------------------------------------------------


@pytest.mark.parametrize("path", [ORDERS, ORDERS_SYNC])
def test_writes_land_once_and_a_retry_replays_them_without_writing(
    deployment: Deployment, path: str
) -> None:
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2)
    runs = deployment.state.runs(path)

    first = deployment.post(path, key, body)

    assert first.status_code == 201, first.text
    assert not replayed(first)
    document = first.json()
    # FastAPI runs a sync route in its thread pool: the attempt followed the request there.
    assert document["in_loop"] is (deployment.adapter == "asgi" and path == ORDERS)
    assert [item["id"] for item in deployment.orders_of(sku)] == [document["id"]]
    assert deployment.orders_of(sku)[0]["run"] == document["run"]
    assert deployment.tables.stock(sku) == 3

    retry = deployment.post(path, key, body)

    assert retry.status_code == 201
    assert replayed(retry)
    assert retry.content == first.content
    assert retry.headers["content-type"] == first.headers["content-type"]
    assert deployment.state.runs(path) == runs + 1
    assert len(deployment.orders_of(sku)) == 1
    assert deployment.tables.stock(sku) == 3


# -- 2. a business condition fails -------------------------------------------------------


def test_failed_stock_condition_writes_nothing_answers_409_and_releases_the_key(
    deployment: Deployment,
) -> None:
    sku = deployment.stocked(1)
    order_id = f"order-{uuid.uuid4().hex}"
    key = new_key()
    body = order(sku, 2, order_id)

    refused = deployment.post(ORDERS, key, body)

    assert refused.status_code == 409, refused.text
    document = problem(refused)
    assert document["type"].endswith("transaction-conflict")
    assert document["status"] == 409
    assert document["position"] == 1  # the inventory update, the second write
    assert document["reason"] == "ConditionalCheckFailed"
    assert set(document) == {"type", "title", "status", "detail", "position", "reason"}
    assert sku not in refused.text and order_id not in refused.text
    assert deployment.orders_of(sku) == []
    assert deployment.tables.stock(sku) == 1

    deployment.tables.set_stock(sku, 5)
    runs = deployment.state.runs(ORDERS)
    retried = deployment.post(ORDERS, key, body)

    assert retried.status_code == 201, retried.text
    assert not replayed(retried)
    assert deployment.state.runs(ORDERS) == runs + 1
    assert [item["id"] for item in deployment.orders_of(sku)] == [order_id]
    assert deployment.tables.stock(sku) == 3


# -- 3. taken over before the commit -------------------------------------------------------


def test_owner_taken_over_before_its_commit_writes_nothing_and_answers_409(
    deployment: Deployment,
) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    # Its own server: its own clock, and no lease renewal can run while the test does.
    state = TransactionAppState(deployment.tables.orders_table, deployment.tables.inventory_table)
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2, f"order-{uuid.uuid4().hex}")
    with (
        serve_dynamodb(
            deployment.adapter, state, deployment.endpoint, deployment.table, clock=clock
        ) as url,
        http_client(url) as client,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        gate = state.arm_gate()
        try:
            first = pool.submit(post, client, ORDERS_GATED, key, body)
            state.wait_at_gate(1)  # the first holds the key, its writes added, not committed
            clock.advance(LOCK_TIMEOUT_SECONDS + 1)

            second = post(client, ORDERS_GATED, key, body)

            assert second.status_code == 201, second.text
            assert second.json()["run"] == 2
        finally:
            gate.set()
        late = first.result(timeout=CLIENT_TIMEOUT_SECONDS)
        replay = post(client, ORDERS_GATED, key, body)

    assert late.status_code == 409, late.text
    assert problem(late)["type"].endswith("key-in-progress")
    assert int(late.headers["retry-after"]) >= 1
    orders = deployment.orders_of(sku)
    assert [item["run"] for item in orders] == [2]  # the second's writes, once
    assert deployment.tables.stock(sku) == 3
    assert replay.status_code == 201 and replayed(replay)
    assert replay.content == second.content


# -- 4. the store unreachable at the commit ---------------------------------------------------


def commit_faults(proxy: FaultProxy) -> list[str]:
    return [seen.fault for seen in proxy.seen() if seen.operation == "TransactWriteItems"]


def test_commit_never_answered_is_503_and_writes_nothing(
    deployment: Deployment, proxy: FaultProxy
) -> None:
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2)
    proxy.set("refuse", operations={"TransactWriteItems"})

    unavailable = deployment.post(ORDERS, key, body)

    assert unavailable.status_code == 503, unavailable.text
    document = problem(unavailable)
    assert document["type"].endswith("store-unavailable")
    assert "whole or not at all" in document["detail"]
    assert int(unavailable.headers["retry-after"]) >= 1
    assert "PutItem" in proxy.operations()  # the claim went through
    faults = commit_faults(proxy)
    assert len(faults) >= FINISH_ATTEMPTS and set(faults) == {"refuse"}
    assert deployment.orders_of(sku) == []
    assert deployment.tables.stock(sku) == 5

    # The commit's outcome was unknown: the key stays claimed until its lock timeout.
    proxy.set("pass")
    held = deployment.post(ORDERS, key, body)
    assert held.status_code == 409
    assert problem(held)["type"].endswith("key-in-progress")


def test_commit_whose_answer_is_lost_is_retried_and_lands_once(
    deployment: Deployment, proxy: FaultProxy
) -> None:
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2)
    proxy.set("cut", operations={"TransactWriteItems"}, count=1)

    created = deployment.post(ORDERS, key, body)

    assert created.status_code == 201, created.text
    assert commit_faults(proxy) == ["cut", "pass"]  # landed, answer lost; re-sent
    assert [item["id"] for item in deployment.orders_of(sku)] == [created.json()["id"]]
    assert deployment.tables.stock(sku) == 3
    replay = deployment.post(ORDERS, key, body)
    assert replay.status_code == 201 and replayed(replay)
    assert replay.content == created.content


# -- 5. the handler failed after adding writes ----------------------------------------------


@pytest.mark.parametrize("path", [ORDERS_RAISE, ORDERS_500])
def test_failed_handler_writes_nothing_and_releases_the_key(
    deployment: Deployment, path: str
) -> None:
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2)
    runs = deployment.state.runs(path)

    failed = deployment.post(path, key, body)
    again = deployment.post(path, key, body)

    assert failed.status_code == 500
    assert again.status_code == 500
    assert not replayed(again)
    assert deployment.state.runs(path) == runs + 2  # released: the retry ran it again
    assert deployment.orders_of(sku) == []
    assert deployment.tables.stock(sku) == 5


# -- 6. a streaming media type with writes ------------------------------------------------------


def test_event_stream_with_writes_is_held_sent_whole_stored_and_replayed(
    deployment: Deployment,
) -> None:
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2)
    runs = deployment.state.runs(ORDERS_STREAM)

    first = deployment.post(ORDERS_STREAM, key, body)

    assert first.status_code == 200, first.text
    assert first.headers["content-type"].startswith("text/event-stream")
    assert first.content.endswith(STREAM_END)
    assert [item["id"] for item in deployment.orders_of(sku)] == [
        orjson.loads(first.content.split(b"\n\n")[0].removeprefix(b"data: "))["id"]
    ]
    assert deployment.tables.stock(sku) == 3

    retry = deployment.post(ORDERS_STREAM, key, body)

    assert retry.status_code == 200
    assert replayed(retry)
    assert retry.content == first.content
    assert deployment.state.runs(ORDERS_STREAM) == runs + 1
    assert deployment.tables.stock(sku) == 3


def test_event_stream_with_writes_that_never_finishes_is_cut_writes_nothing_and_runs_again(
    deployment: Deployment,
) -> None:
    sku = deployment.stocked(5)
    key = new_key()
    body = order(sku, 2)
    runs = deployment.state.runs(ORDERS_STREAM_CUT)

    for _ in range(2):
        # Held for its writes, it failed midway: the client sees the cut a server makes
        # of a stream failing after its first event, not a whole response.
        with pytest.raises(httpx.RemoteProtocolError):
            deployment.post(ORDERS_STREAM_CUT, key, body)

    assert deployment.state.runs(ORDERS_STREAM_CUT) == runs + 2  # released: run again
    assert deployment.orders_of(sku) == []
    assert deployment.tables.stock(sku) == 5


def test_event_stream_held_for_its_writes_is_sent_with_its_length(
    deployment: Deployment,
) -> None:
    sku = deployment.stocked(5)

    sent = deployment.post(ORDERS_STREAM, new_key(), order(sku, 1))

    assert sent.status_code == 200, sent.text
    assert sent.content.endswith(STREAM_END)
    assert sent.headers.get("content-length") == str(len(sent.content))
    assert "transfer-encoding" not in sent.headers


# -- 7. no key ----------------------------------------------------------------------------------


def test_request_without_a_key_sees_lookup_error(deployment: Deployment) -> None:
    answer = deployment.post(PROBE, None, b"{}")

    assert answer.status_code == 200
    assert answer.json()["error"] == "LookupError"


def test_request_with_a_key_gets_the_attempts_transaction(deployment: Deployment) -> None:
    answer = deployment.post(PROBE, new_key(), b"{}")

    assert answer.status_code == 200
    assert answer.json() == {"error": None, "writes": 0}


# -- 8. not a DynamoDB store ----------------------------------------------------------------


@contextlib.contextmanager
def serve_memory(adapter: Adapter, state: TransactionAppState) -> Iterator[str]:
    store = MemoryStore()
    if adapter == "asgi":
        with serve_asgi(IdempotencyMiddleware(build_fastapi_app(state), store=store)) as url:
            yield url
        return
    flask_app = build_flask_app(state)
    middleware = IdempotencyWSGIMiddleware(flask_app.wsgi_app, store=store)
    flask_app.wsgi_app = middleware  # type: ignore[method-assign]
    try:
        with serve_wsgi(flask_app) as url:
            yield url
    finally:
        middleware.close()


@pytest.mark.parametrize("adapter", ["asgi", "wsgi"])
def test_memory_store_makes_completion_transaction_raise_type_error(adapter: Adapter) -> None:
    state = TransactionAppState("orders", "inventory")
    with serve_memory(adapter, state) as url, http_client(url) as client:
        probed = post(client, PROBE, new_key(), b"{}")
        ordered = post(client, ORDERS_SYNC, new_key(), order("sku-1", 1))

    assert probed.status_code == 200
    assert probed.json()["error"] == "TypeError"
    assert "DynamoDB store" in probed.json()["message"]
    assert ordered.status_code == 500  # the TypeError left the handler: nothing was kept
