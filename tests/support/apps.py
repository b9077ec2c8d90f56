"""The two test apps: a FastAPI app (ASGI) and a Flask app (WSGI) with the same endpoints.

Each endpoint's behaviour is written once, framework-neutral (``Reply``), and both apps only
translate requests and replies; so a scenario that passes on one adapter and fails on the
other points at the adapter, not at the app.

Endpoints (a call counter per endpoint, named ``"METHOD /template"``):

- ``POST /orders``, ``PATCH /orders``, ``POST /payments``: 201, JSON echo of the parsed body
  plus the call number, ``X-Order`` and a ``Set-Cookie``
- ``PATCH /orders/{order_id}``, ``PUT /orders/{order_id}``: 200, the same echo
- ``GET /orders``: 200 with the call number
- ``POST /fail``: 500; ``POST /boom``: raises
- ``POST /slow``: blocks on the next gate the test armed (``AppState.arm_gate``), if any
- ``POST /block``: the same, but FastAPI's blocks its event loop while it waits
- ``POST /sleep``: sleeps ``SLEEP_SECONDS``
- ``POST /big?n=N``: N random (incompressible) bytes
- ``POST /status/{code}``: answers that status
- ``POST /stream?status=S&fail=first``: a live ``text/event-stream`` (status S, default 200):
  ``STREAM_FIRST_CHUNK``, then it waits at the next armed gate, then ``STREAM_LAST_CHUNK``
  (``STREAM_GATE_TIMED_OUT`` if the gate was never opened); with ``fail=first`` the first
  call's stream raises after the gate instead of sending its last chunk
- ``POST /ticker``: an endless ``text/event-stream`` of ``data: tick N`` events, one every
  ``TICK_SECONDS``, until the client goes away (at most ``MAX_TICKS``)
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request

# How long a gated /slow handler waits at most for the test to open its gate.
GATE_TIMEOUT_SECONDS = 10.0
SLEEP_SECONDS = 0.3
# The pace of the endless /ticker stream, and its length if nobody ever stops it.
TICK_SECONDS = 0.01
MAX_TICKS = 3000

EVENT_STREAM = "text/event-stream"
STREAM_FIRST_CHUNK = b"data: first\n\n"
STREAM_LAST_CHUNK = b"data: last\n\n"
STREAM_GATE_TIMED_OUT = b"data: gate timed out\n\n"

POST_ORDERS = "POST /orders"
PATCH_ORDERS = "PATCH /orders"
POST_PAYMENTS = "POST /payments"
PATCH_ORDER = "PATCH /orders/{order_id}"
PUT_ORDER = "PUT /orders/{order_id}"
GET_ORDERS = "GET /orders"
POST_FAIL = "POST /fail"
POST_BOOM = "POST /boom"
POST_SLOW = "POST /slow"
POST_BLOCK = "POST /block"
POST_SLEEP = "POST /sleep"
POST_BIG = "POST /big"
POST_STATUS = "POST /status/{code}"
POST_STREAM = "POST /stream"
POST_TICKER = "POST /ticker"

FLASK_ERRORHANDLER_BODY = {"error": "handled by errorhandler(500)"}


class AppState:
    """Thread-safe handler call counters and gates, shared by the test and the app."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._calls: collections.Counter[str] = collections.Counter()
        self._gates: collections.deque[threading.Event] = collections.deque()

    def record_call(self, endpoint: str) -> int:
        """Count one handler call; its number (1 for the first)."""
        with self._condition:
            self._calls[endpoint] += 1
            self._condition.notify_all()
            return self._calls[endpoint]

    def calls(self, endpoint: str) -> int:
        with self._condition:
            return self._calls[endpoint]

    def wait_for_calls(self, endpoint: str, count: int, timeout: float = 5.0) -> bool:
        """Block until ``endpoint``'s handler has been entered ``count`` times."""
        with self._condition:
            return self._condition.wait_for(lambda: self._calls[endpoint] >= count, timeout)

    def arm_gate(self) -> threading.Event:
        """The next /slow call blocks until the returned event is set (or a timeout)."""
        gate = threading.Event()
        with self._condition:
            self._gates.append(gate)
        return gate

    def wait_at_next_gate(self) -> bool:
        """Wait at the next armed gate, if any; ``False`` when it timed out unopened."""
        with self._condition:
            gate = self._gates.popleft() if self._gates else None
        if gate is None:
            return True
        return gate.wait(GATE_TIMEOUT_SECONDS)


