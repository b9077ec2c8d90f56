"""The API reference's examples for functions, transactions and deferred work."""

# --8<-- [start:idempotent]
from idempotency_middleware import KeyReusedError, MemoryStore, idempotent

charges: list[str] = []


@idempotent(store=MemoryStore(), key="payment_id")  # the parameter that carries the key
def charge(payment_id: str, amount: int) -> dict[str, int | str]:
    charges.append(payment_id)
    return {"payment_id": payment_id, "amount": amount}


assert charge("p-1", 5) == charge("p-1", 5)  # the retry gets the stored result
assert charges == ["p-1"]
try:
    charge("p-1", 6)  # the same key with another payload
except KeyReusedError as error:
    print(error)  # ... this key was already used with another payload ...
# --8<-- [end:idempotent]

# --8<-- [start:completion_transaction]
from idempotency_middleware import completion_transaction

try:
    completion_transaction()  # outside an attempt: there is nothing to commit with
except LookupError as error:
    print(error)
# --8<-- [end:completion_transaction]

# --8<-- [start:defer_completion]
from fastapi import FastAPI
from fastapi.testclient import TestClient

from idempotency_middleware import IdempotencyMiddleware, MemoryStore, defer_completion

store = MemoryStore()
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=store)
tokens: list[str] = []


@app.post("/reports", status_code=202)
async def start_report() -> dict[str, str]:
    tokens.append(defer_completion())  # a worker finishes the key with this token
    return {"status": "running"}


client = TestClient(app)
assert client.post("/reports", headers={"Idempotency-Key": "r-1"}).status_code == 202
# ... later, the worker:
assert store.complete_deferred(tokens[0], 200, [(b"content-type", b"text/plain")], b"done")
assert client.post("/reports", headers={"Idempotency-Key": "r-1"}).text == "done"
# --8<-- [end:defer_completion]
