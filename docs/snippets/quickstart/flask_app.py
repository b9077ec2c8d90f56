from uuid import uuid4

from flask import Flask, request

from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore

app = Flask(__name__)
store = SQLiteStore("idempotency.sqlite3")
app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=store)  # type: ignore[method-assign]


@app.post("/orders")
def create_order() -> tuple[dict, int]:
    # Runs once per Idempotency-Key: a retry gets this response back, the same order_id.
    return {"order_id": uuid4().hex, **request.get_json()}, 201