@dataclass(frozen=True)
class Reply:
    """A framework-neutral response."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


def parse_body(content_type: str | None, body: bytes) -> Any:
    """The parsed JSON body, or the raw body as text."""
    if content_type and content_type.split(";", 1)[0].strip() == "application/json" and body:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return body.decode("latin-1")


def json_reply(status: int, payload: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, orjson.dumps(payload), headers=headers or [])


def echo(
    state: AppState, endpoint: str, status: int, content_type: str | None, body: bytes
) -> Reply:
    """The /orders family: echo the body with the call number, plus two custom headers."""
    call = state.record_call(endpoint)
    return json_reply(
        status,
        {"endpoint": endpoint, "call": call, "received": parse_body(content_type, body)},
        [("X-Order", f"order-{call}"), ("Set-Cookie", f"session=s{call}; Path=/")],
    )


def count_only(state: AppState, endpoint: str, status: int = 200) -> Reply:
    return json_reply(status, {"endpoint": endpoint, "call": state.record_call(endpoint)})


def big(state: AppState, size: int) -> Reply:
    state.record_call(POST_BIG)
    return Reply(201, os.urandom(size), content_type="application/octet-stream")


def status_reply(state: AppState, code: int) -> Reply:
    return json_reply(code, {"status": code, "call": state.record_call(POST_STATUS)})


def boom(state: AppState) -> None:
    state.record_call(POST_BOOM)
    raise RuntimeError("boom: the handler raised")


def event_stream(state: AppState, *, fail: bool) -> Iterator[bytes]:
    """The /stream body (a sync generator: both frameworks iterate it off the event loop)."""
    yield STREAM_FIRST_CHUNK
    opened = state.wait_at_next_gate()
    if fail:
        raise RuntimeError("the stream failed midway")
    yield STREAM_LAST_CHUNK if opened else STREAM_GATE_TIMED_OUT


def ticker() -> Iterator[bytes]:
    """The /ticker body: endless until the server stops iterating (the client went away)."""
    for number in range(MAX_TICKS):
        yield f"data: tick {number}\n\n".encode()
        time.sleep(TICK_SECONDS)  # the stream's pace, not a wait for a deadline


def stream_fails(fail: str, call: int) -> bool:
    return fail == "first" and call == 1


# --- ASGI (FastAPI) ------------------------------------------------------------------------


def _to_starlette(reply: Reply) -> Response:
    return Response(
        content=reply.body,
        status_code=reply.status,
        media_type=reply.content_type,
        headers=dict(reply.headers),
    )


def build_asgi_app(state: AppState) -> FastAPI:
    """The FastAPI app; sync work (gates) runs in a worker thread, never on the loop."""
    app = FastAPI()

    async def echo_request(request: Request, endpoint: str, status: int) -> Response:
        body = await request.body()
        return _to_starlette(
            echo(state, endpoint, status, request.headers.get("content-type"), body)
        )

    @app.post("/orders")
    async def post_orders(request: Request) -> Response:
        return await echo_request(request, POST_ORDERS, 201)

    @app.patch("/orders")
    async def patch_orders(request: Request) -> Response:
        return await echo_request(request, PATCH_ORDERS, 201)

    @app.post("/payments")
    async def post_payments(request: Request) -> Response:
        return await echo_request(request, POST_PAYMENTS, 201)

    @app.patch("/orders/{order_id}")
    async def patch_order(order_id: str, request: Request) -> Response:
        return await echo_request(request, PATCH_ORDER, 200)

    @app.put("/orders/{order_id}")
    async def put_order(order_id: str, request: Request) -> Response:
        return await echo_request(request, PUT_ORDER, 200)

    @app.get("/orders")
    async def get_orders() -> Response:
        return _to_starlette(count_only(state, GET_ORDERS))

    @app.post("/fail")
    async def post_fail() -> Response:
        return _to_starlette(count_only(state, POST_FAIL, 500))

    @app.post("/boom")
    async def post_boom() -> Response:
        boom(state)
        raise AssertionError("unreachable")

    @app.post("/slow")
    async def post_slow(request: Request) -> Response:
        body = await request.body()
        call = state.record_call(POST_SLOW)
        await asyncio.to_thread(state.wait_at_next_gate)
        return _to_starlette(
            json_reply(201, {"call": call, "received": parse_body("application/json", body)})
        )

    @app.post("/block")
    async def post_block(request: Request) -> Response:
        body = await request.body()
        call = state.record_call(POST_BLOCK)
        state.wait_at_next_gate()  # on purpose: the whole event loop stops with this handler
        return _to_starlette(
            json_reply(201, {"call": call, "received": parse_body("application/json", body)})
        )

    @app.post("/sleep")
    async def post_sleep() -> Response:
        call = state.record_call(POST_SLEEP)
        await asyncio.sleep(SLEEP_SECONDS)
        return _to_starlette(json_reply(201, {"call": call}))

    @app.post("/big")
    async def post_big(n: int) -> Response:
        return _to_starlette(big(state, n))

    @app.post("/status/{code}")
    async def post_status(code: int) -> Response:
        return _to_starlette(status_reply(state, code))

    @app.post("/stream")
    async def post_stream(status: int = 200, fail: str = "") -> StreamingResponse:
        call = state.record_call(POST_STREAM)
        return StreamingResponse(
            event_stream(state, fail=stream_fails(fail, call)),
            status_code=status,
            media_type=EVENT_STREAM,
        )

    @app.post("/ticker")
    async def post_ticker() -> StreamingResponse:
        state.record_call(POST_TICKER)
        return StreamingResponse(ticker(), media_type=EVENT_STREAM)

    return app


# --- WSGI (Flask) --------------------------------------------------------------------------


def _to_flask(reply: Reply) -> FlaskResponse:
    return FlaskResponse(
        reply.body, status=reply.status, headers=reply.headers, content_type=reply.content_type
    )


def build_wsgi_app(state: AppState, *, propagate_exceptions: bool = True) -> Flask:
    """The Flask app.

    ``propagate_exceptions=True`` lets an unhandled exception leave Flask (and so pass
    through the middleware) instead of becoming the ``errorhandler(500)`` response.
    """
    app = Flask("idempotency_behaviour_app")
    app.config["PROPAGATE_EXCEPTIONS"] = propagate_exceptions

    def echo_request(endpoint: str, status: int) -> FlaskResponse:
        body = flask_request.get_data()
        return _to_flask(echo(state, endpoint, status, flask_request.content_type, body))

    def route(rule: str, method: str) -> Callable[[Callable[..., FlaskResponse]], Any]:
        return app.route(rule, methods=[method])

    @route("/orders", "POST")
    def post_orders() -> FlaskResponse:
        return echo_request(POST_ORDERS, 201)

    @route("/orders", "PATCH")
    def patch_orders() -> FlaskResponse:
        return echo_request(PATCH_ORDERS, 201)

    @route("/payments", "POST")
    def post_payments() -> FlaskResponse:
        return echo_request(POST_PAYMENTS, 201)

    @route("/orders/<order_id>", "PATCH")
    def patch_order(order_id: str) -> FlaskResponse:
        return echo_request(PATCH_ORDER, 200)

    @route("/orders/<order_id>", "PUT")
    def put_order(order_id: str) -> FlaskResponse:
        return echo_request(PUT_ORDER, 200)

    @route("/orders", "GET")
    def get_orders() -> FlaskResponse:
        return _to_flask(count_only(state, GET_ORDERS))

    @route("/fail", "POST")
    def post_fail() -> FlaskResponse:
        return _to_flask(count_only(state, POST_FAIL, 500))

    @route("/boom", "POST")
    def post_boom() -> FlaskResponse:
        boom(state)
        raise AssertionError("unreachable")

    @route("/slow", "POST")
    def post_slow() -> FlaskResponse:
        body = flask_request.get_data()
        call = state.record_call(POST_SLOW)
        state.wait_at_next_gate()
        return _to_flask(
            json_reply(201, {"call": call, "received": parse_body("application/json", body)})
        )

    @route("/block", "POST")
    def post_block() -> FlaskResponse:
        body = flask_request.get_data()
        call = state.record_call(POST_BLOCK)
        state.wait_at_next_gate()
        return _to_flask(
            json_reply(201, {"call": call, "received": parse_body("application/json", body)})
        )

    @route("/sleep", "POST")
    def post_sleep() -> FlaskResponse:
        call = state.record_call(POST_SLEEP)
        time.sleep(SLEEP_SECONDS)
        return _to_flask(json_reply(201, {"call": call}))

    @route("/big", "POST")
    def post_big() -> FlaskResponse:
        return _to_flask(big(state, int(flask_request.args["n"])))

    @route("/status/<int:code>", "POST")
    def post_status(code: int) -> FlaskResponse:
        return _to_flask(status_reply(state, code))

    @route("/stream", "POST")
    def post_stream() -> FlaskResponse:
        call = state.record_call(POST_STREAM)
        fail = stream_fails(flask_request.args.get("fail", ""), call)
        status = int(flask_request.args.get("status", "200"))
        return FlaskResponse(event_stream(state, fail=fail), status=status, mimetype=EVENT_STREAM)

    @route("/ticker", "POST")
    def post_ticker() -> FlaskResponse:
        state.record_call(POST_TICKER)
        return FlaskResponse(ticker(), mimetype=EVENT_STREAM)

    @app.errorhandler(500)
    def internal_error(error: Exception) -> FlaskResponse:
        return _to_flask(json_reply(500, FLASK_ERRORHANDLER_BODY))

    return app
