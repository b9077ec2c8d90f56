"""``document_idempotency``: the OpenAPI schema shows the key header and the middleware's own
responses on exactly the operations the middleware covers."""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header
from fastapi.middleware.gzip import GZipMiddleware
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_middleware import IdempotencyMiddleware, IdempotencyRule, MemoryStore
from idempotency_middleware.fastapi import (
    PROBLEM_SCHEMA_NAME,
    IdempotencyKey,
    document_idempotency,
)
from idempotency_middleware.policy.keys import InvalidKey, parse_idempotency_key
from idempotency_middleware.web.fastapi import KEY_PATTERN
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi

PROBLEM_REF = {"$ref": f"#/components/schemas/{PROBLEM_SCHEMA_NAME}"}
MIDDLEWARE_STATUSES = {"400", "409", "410", "413", "422", "500", "503"}
BASE = "https://api.example.com/problems/"


def build_app(**options: Any) -> FastAPI:
    """Routes covered by the defaults (POST /orders), by a rule (POST /payments, required),
    by an opt-in (PUT /items/{item_id}, required), switched off by a rule (POST
    /internal/jobs), not covered (GET /orders), and one under a router prefix."""
    app = FastAPI()

    @app.post("/orders")
    async def create_order(order: dict[str, Any]) -> dict[str, Any]:
        return order

    @app.get("/orders")
    async def list_orders() -> list[Any]:
        return []

    @app.post("/payments", responses={409: {"description": "Payment declined"}})
    async def pay() -> None: ...

    @app.put("/items/{item_id}", dependencies=[Depends(IdempotencyKey(required=True))])
    async def put_item(item_id: int) -> None: ...

    @app.post("/internal/jobs")
    async def job() -> None: ...

    @app.post("/accounts/{account_id}/close")
    async def close(account_id: int) -> None: ...

    @app.patch("/profile")
    async def profile(
        idempotency_key: Annotated[str | None, Header(description="declared by the app")] = None,
    ) -> None: ...

    router = APIRouter(prefix="/v2")

    @router.post("/refunds")
    async def refund() -> None: ...

    app.include_router(router)
    app.add_middleware(
        IdempotencyMiddleware,
        store=MemoryStore(),
        rules=[
            IdempotencyRule("/payments", required=True),
            IdempotencyRule("/internal/{rest:path}", enabled=False),
            IdempotencyRule("/accounts/{id:int}/close", ttl_seconds=60),
        ],
        **options,
    )
    app.add_middleware(GZipMiddleware)  # listed before ours in app.user_middleware
    document_idempotency(app)
    return app


def operation(schema: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    found: dict[str, Any] = schema["paths"][path][method]
    return found


def key_parameter(op: dict[str, Any]) -> dict[str, Any] | None:
    found = [
        parameter
        for parameter in op.get("parameters", [])
        if parameter["in"] == "header" and parameter["name"].lower() == "idempotency-key"
    ]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize(
    ("path", "method", "required"),
    [
        ("/orders", "post", False),  # the defaults
        ("/payments", "post", True),  # a rule
        ("/items/{item_id}", "put", True),  # an opt-in beside the route
        ("/accounts/{account_id}/close", "post", False),  # a rule with a convertor
        ("/v2/refunds", "post", False),  # under a router prefix
        ("/profile", "patch", False),  # declared by the app too: ours replaces it
    ],
)
def test_a_covered_operation_documents_the_key_header(
    path: str, method: str, required: bool
) -> None:
    op = operation(build_app().openapi(), path, method)

    parameter = key_parameter(op)
    assert parameter is not None
    assert parameter["name"] == "Idempotency-Key"
    assert parameter["required"] is required
    assert parameter["schema"]["maxLength"] >= 255
    assert "retry" in parameter["description"]
    assert set(op["responses"]) >= MIDDLEWARE_STATUSES


@pytest.mark.parametrize(
    ("path", "method"),
    [("/orders", "get"), ("/internal/jobs", "post")],
)
def test_an_operation_the_middleware_does_not_cover_gets_nothing(path: str, method: str) -> None:
    undocumented = FastAPI.openapi(build_app())  # the schema as FastAPI makes it
    documented = build_app().openapi()

    assert operation(documented, path, method) == operation(undocumented, path, method)
    assert key_parameter(operation(documented, path, method)) is None


def test_the_middlewares_responses_are_problem_json_with_a_shared_schema() -> None:
    schema = build_app().openapi()
    op = operation(schema, "/orders", "post")

    for status in MIDDLEWARE_STATUSES:
        media = op["responses"][status]["content"]["application/problem+json"]
        assert media["schema"] == PROBLEM_REF
        for example in media["examples"].values():
            assert example["value"]["status"] == int(status)
            assert example["value"]["type"].startswith("urn:idempotency-middleware:problem:")
    assert set(op["responses"]["409"]["headers"]) == {"Retry-After"}
    assert set(op["responses"]["503"]["headers"]) == {"Retry-After"}
    assert "headers" not in op["responses"]["400"]  # no Link without a problem_base_url
    problem = schema["components"]["schemas"][PROBLEM_SCHEMA_NAME]
    assert problem["required"] == ["type", "title", "status", "detail"]
    assert set(problem["properties"]) == {"type", "title", "status", "detail"}
    # The 413 example states the middleware's own limit.
    example = op["responses"]["413"]["content"]["application/problem+json"]["examples"]
    assert str(1024 * 1024) in example["body-too-large"]["value"]["detail"]


def test_fastapis_validation_422_and_ours_are_told_apart_by_media_type() -> None:
    response = operation(build_app().openapi(), "/orders", "post")["responses"]["422"]

    assert set(response["content"]) == {"application/json", "application/problem+json"}
    assert response["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HTTPValidationError"
    }
    assert response["content"]["application/problem+json"]["schema"] == PROBLEM_REF
    assert response["description"].startswith("Validation Error")
    assert "reused" in response["description"]


def test_a_response_the_route_declares_keeps_its_description_and_gains_ours() -> None:
    response = operation(build_app().openapi(), "/payments", "post")["responses"]["409"]

    assert response["description"].startswith("Payment declined")
    assert "in progress" in response["description"]
    assert "application/problem+json" in response["content"]


def test_a_missing_key_example_only_where_a_key_is_required() -> None:
    schema = build_app().openapi()

    def examples(path: str, method: str) -> set[str]:
        response = operation(schema, path, method)["responses"]["400"]
        return set(response["content"]["application/problem+json"]["examples"])

    assert examples("/payments", "post") == {"missing-key", "invalid-key"}
    assert examples("/orders", "post") == {"invalid-key"}


def test_the_middlewares_options_shape_the_documentation() -> None:
    schema = build_app(
        header_name="X-Request-Key", problem_base_url=BASE, methods=["PATCH"], required=True
    ).openapi()

    assert key_parameter(operation(schema, "/orders", "post")) is None  # POST not covered now
    op = operation(schema, "/profile", "patch")
    parameter = next(p for p in op["parameters"] if p["name"] == "X-Request-Key")
    assert parameter["required"] is True
    assert set(op["responses"]["400"]["headers"]) == {"Link"}
    assert set(op["responses"]["422"]["headers"]) == {"Link"}
    assert set(op["responses"]["409"]["headers"]) == {"Retry-After"}
    examples = op["responses"]["422"]["content"]["application/problem+json"]["examples"]
    assert examples["key-reused"]["value"]["type"] == BASE + "key-reused"


def test_a_middleware_that_covers_nothing_adds_nothing() -> None:
    app = FastAPI()

    @app.post("/orders")
    async def create_order() -> None: ...

    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), methods=())
    document_idempotency(app)

    assert app.openapi() == FastAPI.openapi(app)
    assert PROBLEM_SCHEMA_NAME not in app.openapi().get("components", {}).get("schemas", {})


