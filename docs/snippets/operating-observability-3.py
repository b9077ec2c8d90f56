# What the OpenTelemetry SDK (or its auto-instrumentation) sets up in a real service; the
# shown part below also runs alone, on OpenTelemetry's no-op global providers.
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(tracer_provider)

# --8<-- [start:show]
from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, IdempotencyRule, SQLiteStore
from idempotency_middleware.observability import OpenTelemetry

app = FastAPI()


@app.post("/orders/{order_id}")
def create_order(order_id: str) -> dict[str, str]:
    return {"order": order_id}


telemetry = OpenTelemetry()  # the global providers; or tracer_provider=, meter_provider=
app.add_middleware(
    IdempotencyMiddleware,
    store=SQLiteStore("idempotency.sqlite3"),  # the door hands the hook on to its store
    rules=[IdempotencyRule("/orders/{order_id}")],
    on_event=telemetry,
)
# --8<-- [end:show]
from fastapi.testclient import TestClient

# FastAPI opens a server span per request (so does the ASGI instrumentation for any app).
TestClient(app).post("/orders/17", json={}, headers={"Idempotency-Key": "order-17"})
exported = {
    metric.name
    for resource in reader.get_metrics_data().resource_metrics
    for scope in resource.scope_metrics
    for metric in scope.metrics
}
assert {"idempotency.attempts", "idempotency.store.duration"} <= exported, exported
finished = spans.get_finished_spans()
names = [span.name for span in finished if span.name.startswith("idempotency")]
assert names == ["idempotency claim", "idempotency complete"], names
(server,) = [span for span in finished if "idempotency.outcome" in span.attributes]
assert server.attributes["idempotency.outcome"] == "completed"
assert "order-17" not in str([dict(span.attributes) for span in finished])
