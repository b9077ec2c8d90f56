# --8<-- [start:rules]
from idempotency_middleware import IdempotencyRule, scope_by_header

rules = [
    IdempotencyRule("/internal/{rest:path}", enabled=False),
    IdempotencyRule(
        "/payments", required=True, ttl_seconds=7 * 86400, scope=scope_by_header("X-Api-Key")
    ),
    IdempotencyRule("/orders/{order_id}/refunds", methods=["POST", "PUT"]),
]
# --8<-- [end:rules]
from fastapi import FastAPI
from fastapi.testclient import TestClient
from flask import Flask

from idempotency_middleware import IdempotencyMiddleware, IdempotencyWSGIMiddleware, MemoryStore

store = MemoryStore()
app = FastAPI()


@app.post("/payments")
def pay() -> dict[str, str]:
    return {"paid": "yes"}


# --8<-- [start:asgi]
app.add_middleware(IdempotencyMiddleware, store=store, rules=rules)
# --8<-- [end:asgi]
# The rule at work: /payments requires a key.
assert TestClient(app).post("/payments", headers={"X-Api-Key": "k"}).status_code == 400
app = Flask(__name__)  # type: ignore[assignment]
# --8<-- [start:wsgi]
app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=store, rules=rules)
# --8<-- [end:wsgi]
