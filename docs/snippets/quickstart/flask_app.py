from uuid import uuid4

from flask import Flask, request

from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore

app = Flask(__name__)
store = SQLiteStore("idempotency.sqlite3")
middleware = IdempotencyWSGIMiddleware(app.wsgi_app, store=store, check_store=True)
app.wsgi_app = middleware  # type: ignore[method-assign]


@app.post("/orders")  # runs once per Idempotency-Key: a retry gets this response back
def create_order() -> tuple[dict, int]:
    return {"order_id": uuid4().hex, **request.get_json()}, 201
