"""Exactly-once orders: the order, the stock decrement and the stored response commit in one
DynamoDB transaction, so a crash between the business write and the completion can never
make a retry order twice.

    pip install -e '.[dynamodb,fastapi]' uvicorn     (from a checkout)
    uvicorn exactly_once_orders:app     (from this repository: examples.exactly_once_orders:app)

Configured by the environment alone: the AWS SDK's own variables (credentials, AWS_REGION,
AWS_ENDPOINT_URL_DYNAMODB for a local DynamoDB) and the table names IDEMPOTENCY_TABLE,
ORDERS_TABLE and INVENTORY_TABLE. tests/docs/test_idempotency_examples.py runs this file under
uvicorn against moto and Amazon's DynamoDB Local.
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import uuid4

import aioboto3
from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from idempotency_middleware import (
    AsyncDynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyRule,
    completion_transaction,
)

ORDERS = os.environ.get("ORDERS_TABLE", "orders")
INVENTORY = os.environ.get("INVENTORY_TABLE", "inventory")

REGION = os.environ.get("AWS_REGION", "eu-west-1")
# The store's own (lean) DynamoDB client; the session serves the app's client for its tables.
store = AsyncDynamoDBStore(os.environ.get("IDEMPOTENCY_TABLE", "idempotency"), region_name=REGION)
session = aioboto3.Session(region_name=REGION)


class Order(BaseModel):
    sku: str
    quantity: int = Field(gt=0)


class Stock(BaseModel):
    stock: int = Field(ge=0)


async def create_table(dynamodb: Any, name: str, key: str) -> None:
    """An on-demand table with a string partition key; nothing to do if it exists."""
    try:
        await dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except dynamodb.exceptions.ResourceInUseException:
        return
    await dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with store, session.client("dynamodb") as dynamodb:
        # The tables are created here so that the example runs as it is; in production,
        # create them at deploy time and drop these lines (they need dynamodb:CreateTable).
        await store.create_table()
        await create_table(dynamodb, ORDERS, "order_id")
        await create_table(dynamodb, INVENTORY, "sku")
        app.state.dynamodb = dynamodb
        yield


app = FastAPI(lifespan=lifespan)
# completion_transaction() needs an attempt, and a request without a key has none: require
# the key where the handler writes through it (400 without one, instead of a 500).
app.add_middleware(
    IdempotencyMiddleware, store=store, rules=[IdempotencyRule("/orders", required=True)]
)


@app.put("/inventory/{sku}")
async def set_stock(sku: str, stock: Stock, request: Request) -> dict[str, Any]:
    # PUT is not among the middleware's methods: a plain write, as an operator makes it.
    item = {"sku": {"S": sku}, "stock": {"N": str(stock.stock)}}
    await request.app.state.dynamodb.put_item(TableName=INVENTORY, Item=item)
    return {"sku": sku, "stock": stock.stock}


@app.post("/orders", status_code=201)
async def create_order(order: Order) -> dict[str, Any]:
    order_id = uuid4().hex
    # Nothing is written here. When the handler returns, both writes commit in one
    # TransactWriteItems with this response's completion record: all three land, or none.
    transaction = completion_transaction()
    transaction.put(
        ORDERS,
        {"order_id": order_id, "sku": order.sku, "quantity": order.quantity},
        condition="attribute_not_exists(order_id)",
    )
    transaction.update(
        INVENTORY,
        {"sku": order.sku},
        "SET stock = stock - :quantity",
        # Too little stock: 409 transaction-conflict (position 1), nothing written, and the
        # key is released, so the same request can be retried once the stock is back.
        condition="stock >= :quantity",
        values={":quantity": order.quantity},
    )
    return {"order_id": order_id, "sku": order.sku, "quantity": order.quantity}
