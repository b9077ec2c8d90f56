# --8<-- [start:rules]
from fastapi import FastAPI
from flask import Flask

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyRule,
    IdempotencyWSGIMiddleware,
    SQLiteStore,
    scope_by_header,
)

store = SQLiteStore("idempotency.sqlite3")
rules = [
    IdempotencyRule("/internal/{rest:path}", enabled=False),
    IdempotencyRule(
        "/payments", required=True, ttl_seconds=7 * 86400, scope=scope_by_header("X-Api-Key")
    ),
    IdempotencyRule("/orders/{order_id}/refunds", methods=["POST", "PUT"]),
]

app = FastAPI()  # FastAPI, Starlette: the ASGI middleware
app.add_middleware(IdempotencyMiddleware, store=store, rules=rules)

flask_app = Flask(__name__)  # Flask: the WSGI middleware, the same rules
flask_app.wsgi_app = IdempotencyWSGIMiddleware(flask_app.wsgi_app, store=store, rules=rules)
# --8<-- [end:rules]
from fastapi.testclient import TestClient


@app.post("/payments")
def pay() -> dict[str, str]:
    return {"paid": "yes"}


@flask_app.post("/payments")
def flask_pay() -> dict[str, str]:
    return {"paid": "yes"}


# The rule at work: /payments requires a key.
assert TestClient(app).post("/payments", headers={"X-Api-Key": "k"}).status_code == 400
assert flask_app.test_client().post("/payments", headers={"X-Api-Key": "k"}).status_code == 400
