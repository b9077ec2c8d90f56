"""``OpenTelemetry``: metrics and spans from a real uvicorn server and a real consumer, read
back with the SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyRule,
    IdempotentConsumer,
    SQLiteStore,
    idempotent,
)
from idempotency_middleware.observability import OpenTelemetry
from idempotency_middleware.web.asgi import ASGIApp, Receive, Scope, Send
from tests.support.servers import serve_asgi


class Telemetry:
    """An SDK tracer and meter provider, each read back in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.hook = OpenTelemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )
        self.tracer = self.tracer_provider.get_tracer("tests")

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for found in scope.metrics
            if found.name == metric
            for point in found.data.data_points
        ]

    def counts(self) -> dict[tuple[str, ...], int]:
        return {
            (
                p.attributes["idempotency.outcome"],
                p.attributes["idempotency.door"],
                p.attributes["idempotency.route"],
                p.attributes["idempotency.store"],
            ): p.value
            for p in self.points("idempotency.attempts")
        }

    def finished(self) -> tuple[ReadableSpan, ...]:
        return self.spans.get_finished_spans()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    yield telemetry
    telemetry.tracer_provider.shutdown()
    telemetry.meter_provider.shutdown()


def server_spans(telemetry: Telemetry, app: ASGIApp) -> ASGIApp:
    """A server span around each request, as the ASGI instrumentation opens one."""
    tracer = telemetry.tracer

    async def traced(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        with tracer.start_as_current_span(f"{scope['method']} request", kind=SpanKind.SERVER):
            await app(scope, receive, send)

    return traced


async def create_order(request: Request) -> JSONResponse:
    return JSONResponse({"order": request.path_params["order_id"]}, status_code=201)


def orders_app(telemetry: Telemetry, store: SQLiteStore) -> ASGIApp:
    app = Starlette(routes=[Route("/orders/{order_id}", create_order, methods=["POST"])])
    middleware = IdempotencyMiddleware(
        app,
        store=store,
        rules=[IdempotencyRule("/orders/{order_id}")],
        on_event=telemetry.hook,
    )
    return server_spans(telemetry, middleware)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(str(tmp_path / "idempotency.sqlite3")) as store:
        yield store


def test_a_served_request_counts_its_outcomes_by_door_route_and_store(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    key = f"key-{uuid.uuid4()}"
    with serve_asgi(orders_app(telemetry, store)) as url, httpx.Client(base_url=url) as client:
        assert client.post("/orders/7", headers={"Idempotency-Key": key}).status_code == 201
        assert client.post("/orders/7", headers={"Idempotency-Key": key}).status_code == 201

    route = "/orders/{order_id}"
    assert telemetry.counts() == {
        ("claimed", "http", route, "sqlite"): 1,
        ("completed", "http", route, "sqlite"): 1,
        ("replayed", "http", route, "sqlite"): 1,
    }


def test_a_served_request_marks_its_server_span_and_has_a_child_span_per_store_call(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    key = f"key-{uuid.uuid4()}"
    with serve_asgi(orders_app(telemetry, store)) as url, httpx.Client(base_url=url) as client:
        assert client.post("/orders/7", headers={"Idempotency-Key": key}).status_code == 201

    spans = telemetry.finished()
    (server,) = [span for span in spans if span.kind is SpanKind.SERVER]
    assert server.attributes is not None
    assert server.attributes["idempotency.outcome"] == "completed"
    key_hash = server.attributes["idempotency.key_hash"]
    assert isinstance(key_hash, str) and len(key_hash) >= 32
    children = [span for span in spans if span.parent is not None]
    assert [span.name for span in children] == ["idempotency claim", "idempotency complete"]
    for child in children:
        assert child.parent is not None and child.parent.span_id == server.context.span_id
        assert child.kind is SpanKind.CLIENT
        assert child.attributes is not None
        assert child.attributes["db.system.name"] == "sqlite"


def test_neither_the_key_nor_the_concrete_path_is_an_attribute(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    key = f"secret-key-{uuid.uuid4()}"
    with serve_asgi(orders_app(telemetry, store)) as url, httpx.Client(base_url=url) as client:
        assert client.post("/orders/8812", headers={"Idempotency-Key": key}).status_code == 201

    values = [
        str(value)
        for span in telemetry.finished()
        if span.name.startswith("idempotency") or span.kind is SpanKind.SERVER
        for value in (span.attributes or {}).values()
    ]
    values += [
        str(value)
        for metric in ("idempotency.attempts", "idempotency.store.duration")
        for point in telemetry.points(metric)
        for value in point.attributes.values()
    ]
    assert values
    assert not [value for value in values if key in value or "8812" in value]


def test_store_calls_are_timed_by_operation_and_store(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    with serve_asgi(orders_app(telemetry, store)) as url, httpx.Client(base_url=url) as client:
        headers = {"Idempotency-Key": f"key-{uuid.uuid4()}"}
        assert client.post("/orders/1", headers=headers).status_code == 201

    durations = {
        (p.attributes["idempotency.operation"], p.attributes["idempotency.store"]): p
        for p in telemetry.points("idempotency.store.duration")
    }
    assert set(durations) == {("claim", "sqlite"), ("complete", "sqlite")}
    assert all(p.count == 1 and p.sum > 0 for p in durations.values())
    assert all("error.type" not in p.attributes for p in durations.values())


async def test_a_consumer_marks_its_span_and_counts_as_a_consumer(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    async def ship(message: dict[str, str]) -> str:
        await asyncio.sleep(0)
        return f"shipped {message['id']}"

    consumer = IdempotentConsumer(
        ship, store=store, key=lambda message: message["id"], name="ship", on_event=telemetry.hook
    )
    message = {"id": f"message-{uuid.uuid4()}"}
    for _ in range(2):
        with telemetry.tracer.start_as_current_span("orders process", kind=SpanKind.CONSUMER):
            assert (await consumer.aprocess(message)).action == "ack"

    assert telemetry.counts() == {
        ("claimed", "consumer", "ship", "sqlite"): 1,
        ("completed", "consumer", "ship", "sqlite"): 1,
        ("replayed", "consumer", "ship", "sqlite"): 1,
    }
    spans = telemetry.finished()
    consumed = [span for span in spans if span.kind is SpanKind.CONSUMER]
    assert [(span.attributes or {}).get("idempotency.outcome") for span in consumed] == [
        "completed",
        "replayed",
    ]
    assert [span.name for span in spans if span.kind is SpanKind.CLIENT] == [
        "idempotency claim",
        "idempotency complete",
        "idempotency claim",
    ]


def test_a_function_counts_as_a_function_under_its_name(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    @idempotent(store=store, key=lambda order: order, name="charge", on_event=telemetry.hook)
    def charge(order: str) -> str:
        return order

    charge("order-1")
    assert telemetry.counts() == {
        ("claimed", "function", "charge", "sqlite"): 1,
        ("completed", "function", "charge", "sqlite"): 1,
    }


def test_store_calls_outside_any_span_make_no_span_but_are_timed(
    telemetry: Telemetry, store: SQLiteStore
) -> None:
    @idempotent(store=store, key=lambda order: order, name="charge", on_event=telemetry.hook)
    def charge(order: str) -> str:
        return order

    charge("order-1")
    assert telemetry.finished() == ()
    assert len(telemetry.points("idempotency.store.duration")) == 2
