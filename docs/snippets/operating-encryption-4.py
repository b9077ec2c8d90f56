import os
import queue

from fastapi import FastAPI
from fastapi.testclient import TestClient

from idempotency_middleware import (
    Encryption,
    IdempotencyMiddleware,
    MemoryStore,
    defer_completion,
)

encryption = Encryption(keys={"2026-11": os.urandom(32)}, current="2026-11")
store = MemoryStore()
jobs: queue.Queue[str] = queue.Queue()  # SQS, Celery, ... in production
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=store, encryption=encryption)


@app.post("/reports")
def start_report() -> dict[str, str]:
    jobs.put(defer_completion())
    return {"state": "accepted"}


# --8<-- [start:worker]
def finish_one_report() -> None:  # a worker, in any process, with the same Encryption
    token = jobs.get()
    body = b'{"card": "4242"}'
    headers = [(b"content-type", b"application/json")]
    store.complete_deferred(token, 200, headers, body, encryption=encryption)
    # (or: await store.acomplete_deferred(..., encryption=encryption) on an async store)


# --8<-- [end:worker]

client = TestClient(app)
key = {"Idempotency-Key": "report-1"}
assert client.post("/reports", headers=key).json() == {"state": "accepted"}
finish_one_report()
assert client.post("/reports", headers=key).json() == {"card": "4242"}  # the final response
(record,) = store._records.values()
assert b"4242" not in record.response.body  # stored sealed
