from uuid import uuid4

from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, SQLiteStore

app = FastAPI()
store = SQLiteStore("idempotency.sqlite3")
app.add_middleware(IdempotencyMiddleware, store=store, check_store=True)  # checked at start-up


@app.post("/orders", status_code=201)
async def create_order(order: dict) -> dict:
    # Runs once per Idempotency-Key: a retry gets this response back, the same order_id.
    return {"order_id": uuid4().hex, **order}
