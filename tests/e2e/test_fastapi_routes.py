"""Per-route opt-in with FastAPI: ``IdempotencyKey`` beside a route, read by the middleware
from the app's routes, through a real uvicorn server and httpx.

The middleware here covers no method by default (``methods=()``), so whatever is covered
is covered by an opt-in beside its route.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import httpx
import pytest
import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Host
from starlette.types import ASGIApp, Receive, Scope, Send

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyRule,
    MemoryStore,
    scope_by_header,
)
from idempotency_middleware.fastapi import (
    IdempotencyKey,
    IdempotencyNotCoveredError,
    route_rules,
)
from idempotency_middleware.policy.options import Policy
from idempotency_middleware.testing import FakeClock
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi

ONLY_OPT_INS: dict[str, Any] = {"methods": ()}


class Calls:
    """Handler calls per route, counted across the server's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def record(self, name: str) -> int:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            return self.counts[name]


def build_app(calls: Calls, **opt_in: Any) -> FastAPI:
    """POST /payments (required key), POST /orders/{order_id} (the key as a parameter),
    PUT /orders/{order_id} and POST /plain without an opt-in. ``opt_in`` goes to the
    payments route's ``IdempotencyKey``."""
    app = FastAPI()

    @app.exception_handler(IdempotencyNotCoveredError)
    async def not_covered(request: Request, error: IdempotencyNotCoveredError) -> JSONResponse:
        # The error a real app would log as a 500; shown here so the test can read it.
        return JSONResponse({"error": str(error)}, status_code=500)

    @app.post("/payments", dependencies=[Depends(IdempotencyKey(**{"required": True, **opt_in}))])
    async def pay(payment: dict[str, Any]) -> dict[str, Any]:
        return {"payment": payment, "call": calls.record("payments")}

    @app.post("/orders/{order_id}")
    async def order(
        order_id: int, key: Annotated[str | None, Depends(IdempotencyKey())]
    ) -> dict[str, Any]:
        return {"order": order_id, "key": key, "call": calls.record("orders")}

    @app.put("/orders/{order_id}")
    async def replace_order(order_id: int) -> dict[str, Any]:
        return {"order": order_id, "call": calls.record("put-orders")}

    @app.post("/plain")
    async def plain() -> dict[str, Any]:
        return {"call": calls.record("plain")}

    return app


def new_key() -> str:
    return f'"{uuid.uuid4()}"'


@pytest.fixture
def calls() -> Calls:
    return Calls()


# client_for(app, lifespan=False): serve app with uvicorn, a client for it.
ClientFor = Callable[..., httpx.Client]


@pytest.fixture
def client_for() -> Iterator[ClientFor]:
    """``client_for(app, lifespan=False)``: serve ``app`` with uvicorn and return a client."""
    import contextlib

    with contextlib.ExitStack() as stack:

        def start(app: ASGIApp, *, lifespan: bool = False) -> httpx.Client:
            url = stack.enter_context(serve_asgi(app, lifespan=lifespan))
            client = httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False)
            stack.callback(client.close)
            return client

        yield start


def test_a_required_route_answers_400_without_a_key(calls: Calls, client_for: ClientFor) -> None:
    app = build_app(calls)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(app)

    response = client.post("/payments", json={"amount": 5})

    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith(":missing-key")
    assert calls.counts.get("payments") is None


def test_an_opted_in_route_runs_once_per_key_and_replays(
    calls: Calls, client_for: ClientFor
) -> None:
    app = build_app(calls)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(app)
    key = new_key()

    first = client.post("/payments", json={"amount": 5}, headers={"Idempotency-Key": key})
    retry = client.post("/payments", json={"amount": 5}, headers={"Idempotency-Key": key})
    reused = client.post("/payments", json={"amount": 6}, headers={"Idempotency-Key": key})

    assert first.status_code == retry.status_code == 200
    assert retry.content == first.content
    assert retry.headers["idempotent-replayed"] == "true"
    assert reused.status_code == 422
    assert calls.counts["payments"] == 1


def test_the_dependency_gives_the_handler_the_parsed_key(
    calls: Calls, client_for: ClientFor
) -> None:
    app = build_app(calls)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(app)

    keyed = client.post("/orders/7", headers={"Idempotency-Key": '"order-7-a"'})
    unkeyed = client.post("/orders/7")
    again = client.post("/orders/7")

    assert keyed.json() == {"order": 7, "key": "order-7-a", "call": 1}
    # Not required: without a key it runs every time, and the handler is told so.
    assert unkeyed.json() == {"order": 7, "key": None, "call": 2}
    assert again.json()["call"] == 3


