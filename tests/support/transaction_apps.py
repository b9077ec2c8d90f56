"""The apps of the exactly-once write tests: a FastAPI app (ASGI) and a Flask app (WSGI) whose
handlers add their DynamoDB writes to ``completion_transaction()``.

An order is a put on the orders table (``attribute_not_exists`` on its id: an order is made
once) and an update of the inventory table decrementing the stock, conditioned on there
being enough (``#count >= :qty``), in that order: a failed stock condition is write 1.

Routes, the same on both apps (each run counted per path, and its number in the order item
and the response, so a replay is told from a fresh run and the writes from their run):

- ``POST /orders``: the order's writes, 201 JSON ``{"id", "sku", "qty", "run", "in_loop"}``
  (``in_loop``: whether the handler ran on an event loop's thread)
- ``POST /orders-sync``: the same from a sync ``def`` (FastAPI runs it in its thread pool)
- ``POST /orders-raise``: adds the writes, then raises
- ``POST /orders-500``: adds the writes, then answers 500
- ``POST /orders-stream``: adds the writes, then answers a ``text/event-stream`` (200)
- ``POST /orders-stream-cut``: adds the writes, then a ``text/event-stream`` that fails
  after its first event (the response never finishes)
- ``POST /orders-gated``: adds the writes, then waits for the next gate the test armed
  (``TransactionAppState.arm_gate``; none armed: it goes on at once), then 201
- ``POST /probe``: calls ``completion_transaction()`` and answers 200 with what it raised,
  ``{"error": "LookupError" | "TypeError" | null}``

The body of an order request is ``{"sku": ..., "qty": ..., "id": ...}``; without ``id`` the
order gets a uuid.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request
from pydantic import BaseModel

from idempotency_middleware import completion_transaction

__all__ = [
    "ORDERS",
    "ORDERS_500",
    "ORDERS_GATED",
    "ORDERS_RAISE",
    "ORDERS_STREAM",
    "ORDERS_STREAM_CUT",
    "ORDERS_SYNC",
    "PROBE",
    "STREAM_END",
    "TransactionAppState",
    "build_fastapi_app",
    "build_flask_app",
]

ORDERS = "/orders"
ORDERS_SYNC = "/orders-sync"
ORDERS_RAISE = "/orders-raise"
ORDERS_500 = "/orders-500"
ORDERS_STREAM = "/orders-stream"
ORDERS_STREAM_CUT = "/orders-stream-cut"
ORDERS_GATED = "/orders-gated"
PROBE = "/probe"

EVENT_STREAM = "text/event-stream"
STREAM_END = b"data: end\n\n"
# A gated handler gives up waiting after this long, so a failed test cannot hang a server.
GATE_TIMEOUT_SECONDS = 15.0


class TransactionAppState:
    """The tables the handlers write to, their run counters and the test's gates."""

    def __init__(self, orders_table: str, inventory_table: str) -> None:
        self.orders_table = orders_table
        self.inventory_table = inventory_table
        self._condition = threading.Condition()
        self._runs: Counter[str] = Counter()
        self._at_gate = 0
        self._gates: list[threading.Event] = []

    # -- for the test ------------------------------------------------------------------

    def runs(self, path: str) -> int:
        with self._condition:
            return self._runs[path]

    def arm_gate(self) -> threading.Event:
        """The next gated handler waits until the returned event is set."""
        gate = threading.Event()
        with self._condition:
            self._gates.append(gate)
        return gate

    def wait_at_gate(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` gated handlers in all have added their writes and reached the gate."""
        with self._condition:
            if not self._condition.wait_for(lambda: self._at_gate >= count, timeout):
                raise TimeoutError(f"{count} gated handlers did not arrive within {timeout} s")

    def at_gate(self) -> int:
        with self._condition:
            return self._at_gate

    # -- for the handlers ----------------------------------------------------------------

    def start(self, path: str) -> int:
        with self._condition:
            self._runs[path] += 1
            return self._runs[path]

    def reach_gate(self) -> threading.Event | None:
        """Count a gated handler in; the gate it must wait for (``None``: none armed)."""
        with self._condition:
            self._at_gate += 1
            self._condition.notify_all()
            return self._gates.pop(0) if self._gates else None

    def add_order(self, path: str, order: Mapping[str, Any]) -> dict[str, Any]:
        """Add the order's two writes to the attempt's transaction; the response document."""
        run = self.start(path)
        order_id = str(order.get("id") or uuid.uuid4().hex)
        sku = str(order["sku"])
        qty = int(order["qty"])
        transaction = completion_transaction()
        transaction.put(
            self.orders_table,
            {"id": order_id, "sku": sku, "qty": qty, "run": run},
            condition="attribute_not_exists(#id)",
            names={"#id": "id"},
        )
        transaction.update(
            self.inventory_table,
            {"sku": sku},
            "SET #count = #count - :qty",
            condition="#count >= :qty",
            names={"#count": "stock"},
            values={":qty": qty},
        )
        return {"id": order_id, "sku": sku, "qty": qty, "run": run, "in_loop": _in_event_loop()}


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def probe() -> bytes:
    """What ``completion_transaction()`` raises here, as the handler reports it."""
    try:
        transaction = completion_transaction()
    except (LookupError, TypeError) as error:
        return orjson.dumps({"error": type(error).__name__, "message": str(error)})
    return orjson.dumps({"error": None, "writes": len(transaction)})


def _stream(document: dict[str, Any]) -> Iterator[bytes]:
    yield b"data: " + orjson.dumps(document) + b"\n\n"
    yield STREAM_END


def _cut_stream(document: dict[str, Any]) -> Iterator[bytes]:
    yield b"data: " + orjson.dumps(document) + b"\n\n"
    raise RuntimeError("the stream failed after its first event")


# -- FastAPI -------------------------------------------------------------------------------


class OrderIn(BaseModel):
    sku: str
    qty: int
    id: str | None = None


def _json(document: dict[str, Any], status: int = 201) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type="application/json")


def build_fastapi_app(state: TransactionAppState) -> FastAPI:
    app = FastAPI()

    async def order_of(request: Request, path: str) -> dict[str, Any]:
        return state.add_order(path, orjson.loads(await request.body()))

    @app.post(ORDERS)
    async def post_orders(request: Request) -> Response:
        return _json(await order_of(request, ORDERS))

    @app.post(ORDERS_SYNC)
    def post_orders_sync(order: OrderIn) -> Response:
        # A sync route: FastAPI runs it in its thread pool, with the request's context.
        return _json(state.add_order(ORDERS_SYNC, order.model_dump()))

    @app.post(ORDERS_RAISE)
    async def post_orders_raise(request: Request) -> Response:
        await order_of(request, ORDERS_RAISE)
        raise RuntimeError("the handler raised after adding its writes")

    @app.post(ORDERS_500)
    async def post_orders_500(request: Request) -> Response:
        return _json(await order_of(request, ORDERS_500), 500)

    @app.post(ORDERS_STREAM)
    async def post_orders_stream(request: Request) -> StreamingResponse:
        document = await order_of(request, ORDERS_STREAM)

        async def events() -> AsyncIterator[bytes]:
            for chunk in _stream(document):
                yield chunk
                await asyncio.sleep(0)

        return StreamingResponse(events(), media_type=EVENT_STREAM)

    @app.post(ORDERS_STREAM_CUT)
    async def post_orders_stream_cut(request: Request) -> StreamingResponse:
        document = await order_of(request, ORDERS_STREAM_CUT)

        async def events() -> AsyncIterator[bytes]:
            for chunk in _cut_stream(document):
                yield chunk
                await asyncio.sleep(0)

        return StreamingResponse(events(), media_type=EVENT_STREAM)

    @app.post(ORDERS_GATED)
    async def post_orders_gated(request: Request) -> Response:
        document = await order_of(request, ORDERS_GATED)
        gate = state.reach_gate()
        deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
        # Polled, not awaited in a thread: the loop must serve the request taking it over.
        while gate is not None and not gate.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        return _json(document)

    @app.post(PROBE)
    async def post_probe() -> Response:
        return Response(probe(), media_type="application/json")

    return app


# -- Flask ---------------------------------------------------------------------------------


def build_flask_app(state: TransactionAppState) -> Flask:
    """The Flask app; unhandled exceptions leave it (and pass through the middleware)."""
    app = Flask("transaction_app")
    app.config["PROPAGATE_EXCEPTIONS"] = True

    def order_of(path: str) -> dict[str, Any]:
        return state.add_order(path, orjson.loads(flask_request.get_data()))

    def json_response(document: dict[str, Any], status: int = 201) -> FlaskResponse:
        return FlaskResponse(orjson.dumps(document), status=status, mimetype="application/json")

    @app.post(ORDERS)
    def post_orders() -> FlaskResponse:
        return json_response(order_of(ORDERS))

    @app.post(ORDERS_SYNC)
    def post_orders_sync() -> FlaskResponse:
        return json_response(order_of(ORDERS_SYNC))

    @app.post(ORDERS_RAISE)
    def post_orders_raise() -> FlaskResponse:
        order_of(ORDERS_RAISE)
        raise RuntimeError("the handler raised after adding its writes")

    @app.post(ORDERS_500)
    def post_orders_500() -> FlaskResponse:
        return json_response(order_of(ORDERS_500), 500)

    @app.post(ORDERS_STREAM)
    def post_orders_stream() -> FlaskResponse:
        return FlaskResponse(_stream(order_of(ORDERS_STREAM)), mimetype=EVENT_STREAM)

    @app.post(ORDERS_STREAM_CUT)
    def post_orders_stream_cut() -> FlaskResponse:
        return FlaskResponse(_cut_stream(order_of(ORDERS_STREAM_CUT)), mimetype=EVENT_STREAM)

    @app.post(ORDERS_GATED)
    def post_orders_gated() -> FlaskResponse:
        document = order_of(ORDERS_GATED)
        gate = state.reach_gate()
        if gate is not None:
            gate.wait(GATE_TIMEOUT_SECONDS)
        return json_response(document)

    @app.post(PROBE)
    def post_probe() -> FlaskResponse:
        return FlaskResponse(probe(), mimetype="application/json")

    return app
