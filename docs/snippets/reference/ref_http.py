"""The API reference's examples for the HTTP doors: each section runs, and is checked."""

# --8<-- [start:IdempotencyMiddleware]
from fastapi import FastAPI
from fastapi.testclient import TestClient

from idempotency_middleware import IdempotencyMiddleware, MemoryStore

app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), ttl_seconds=3600)


@app.post("/orders", status_code=201)
async def create_order(order: dict[str, str]) -> dict[str, str]:
    return order


client = TestClient(app)
first = client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-1"})
retry = client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-1"})
assert retry.headers["Idempotent-Replayed"] == "true" and retry.content == first.content
# --8<-- [end:IdempotencyMiddleware]

# --8<-- [start:IdempotencyWSGIMiddleware]
from flask import Flask

from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore

flask_app = Flask(__name__)
flask_app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
    flask_app.wsgi_app, store=SQLiteStore("idempotency.sqlite3"), required=True
)


@flask_app.post("/orders")
def create() -> tuple[dict[str, str], int]:
    return {"created": "yes"}, 201


flask_client = flask_app.test_client()
assert flask_client.post("/orders").status_code == 400  # required=True: no key, no run
assert flask_client.post("/orders", headers={"Idempotency-Key": "k-1"}).status_code == 201
# --8<-- [end:IdempotencyWSGIMiddleware]

# --8<-- [start:IdempotencyRule]
from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, IdempotencyRule, MemoryStore

rules = [
    IdempotencyRule("/internal/{rest:path}", enabled=False),  # never covered
    IdempotencyRule("/payments", required=True, ttl_seconds=7 * 86400),
    IdempotencyRule("/orders/{order_id:int}", methods=["PUT"]),  # PUT too, on this route
]
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), rules=rules)
# --8<-- [end:IdempotencyRule]

# --8<-- [start:scope_by_header]
from fastapi import FastAPI
from fastapi.testclient import TestClient

from idempotency_middleware import IdempotencyMiddleware, MemoryStore, scope_by_header

scoped = FastAPI()
scoped.add_middleware(
    IdempotencyMiddleware, store=MemoryStore(), scope=scope_by_header("X-Api-Key")
)


@scoped.post("/orders")
async def who(order: dict[str, str]) -> dict[str, str]:
    return order


scoped_client = TestClient(scoped)
alice = {"X-Api-Key": "alice", "Idempotency-Key": "1"}
bob = {"X-Api-Key": "bob", "Idempotency-Key": "1"}  # the same key, another caller
scoped_client.post("/orders", json={"for": "alice"}, headers=alice)
assert scoped_client.post("/orders", json={"for": "bob"}, headers=bob).json() == {"for": "bob"}
# --8<-- [end:scope_by_header]

# --8<-- [start:scope_by_tenant_header]
from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, MemoryStore, scope_by_tenant_header

app = FastAPI()
app.add_middleware(
    IdempotencyMiddleware, store=MemoryStore(), scope=scope_by_tenant_header("X-Tenant-Id")
)
# --8<-- [end:scope_by_tenant_header]

# --8<-- [start:RequestView]
from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, MemoryStore, RequestView


def scope_by_tenant_and_route(request: RequestView) -> str:
    """Any callable taking a RequestView can scope keys."""
    return f"{request.headers.get('x-tenant-id', '')}:{request.route}"


app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), scope=scope_by_tenant_and_route)
# --8<-- [end:RequestView]

# --8<-- [start:HeaderView]
from idempotency_middleware import HeaderView

headers = HeaderView([("X-Api-Key", "a"), ("x-api-key", "b")])
assert headers.get("X-API-KEY") == "a, b"  # case-insensitive; repeated headers joined
# --8<-- [end:HeaderView]

# --8<-- [start:IdempotencyEvent]
from fastapi import FastAPI
from fastapi.testclient import TestClient

from idempotency_middleware import IdempotencyEvent, IdempotencyMiddleware, MemoryStore

kinds: list[str] = []


def on_event(event: IdempotencyEvent) -> None:
    kinds.append(event.kind)


observed = FastAPI()
observed.add_middleware(IdempotencyMiddleware, store=MemoryStore(), on_event=on_event)


@observed.post("/orders")
async def observed_order() -> dict[str, str]:
    return {}


for _ in range(2):
    TestClient(observed).post("/orders", headers={"Idempotency-Key": "k"})
assert kinds == ["claimed", "completed", "replayed"], kinds
# --8<-- [end:IdempotencyEvent]