def test_documenting_is_idempotent() -> None:
    app = build_app()
    first = copy.deepcopy(app.openapi())
    document_idempotency(app)
    second = app.openapi()
    app.openapi_schema = None  # FastAPI builds the schema again: documented again
    third = app.openapi()

    assert first == second == third
    assert third is not second


def test_a_directly_wrapped_app_is_documented_from_the_middleware_it_names() -> None:
    app = FastAPI()

    @app.post("/orders")
    async def create_order() -> None: ...

    middleware = IdempotencyMiddleware(app, store=MemoryStore(), required=True)
    document_idempotency(app, middleware=middleware)

    parameter = key_parameter(operation(app.openapi(), "/orders", "post"))
    assert parameter is not None and parameter["required"] is True


def test_an_app_without_the_middleware_is_a_clear_error() -> None:
    app = FastAPI()
    document_idempotency(app)

    with pytest.raises(LookupError, match=r"app.add_middleware\(IdempotencyMiddleware"):
        app.openapi()


def test_the_served_openapi_json_is_the_documented_schema() -> None:
    app = build_app(problem_base_url=BASE)
    with serve_asgi(app) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS) as c:
        served = c.get("/openapi.json")
        docs = c.get("/docs")

    assert served.status_code == 200
    assert served.json() == app.openapi()
    assert key_parameter(served.json()["paths"]["/orders"]["post"]) is not None
    assert docs.status_code == 200


# --- the header's schema says exactly what the parser accepts ---------------------------

KEY_RE = re.compile(KEY_PATTERN)
KEY_ALPHABET = st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from(
    ["\t", "\x7f", "é", ","]
)


def parses(value: str) -> bool:
    try:
        return parse_idempotency_key([value.encode("latin-1", "replace")]) is not None
    except InvalidKey:
        return False


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(KEY_ALPHABET, max_size=300),
        st.text(KEY_ALPHABET, max_size=300).map(lambda text: f'"{text}"'),
        st.text(st.sampled_from('ab\\"'), max_size=12).map(lambda text: f'"{text}"'),
    )
)
def test_the_key_pattern_accepts_what_the_middleware_accepts(value: str) -> None:
    # Leading and trailing blanks are the server's business (they are trimmed first).
    if value != value.strip(" \t"):
        return
    assert (KEY_RE.match(value) is not None) == parses(value), value


@pytest.mark.parametrize(
    "value",
    ["a" * 255, '"' + "a" * 255 + '"', '"' + '\\"' * 255 + '"', "8e03978e-40d5", '"a,b"'],
)
def test_the_key_pattern_accepts_the_longest_keys(value: str) -> None:
    assert KEY_RE.match(value) is not None
    assert len(value) <= 512
    assert parses(value)