def test_a_route_without_the_dependency_is_untouched(calls: Calls, client_for: ClientFor) -> None:
    app = build_app(calls)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(app)
    key = new_key()

    first = client.post("/plain", headers={"Idempotency-Key": key})
    second = client.post("/plain", headers={"Idempotency-Key": key})

    assert (first.json(), second.json()) == ({"call": 1}, {"call": 2})
    assert "idempotent-replayed" not in second.headers


def test_another_method_of_the_same_path_falls_through_to_the_options(
    calls: Calls, client_for: ClientFor
) -> None:
    # POST /orders/{order_id} is opted in; PUT on the same path is not, so it gets what the
    # middleware's own options say (here: PUT is covered), unlike a rule, which would
    # decide every method of its path.
    app = build_app(calls)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), methods=["PUT"])
    client = client_for(app)
    key = new_key()

    assert client.put("/orders/1").status_code == 200  # covered, no key: passes through
    put_first = client.put("/orders/1", headers={"Idempotency-Key": key})
    put_retry = client.put("/orders/1", headers={"Idempotency-Key": key})
    post_first = client.post("/orders/1", headers={"Idempotency-Key": key})
    post_retry = client.post("/orders/1", headers={"Idempotency-Key": key})

    assert put_retry.headers["idempotent-replayed"] == "true"
    assert put_retry.content == put_first.content
    assert post_retry.headers["idempotent-replayed"] == "true"
    assert post_first.json()["key"] == key.strip('"')
    assert calls.counts == {"orders": 1, "put-orders": 2}


def test_an_opt_in_comes_before_the_rules(calls: Calls, client_for: ClientFor) -> None:
    app = build_app(calls)
    app.add_middleware(
        IdempotencyMiddleware,
        store=MemoryStore(),
        rules=[IdempotencyRule("/{rest:path}", enabled=False)],
    )
    client = client_for(app)
    key = new_key()

    client.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": key})
    retry = client.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": key})
    plain = client.post("/plain", headers={"Idempotency-Key": key})
    plain_again = client.post("/plain", headers={"Idempotency-Key": key})

    assert retry.headers["idempotent-replayed"] == "true"
    assert (plain.json()["call"], plain_again.json()["call"]) == (1, 2)  # the rule: off


def test_the_opt_in_settings_reach_the_policy(calls: Calls, client_for: ClientFor) -> None:
    clock = FakeClock()
    tenant = scope_by_header("X-Api-Key")
    app = build_app(calls, ttl_seconds=30, lock_timeout_seconds=9, scope=tenant)
    middleware = IdempotencyMiddleware(
        app, store=MemoryStore(clock=clock), clock=clock, ttl_seconds=3600, **ONLY_OPT_INS
    )
    client = client_for(middleware)
    key = new_key()

    def pay(api_key: str) -> httpx.Response:
        headers = {"Idempotency-Key": key, "X-Api-Key": api_key}
        return client.post("/payments", json={"amount": 1}, headers=headers)

    assert pay("alice").json()["call"] == 1
    assert pay("alice").headers["idempotent-replayed"] == "true"
    assert pay("bob").json()["call"] == 2  # the opt-in's scope keeps bob's key apart
    clock.advance(31)  # past the opt-in's TTL, well within the middleware's
    assert pay("alice").json()["call"] == 3

    assert middleware.options.policy_for("POST", "/payments") == Policy(
        route="/payments",
        required=True,
        ttl_seconds=30,
        lock_timeout_seconds=9,
        scope=tenant,
        renewal_interval=3.0,
        route_opt_in=True,
    )


def test_routes_are_read_at_lifespan_start_up(calls: Calls, client_for: ClientFor) -> None:
    app = build_app(calls)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(app, lifespan=True)

    @app.post("/late", dependencies=[Depends(IdempotencyKey())])
    async def late() -> dict[str, Any]:
        return {"call": calls.record("late")}

    # The routes were read when the server started: /late came after, so its opt-in was
    # never applied, and its dependency refuses to let the handler run unprotected.
    response = client.post("/late", headers={"Idempotency-Key": new_key()})
    assert response.status_code == 500
    assert "define the route before the app starts" in response.json()["error"]
    assert "late" not in calls.counts
    assert client.post("/payments", json={}).status_code == 400  # read at start-up


