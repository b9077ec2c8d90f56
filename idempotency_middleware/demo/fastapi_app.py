"""A FastAPI shop whose ``POST /orders`` is safe to retry with an ``Idempotency-Key`` header.

Run it against your own DynamoDB table (``DynamoDBStore(...).create_table()`` makes one)::

    IDEMPOTENCY_TABLE=idempotency-keys uvicorn idempotency_middleware.demo.fastapi_app:app

``idempotency-middleware demo`` builds the same app with ``create_app``, against moto's
DynamoDB server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import BaseModel, Field

from .. import AsyncDynamoDBStore, IdempotencyMiddleware

# How long POST /slow-orders takes, as if it waited on a payment provider.
SLOW_SECONDS = 0.5


class NewOrder(BaseModel):
    item: str = Field(min_length=1)
    quantity: int = Field(gt=0)


class Order(BaseModel):
    order_id: str
    item: str
    quantity: int
    charges: int  # cards charged so far by this server: a replayed response does not add one


class Charges(BaseModel):
    charges: int


def create_app(store: AsyncDynamoDBStore) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with store:  # one DynamoDB client for the life of the app, closed on shutdown
            yield

    app = FastAPI(title="Shop", lifespan=lifespan)
    app.add_middleware(IdempotencyMiddleware, store=store)

    charges = 0  # stands in for your database and payment provider

    def place(order: NewOrder) -> Order:
        nonlocal charges
        charges += 1
        return Order(
            order_id=f"ord_{uuid.uuid4().hex[:12]}",
            item=order.item,
            quantity=order.quantity,
            charges=charges,
        )

    @app.post("/orders", status_code=201)
    async def create_order(order: NewOrder) -> Order:
        return place(order)

    @app.post("/slow-orders", status_code=201)
    async def create_slow_order(order: NewOrder) -> Order:
        await asyncio.sleep(SLOW_SECONDS)
        return place(order)

    @app.get("/charges")
    async def count_charges() -> Charges:
        return Charges(charges=charges)

    return app


app = create_app(
    AsyncDynamoDBStore(
        os.environ.get("IDEMPOTENCY_TABLE", "idempotency-keys"),
        endpoint_url=os.environ.get("DYNAMODB_ENDPOINT_URL"),  # unset: AWS itself
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
    )
)
