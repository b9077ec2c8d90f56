"""``Prometheus``: the metrics scraped over HTTP from a running app, and the number of series
bounded however many paths and keys the requests carry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import Message

from benchmarks._common import http_scope
from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyRule,
    MemoryStore,
    RedisStore,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.events import EventHook
from idempotency_middleware.observability import OpenTelemetry, Prometheus
from idempotency_middleware.web.asgi import ASGIApp
from tests.support.servers import serve_asgi


async def create(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path}, status_code=201)


def app_with_metrics(registry: CollectorRegistry, store: MemoryStore) -> ASGIApp:
    app = Starlette(
        routes=[
            Mount("/metrics", make_asgi_app(registry)),
            Route("/orders/{order_id}", create, methods=["POST"]),
            Route("/misc/{name}", create, methods=["POST"]),
        ]
    )
    return IdempotencyMiddleware(
        app,
        store=store,
        rules=[IdempotencyRule("/orders/{order_id}")],
        on_event=Prometheus(registry=registry),
    )


def scrape(client: httpx.Client) -> list[Sample]:
    response = client.get("/metrics/")
    assert response.status_code == 200
    return [
        sample
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name.startswith("idempotency_")
    ]


def test_a_running_app_serves_its_idempotency_metrics_over_http() -> None:
    registry = CollectorRegistry()
    key = f"key-{uuid.uuid4()}"
    app = app_with_metrics(registry, MemoryStore())
    with serve_asgi(app) as url, httpx.Client(base_url=url) as client:
        for _ in range(2):
            assert client.post("/orders/5", headers={"Idempotency-Key": key}).status_code == 201
        samples = scrape(client)

    attempts = {
        (s.labels["outcome"], s.labels["door"], s.labels["route"], s.labels["store"]): s.value
        for s in samples
        if s.name == "idempotency_attempts_total"
    }
    route = "/orders/{order_id}"
    assert attempts == {
        ("claimed", "http", route, "memory"): 1.0,
        ("completed", "http", route, "memory"): 1.0,
        ("replayed", "http", route, "memory"): 1.0,
    }
    calls = {
        (s.labels["operation"], s.labels["store"], s.labels["error_type"]): s.value
        for s in samples
        if s.name == "idempotency_store_duration_seconds_count"
    }
    assert calls == {("claim", "memory", ""): 2.0, ("complete", "memory", ""): 1.0}
    breaker = [s for s in samples if s.name == "idempotency_breaker_open"]
    assert [(s.labels, s.value) for s in breaker] == [({"store": "memory"}, 0.0)]


def test_a_path_no_rule_matches_is_labelled_unmatched() -> None:
    registry = CollectorRegistry()
    app = app_with_metrics(registry, MemoryStore())
    with serve_asgi(app) as url, httpx.Client(base_url=url) as client:
        headers = {"Idempotency-Key": f"key-{uuid.uuid4()}"}
        assert client.post("/misc/secret-name", headers=headers).status_code == 201
        samples = scrape(client)

    routes = {s.labels["route"] for s in samples if s.name == "idempotency_attempts_total"}
    assert routes == {"unmatched"}


async def post_in_process(app: ASGIApp, path: str, key: str) -> int:
    """POST ``path`` with an empty body and ``key`` to ``app`` over raw ASGI: its status."""
    scope = http_scope([(b"host", b"test"), (b"idempotency-key", key.encode())], path)
    sent: list[Message] = []
    received = False

    async def receive() -> Message:
        nonlocal received
        if received:
            raise AssertionError("the app asked for more than the request (its response is sent)")
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent[-1]["type"] == "http.response.body"
    status: int = sent[0]["status"]
    return status


def samples_of(registry: CollectorRegistry) -> list[Sample]:
    return [sample for family in registry.collect() for sample in family.samples]


def series(samples: list[Sample]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for s in samples}


async def test_ten_thousand_paths_and_keys_give_a_bounded_number_of_series() -> None:
    registry = CollectorRegistry()
    telemetry_reader = pytest.importorskip("opentelemetry.sdk.metrics.export")
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    reader = telemetry_reader.InMemoryMetricReader()
    meter_provider = sdk_metrics.MeterProvider(metric_readers=[reader])
    store = MemoryStore()
    app = Starlette(
        routes=[
            Route("/orders/{order_id}", create, methods=["POST"]),
            Route("/misc/{name}", create, methods=["POST"]),
        ]
    )
    hooks: list[EventHook] = [
        Prometheus(registry=registry),
        OpenTelemetry(meter_provider=meter_provider),
    ]
    served = IdempotencyMiddleware(
        app, store=store, rules=[IdempotencyRule("/orders/{order_id}")], on_event=hooks
    )
    # Raw ASGI calls, in process: an HTTP client's own work would be most of the test's time.
    for number in range(10_000):
        path = f"/orders/{number}" if number % 2 else f"/misc/{number}"
        assert await post_in_process(served, path, f"key-{number}") == 201

    samples = samples_of(registry)
    labels = {value for s in samples for value in s.labels.values()}
    assert labels <= {
        "claimed",
        "completed",
        "http",
        "/orders/{order_id}",
        "unmatched",
        "memory",
        "claim",
        "complete",
        "",
    } | {value for s in samples for key, value in s.labels.items() if key == "le"}
    attempts = [s for s in samples if s.name == "idempotency_attempts_total"]
    assert len(attempts) == 4  # claimed and completed, on the rule's route and unmatched
    assert sum(s.value for s in attempts) == 20_000
    assert len(series(samples)) < 100
    meter_provider.force_flush()
    data = reader.get_metrics_data()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]
    assert len(points) <= 8  # 4 attempt series, 2 store-call series, the breaker gauge
    meter_provider.shutdown()


@pytest.fixture
def down_redis() -> Iterator[RedisStore]:
    # A closed port: every call fails at once as unreachable; one failure opens the breaker.
    store = RedisStore(
        "redis://127.0.0.1:1/0",
        socket_connect_timeout=1.0,
        retries=0,
        breaker_threshold=1,
        breaker_cooldown_seconds=60,
    )
    yield store
    store.close()


def test_a_failing_store_shows_in_its_call_errors_and_its_breaker_gauge(
    down_redis: RedisStore,
) -> None:
    registry = CollectorRegistry()

    @idempotent(store=down_redis, key=lambda order: order, on_event=Prometheus(registry=registry))
    def charge(order: str) -> str:
        return order

    with pytest.raises(StoreUnavailableError):
        charge("order-1")

    samples = samples_of(registry)
    failed = [
        s.labels["error_type"]
        for s in samples
        if s.name == "idempotency_store_duration_seconds_count" and s.labels["operation"] == "claim"
    ]
    assert failed == ["unreachable"]
    gauge = [(s.labels, s.value) for s in samples if s.name == "idempotency_breaker_open"]
    assert gauge == [({"store": "redis"}, 1.0)]
    outcomes = {s.labels["outcome"] for s in samples if s.name == "idempotency_attempts_total"}
    assert outcomes == {"store_error"}


def test_a_store_given_the_hook_times_its_calls_for_a_door_without_one() -> None:
    registry = CollectorRegistry()
    store = MemoryStore(on_event=Prometheus(registry=registry))

    @idempotent(store=store, key=lambda order: order)
    def charge(order: str) -> str:
        return order

    charge("order-1")
    samples = samples_of(registry)
    calls = {
        s.labels["operation"]: s.value
        for s in samples
        if s.name == "idempotency_store_duration_seconds_count"
    }
    assert calls == {"claim": 1.0, "complete": 1.0}
    assert not [s for s in samples if s.name == "idempotency_attempts_total"]


def test_two_hooks_on_one_registry_share_its_metrics() -> None:
    registry = CollectorRegistry()
    first, second = Prometheus(registry=registry), Prometheus(registry=registry)
    store = MemoryStore()
    for hook, name in ((first, "a"), (second, "b")):

        @idempotent(store=store, key=lambda order: order, name=name, on_event=hook)
        def charge(order: str) -> str:
            return order

        charge("order-1")

    samples = samples_of(registry)
    routes = {s.labels["route"] for s in samples if s.name == "idempotency_attempts_total"}
    assert routes == {"a", "b"}
    calls = [s for s in samples if s.name == "idempotency_store_duration_seconds_count"]
    assert sum(s.value for s in calls) == 4  # each call timed once, not once per hook


def test_a_namespace_names_every_metric() -> None:
    registry = CollectorRegistry()

    @idempotent(
        store=MemoryStore(),
        key=lambda order: order,
        on_event=Prometheus(registry=registry, namespace="shop"),
    )
    def charge(order: str) -> str:
        return order

    charge("order-1")
    names = {family.name for family in registry.collect()}
    assert names == {
        "shop_attempts",
        "shop_store_duration_seconds",
        "shop_wait_duration_seconds",
        "shop_breaker_open",
    }


@pytest.mark.parametrize("namespace", ["", "9lives", "has space", None])
def test_a_namespace_that_is_no_metric_name_is_refused(namespace: object) -> None:
    with pytest.raises(ValueError, match="namespace must be"):
        Prometheus(registry=CollectorRegistry(), namespace=namespace)  # type: ignore[arg-type]


def test_a_registry_that_is_not_one_is_refused() -> None:
    with pytest.raises(TypeError, match="registry must be a prometheus_client CollectorRegistry"):
        Prometheus(registry={})