def test_without_the_middleware_the_dependency_refuses_to_run_the_handler(
    calls: Calls, client_for: ClientFor
) -> None:
    client = client_for(build_app(calls))

    response = client.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": "k"})

    assert response.status_code == 500
    error = response.json()["error"]
    assert error.startswith("POST /payments: this route has IdempotencyKey")
    assert "app.add_middleware(IdempotencyMiddleware" in error
    assert "payments" not in calls.counts


def test_a_safe_method_of_an_opted_in_route_gets_none(client_for: ClientFor) -> None:
    app = FastAPI()

    @app.api_route("/things", methods=["GET", "POST"])
    async def things(key: Annotated[str | None, Depends(IdempotencyKey())]) -> dict[str, Any]:
        return {"key": key}

    client = client_for(IdempotencyMiddleware(app, store=MemoryStore(), **ONLY_OPT_INS))

    assert client.get("/things", headers={"Idempotency-Key": "k"}).json() == {"key": None}
    assert client.post("/things", headers={"Idempotency-Key": "k"}).json() == {"key": "k"}


class PassThrough:
    """Any middleware that keeps the app it wraps in ``.app``, as ASGI middlewares do."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def test_routes_are_found_through_the_middlewares_around_the_app(
    calls: Calls, client_for: ClientFor
) -> None:
    app = build_app(calls)
    client = client_for(IdempotencyMiddleware(PassThrough(app), store=MemoryStore()))

    assert client.post("/payments", json={}).status_code == 400


def test_a_mounted_applications_routes_are_read_under_their_mount_path(
    calls: Calls, client_for: ClientFor
) -> None:
    outer = FastAPI()
    outer.mount("/v1", build_app(calls))
    outer.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(outer)
    key = new_key()

    assert client.post("/v1/payments", json={}).status_code == 400
    client.post("/v1/payments", json={}, headers={"Idempotency-Key": key})
    retry = client.post("/v1/payments", json={}, headers={"Idempotency-Key": key})
    assert retry.headers["idempotent-replayed"] == "true"
    assert calls.counts["payments"] == 1


def test_a_middleware_inside_a_mounted_application_matches_its_own_routes(
    calls: Calls, client_for: ClientFor
) -> None:
    # The middleware sees /v1/payments with root_path /v1; the sub-app's route is
    # /payments. Opt-ins match the path the sub-app's router matches.
    inner = build_app(calls)
    inner.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    outer = FastAPI()
    outer.mount("/v1", inner)
    client = client_for(outer)
    key = new_key()

    assert client.post("/v1/payments", json={}).status_code == 400
    client.post("/v1/payments", json={}, headers={"Idempotency-Key": key})
    retry = client.post("/v1/payments", json={}, headers={"Idempotency-Key": key})
    assert retry.headers["idempotent-replayed"] == "true"


# --- reading routes, without a server ---------------------------------------------------


def test_route_rules_are_the_routes_templates_and_coverable_methods() -> None:
    app = FastAPI()
    shared = IdempotencyKey(required=True)
    router = APIRouter(prefix="/api", dependencies=[Depends(shared)])

    @router.api_route("/items/{item_id:int}", methods=["PUT", "DELETE", "GET"])
    async def item(item_id: int, key: Annotated[str | None, Depends(shared)]) -> None: ...

    app.include_router(router)

    @app.websocket("/ws")
    async def socket(key: Annotated[str | None, Depends(IdempotencyKey())]) -> None: ...

    app.router.routes.append(Host("other.example", app=build_app(Calls())))

    rules = route_rules(app)

    # One rule: the router's dependency and the parameter are the same opt-in; the
    # WebSocket route and the Host's routes are not read.
    assert rules == [
        IdempotencyRule("/api/items/{item_id:int}", methods=["DELETE", "PUT"], required=True)
    ]


def test_a_route_with_two_different_opt_ins_is_refused() -> None:
    app = FastAPI()

    @app.post("/x", dependencies=[Depends(IdempotencyKey(ttl_seconds=5))])
    async def x(key: Annotated[str | None, Depends(IdempotencyKey())]) -> None: ...

    with pytest.raises(ValueError, match=r"/x carries 2 IdempotencyKey .*ttl_seconds=5"):
        route_rules(app)


def test_safe_routes_are_skipped_so_a_router_wide_opt_in_may_hold_get_routes() -> None:
    app = FastAPI()
    router = APIRouter(prefix="/shop", dependencies=[Depends(IdempotencyKey(required=True))])

    @router.get("/report")
    async def report() -> None: ...

    @router.post("/orders")
    async def order() -> None: ...

    app.include_router(router)

    assert route_rules(app) == [IdempotencyRule("/shop/orders", methods=["POST"], required=True)]


def test_a_route_without_an_opt_in_shadows_a_later_opt_in_as_the_router_does(
    calls: Calls, client_for: ClientFor
) -> None:
    app = FastAPI()

    @app.post("/items/special")
    async def special() -> dict[str, Any]:
        return {"call": calls.record("special")}

    @app.post("/items/{item_id}", dependencies=[Depends(IdempotencyKey(required=True))])
    async def item(item_id: str) -> dict[str, Any]:
        return {"call": calls.record("item")}

    @app.post("/after")  # after the last opt-in: shadows nothing, so not read
    async def after() -> None: ...

    assert route_rules(app) == [
        IdempotencyRule("/items/special", methods=["POST"], enabled=False),
        IdempotencyRule("/items/{item_id}", methods=["POST"], required=True),
    ]
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **ONLY_OPT_INS)
    client = client_for(app)
    key = new_key()

    # /items/special is its own route, without an opt-in: no 400 for want of a key, and a
    # key changes nothing (it runs every time, nothing stored under the other template).
    assert client.post("/items/special").status_code == 200
    assert client.post("/items/special", headers={"Idempotency-Key": key}).json() == {"call": 2}
    assert client.post("/items/special", headers={"Idempotency-Key": key}).json() == {"call": 3}
    # The opted-in route still requires its key.
    assert client.post("/items/7").status_code == 400
    assert calls.counts == {"special": 3}


def test_a_refused_opt_in_fails_the_servers_start_up(caplog: pytest.LogCaptureFixture) -> None:
    app = FastAPI()

    @app.post("/x", dependencies=[Depends(IdempotencyKey(ttl_seconds=5))])
    async def x(key: Annotated[str | None, Depends(IdempotencyKey())]) -> None: ...

    app.add_middleware(IdempotencyMiddleware, store=MemoryStore())
    # uvicorn's default lifespan mode ("auto") serves on when a lifespan scope raises; the
    # middleware answers lifespan.startup.failed instead, so the server does not start.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None))
    with (
        caplog.at_level(logging.ERROR, logger="uvicorn.error"),
        pytest.raises(SystemExit) as exited,
    ):
        asyncio.run(server.serve())

    assert exited.value.code == 3  # uvicorn's STARTUP_FAILURE
    assert not server.started
    messages = [record.getMessage() for record in caplog.records]
    assert any("/x carries 2 IdempotencyKey" in message for message in messages), messages


def test_an_app_without_routes_has_no_opt_ins() -> None:
    async def bare(scope: Scope, receive: Receive, send: Send) -> None: ...

    class Loop:
        def __init__(self) -> None:
            self.app = self

    assert route_rules(bare) == []
    assert route_rules(Loop()) == []


@pytest.mark.parametrize(
    "settings",
    [
        {"ttl_seconds": 0},
        {"lock_timeout_seconds": -1},
        {"scope": "tenant"},
    ],
)
def test_opt_in_settings_are_validated_at_construction(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        IdempotencyKey(**settings)


def test_the_package_and_its_middleware_never_import_fastapi() -> None:
    # A Starlette (or any ASGI) app served by the middleware: the FastAPI integration is
    # not imported, so no route is read and FastAPI is never loaded.
    program = """
import asyncio, sys
import httpx
from idempotency_middleware import IdempotencyMiddleware, MemoryStore

async def app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"made"})

async def main():
    middleware = IdempotencyMiddleware(app, store=MemoryStore())
    transport = httpx.ASGITransport(middleware)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for _ in range(2):
            response = await client.post("/orders", headers={"Idempotency-Key": "k"})
    print(response.status_code, response.headers.get("idempotent-replayed"))
    print(sorted(name for name in ("fastapi", "starlette") if name in sys.modules))

asyncio.run(main())
"""
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines() == ["201 true", "[]"]
