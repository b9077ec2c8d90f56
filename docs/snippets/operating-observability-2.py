# --8<-- [start:show]
from fastapi import FastAPI
from prometheus_client import Counter, Histogram

from idempotency_middleware import IdempotencyEvent, IdempotencyMiddleware, MemoryStore

EVENTS = Counter("idempotency_events_total", "Idempotency middleware events", ["kind", "route"])
STORE_LATENCY = Histogram("idempotency_store_seconds", "Store call latency")


def on_event(event: IdempotencyEvent) -> None:
    EVENTS.labels(event.kind, f"{event.method} {event.route}").inc()
    if event.store_latency_ms is not None:
        STORE_LATENCY.observe(event.store_latency_ms / 1000)


app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), on_event=on_event)
# --8<-- [end:show]
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY, generate_latest


@app.post("/orders")
def create_order() -> dict[str, str]:
    return {"order": "created"}


client = TestClient(app)
for _ in range(2):
    client.post("/orders", json={}, headers={"Idempotency-Key": "order-1"})
metrics = generate_latest(REGISTRY).decode()
assert 'idempotency_events_total{kind="completed",route="POST /orders"} 1.0' in metrics, metrics
assert 'idempotency_events_total{kind="replayed",route="POST /orders"} 1.0' in metrics, metrics
