"""A Flask shop whose ``POST /orders`` is safe to retry with an ``Idempotency-Key`` header.

Run it against your own DynamoDB table (``DynamoDBStore(...).create_table()`` makes one)::

    IDEMPOTENCY_TABLE=idempotency-keys waitress-serve idempotency_middleware.demo.flask_app:app

``idempotency-middleware demo`` builds the same app with ``create_app``, against moto's
DynamoDB server on 127.0.0.1.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

from .. import DynamoDBStore, IdempotencyWSGIMiddleware

# How long POST /slow-orders takes, as if it waited on a payment provider.
SLOW_SECONDS = 0.5


def create_app(store: DynamoDBStore) -> Flask:
    app = Flask(__name__)
    app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=store)  # type: ignore[method-assign]

    charges = 0  # stands in for your database and payment provider
    lock = threading.Lock()  # the WSGI server runs requests on several threads

    def place() -> ResponseReturnValue:
        nonlocal charges
        order = request.get_json(silent=True)
        item = order.get("item") if isinstance(order, dict) else None
        quantity = order.get("quantity") if isinstance(order, dict) else None
        if not isinstance(item, str) or not item or not isinstance(quantity, int) or quantity < 1:
            return {"detail": "send {'item': str, 'quantity': positive int}"}, 422
        with lock:
            charges += 1
            charged = charges
        return jsonify(
            order_id=f"ord_{uuid.uuid4().hex[:12]}",
            item=item,
            quantity=quantity,
            charges=charged,  # cards charged so far: a replayed response does not add one
        ), 201

    @app.post("/orders")
    def create_order() -> ResponseReturnValue:
        return place()

    @app.post("/slow-orders")
    def create_slow_order() -> ResponseReturnValue:
        time.sleep(SLOW_SECONDS)
        return place()

    @app.get("/charges")
    def count_charges() -> ResponseReturnValue:
        with lock:
            return {"charges": charges}

    return app


app = create_app(
    DynamoDBStore(
        os.environ.get("IDEMPOTENCY_TABLE", "idempotency-keys"),
        endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL"),  # unset: AWS itself
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
    )
)
