"""The shop the transaction crash test serves in a subprocess and kills with SIGKILL.

Two factories, one handler each, the same behaviour:

- ``python -m uvicorn --factory tests.support.transaction_crash_app:create_asgi_app ...``: FastAPI,
  ``IdempotencyMiddleware`` with an ``AsyncDynamoDBStore``;
- ``python -m waitress --call tests.support.transaction_crash_app:create_wsgi_app``: Flask,
  ``IdempotencyWSGIMiddleware`` with a ``DynamoDBStore``.

``POST /orders`` with ``{"order_id", "sku", "quantity"}`` adds two writes to
``completion_transaction()``: the order (only if no order has that id) and the stock
decrement (only if enough is left). It answers 201 ``{"order_id", "receipt", "pid"}``, the
receipt a fresh uuid, so a second run of the handler would answer different bytes.

Configured by environment variables:

- ``TXN_CRASH_ENDPOINT``: the DynamoDB endpoint (the test's fault proxy);
- ``TXN_CRASH_TABLE``, ``TXN_CRASH_ORDERS_TABLE``, ``TXN_CRASH_STOCK_TABLE``: the
  idempotency table, the orders (key ``order_id``) and the stock (key ``sku``, ``count``);
- ``TXN_CRASH_RUNS_FILE``: every handler run appends ``<pid> <response body>`` to it before
  it returns, so the test knows what a killed process would have answered;
- ``TXN_CRASH_CLOCK_FILE``: the middleware's clock is a ``FileClock`` on this file, which
  the test moves past a dead owner's lock;
- ``TXN_CRASH_LOCK_SECONDS``: the middleware's ``lock_timeout_seconds``.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations at run
# time, and ``Request`` is imported inside the factory (the WSGI server never imports FastAPI).

import os
import uuid
from decimal import Decimal
from typing import Any

import orjson

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    completion_transaction,
)
from tests.support.file_clock import FileClock

REGION = "us-east-1"
# Longer than the test ever lets a commit hang before the kill, so that botocore never
# re-sends the TransactWriteItems the proxy holds (a re-send would change the moment).
READ_TIMEOUT_SECONDS = 30.0


def _setting(name: str) -> str:
    return os.environ[f"TXN_CRASH_{name}"]


def _middleware_options() -> dict[str, Any]:
    return {
        "lock_timeout_seconds": float(_setting("LOCK_SECONDS")),
        "clock": FileClock(_setting("CLOCK_FILE")),
    }


def _store_options() -> dict[str, Any]:
    return {
        "endpoint_url": _setting("ENDPOINT"),
        "region_name": REGION,
        "read_timeout": READ_TIMEOUT_SECONDS,
    }


def place_order(body: bytes) -> bytes:
    """Add the order's writes to the attempt's transaction; the response body."""
    order = orjson.loads(body)
    order_id, sku = str(order["order_id"]), str(order["sku"])
    quantity = Decimal(int(order["quantity"]))
    receipt = uuid.uuid4().hex
    transaction = completion_transaction()
    transaction.put(
        _setting("ORDERS_TABLE"),
        {"order_id": order_id, "sku": sku, "quantity": quantity, "receipt": receipt},
        condition="attribute_not_exists(order_id)",
    )
    transaction.update(
        _setting("STOCK_TABLE"),
        {"sku": sku},
        "SET #count = #count - :quantity",
        condition="#count >= :quantity",
        names={"#count": "count"},
        values={":quantity": quantity},
    )
    answer = orjson.dumps({"order_id": order_id, "receipt": receipt, "pid": os.getpid()})
    with open(_setting("RUNS_FILE"), "ab") as runs:
        runs.write(b"%d %s\n" % (os.getpid(), answer))
        runs.flush()
        os.fsync(runs.fileno())
    return answer


def create_asgi_app() -> Any:
    """FastAPI behind ``IdempotencyMiddleware`` (uvicorn ``--factory``)."""
    from fastapi import FastAPI, Request, Response

    app = FastAPI()

    @app.post("/orders")
    async def create_order(request: Request) -> Response:
        answer = place_order(await request.body())
        return Response(answer, status_code=201, media_type="application/json")

    store = AsyncDynamoDBStore(_setting("TABLE"), **_store_options())
    app.add_middleware(IdempotencyMiddleware, store=store, **_middleware_options())
    return app


def create_wsgi_app() -> Any:
    """Flask behind ``IdempotencyWSGIMiddleware`` (waitress ``--call``)."""
    from flask import Flask, Response, request

    app = Flask(__name__)

    @app.post("/orders")
    def create_order() -> Response:
        answer = place_order(request.get_data())
        return Response(answer, status=201, mimetype="application/json")

    store = DynamoDBStore(_setting("TABLE"), **_store_options())
    app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, store=store, **_middleware_options()
    )
    return app
