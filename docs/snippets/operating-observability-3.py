# --8<-- [start:show]
from opentelemetry import metrics

meter = metrics.get_meter("idempotency_middleware")
events = meter.create_counter("idempotency.events")


def on_event(event):
    events.add(1, {"kind": event.kind, "route": f"{event.method} {event.route}"})


# --8<-- [end:show]
from fastapi import FastAPI
from fastapi.testclient import TestClient

from idempotency_middleware import IdempotencyMiddleware, MemoryStore

app = FastAPI()


@app.post("/orders")
def create_order() -> dict[str, str]:
    return {"order": "created"}


app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), on_event=on_event)
response = TestClient(app).post("/orders", json={}, headers={"Idempotency-Key": "order-1"})
assert response.status_code == 200
