# --8<-- [start:show]
from fastapi import FastAPI
from prometheus_client import make_asgi_app

from idempotency_middleware import IdempotencyMiddleware, IdempotencyRule, MemoryStore
from idempotency_middleware.observability import Prometheus

app = FastAPI()


@app.post("/orders/{order_id}")
def create_order(order_id: str) -> dict[str, str]:
    return {"order": order_id}


metrics = Prometheus()  # the default registry; Prometheus(registry=...) for another
store = MemoryStore(on_event=metrics)  # the store's calls and its breaker
app.add_middleware(
    IdempotencyMiddleware,
    store=store,
    rules=[IdempotencyRule("/orders/{order_id}")],  # route="/orders/{order_id}"
    on_event=metrics,  # or a list: on_event=[metrics, my_hook]
)
app.mount("/metrics", make_asgi_app())
# --8<-- [end:show]
from fastapi.testclient import TestClient

client = TestClient(app)
for _ in range(2):
    client.post("/orders/17", json={}, headers={"Idempotency-Key": "order-17"})
scraped = client.get("/metrics/").text
labels = 'door="http",outcome="{}",route="/orders/{{order_id}}",store="memory"'
for outcome in ("claimed", "completed", "replayed"):
    assert f"idempotency_attempts_total{{{labels.format(outcome)}}} 1.0" in scraped, scraped
assert 'idempotency_store_duration_seconds_count{error_type="",operation="claim"' in scraped
assert 'idempotency_breaker_open{store="memory"} 0.0' in scraped
assert "order-17" not in scraped and "/orders/17" not in scraped
