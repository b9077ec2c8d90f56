"""The application every ASGI benchmark wraps: Starlette parsing a ~100-byte JSON order.

``uvicorn --factory benchmarks._apps:uvicorn_app`` builds the variant named by
``BENCH_VARIANT`` (bare, memory, dynamodb: the lean transport, dynamodb-sdk: aioboto3) for
the throughput benchmark.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route


class HandlerRuns:
    """How many times the handler ran: a replay must not move it."""

    count = 0


K = TypeVar("K")


async def checked_batch(
    call: Callable[[K], Awaitable[object]], keys: Sequence[K], new: bool, *, collect: bool = True
) -> tuple[float, float]:
    """Mean wall and CPU seconds per call of ``call`` over ``keys``. ``call`` answers
    something falsy when its request got what it should; raises when one did not, or when
    the handler ran other than once per key (``new``) or at all (a replay). ``collect``:
    start from a full garbage collection (timed batches)."""
    if collect:
        gc.collect()
    runs = HandlerRuns.count
    wrong = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for key in keys:
        if await call(key):
            wrong += 1
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    expected_runs = len(keys) if new else 0
    if wrong or HandlerRuns.count - runs != expected_runs:
        raise RuntimeError(
            f"{wrong} of {len(keys)} wrong answers; the handler ran "
            f"{HandlerRuns.count - runs} times, not {expected_runs}"
        )
    return wall / len(keys), cpu / len(keys)


async def create_order(request: Request) -> JSONResponse:
    order = await request.json()
    HandlerRuns.count += 1
    return JSONResponse(
        {"id": HandlerRuns.count, "amount": order["amount"], "status": "accepted"},
        status_code=201,
    )


async def process_cpu(_request: Request) -> PlainTextResponse:
    """The server process's CPU seconds so far: the throughput benchmark reads it before and
    after a run (from outside, /proc may name another PID namespace)."""
    return PlainTextResponse(repr(time.process_time()))


def order_app(middleware: list[Middleware] | None = None, **kwargs: Any) -> Starlette:
    """The bare app, or the same app with ``middleware`` (built as users deploy it)."""
    return Starlette(
        routes=[
            Route("/orders", create_order, methods=["POST"]),
            Route("/cpu", process_cpu, methods=["GET"]),
        ],
        middleware=middleware,
        **kwargs,
    )


def uvicorn_app() -> Starlette:
    """Factory for uvicorn, configured by environment variables (see module docstring)."""
    from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware, MemoryStore

    variant = os.environ.get("BENCH_VARIANT", "bare")
    if variant == "bare":
        return order_app()
    if variant == "memory":
        return order_app([Middleware(IdempotencyMiddleware, store=MemoryStore())])
    if variant in ("dynamodb", "dynamodb-sdk"):
        store = AsyncDynamoDBStore(
            os.environ["BENCH_TABLE"],
            endpoint_url=os.environ["BENCH_ENDPOINT"],
            region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            transport="sdk" if variant == "dynamodb-sdk" else "auto",
        )

        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            async with store:
                yield

        return order_app([Middleware(IdempotencyMiddleware, store=store)], lifespan=lifespan)
    raise ValueError(f"unknown BENCH_VARIANT {variant!r}")
