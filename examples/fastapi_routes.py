"""The FastAPI opt-in example (the site's FastAPI page): IdempotencyKey beside each route,
and the OpenAPI schema documenting the key header and the middleware's responses.

    uvicorn fastapi_routes:app     (from this repository: examples.fastapi_routes:app)

The table must exist (``idempotency-middleware create-table``); tests/docs/test_quickstarts.py
runs this file under uvicorn against a local DynamoDB.
"""

from typing import Annotated, Any
from uuid import uuid4

from fastapi import Depends, FastAPI

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware, scope_by_header
from idempotency_middleware.fastapi import IdempotencyKey, document_idempotency

app = FastAPI()
app.add_middleware(
    IdempotencyMiddleware,
    store=AsyncDynamoDBStore("idempotency", region_name="eu-west-1"),
    methods=(),  # cover only the routes opted in below
)


@app.post(
    "/payments",
    status_code=201,
    dependencies=[Depends(IdempotencyKey(required=True, scope=scope_by_header("X-Api-Key")))],
)
async def create_payment(payment: dict[str, Any]) -> dict[str, Any]:
    return {"payment_id": uuid4().hex, **payment}


@app.put("/orders/{order_id}")
async def replace_order(
    order_id: int, key: Annotated[str | None, Depends(IdempotencyKey(ttl_seconds=3600))]
) -> dict[str, Any]:
    return {"order_id": order_id, "idempotency_key": key}  # None: sent without a key


document_idempotency(app)  # /docs now shows the key header and the 400/409/410/413/422/503
