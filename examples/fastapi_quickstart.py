"""The FastAPI quick start, complete: the table is created at start-up and the store's
client closed at shutdown, in FastAPI's lifespan.

    pip install -e '.[dynamodb,fastapi]' uvicorn     (from a checkout)
    uvicorn fastapi_quickstart:app     (from this repository: examples.fastapi_quickstart:app)

The AWS SDK finds credentials the usual way (environment, ~/.aws, an instance role);
``AWS_ENDPOINT_URL_DYNAMODB`` points it at a local DynamoDB instead of AWS.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import uuid4

from fastapi import FastAPI

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware

store = AsyncDynamoDBStore("idempotency", region_name="eu-west-1")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        # On-demand billing, TTL on; nothing to do if the table exists. It needs
        # dynamodb:CreateTable: in production, create the table at deploy time
        # (`idempotency-middleware create-table`) and drop this line.
        await store.create_table()
        yield
    finally:
        await store.aclose()  # the store's aioboto3 client and its connections


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, store=store)


@app.post("/orders", status_code=201)
async def create_order(order: dict[str, Any]) -> dict[str, Any]:
    # Runs once per Idempotency-Key: a retry gets this response back, the same order_id.
    return {"order_id": uuid4().hex, **order}
