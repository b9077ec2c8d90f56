"""``Options``: validation at construction, and the policy each request resolves to."""

from __future__ import annotations

import math
from typing import Any

import pytest

from idempotency_middleware import IdempotencyRule, RequestView
from idempotency_middleware.policy.options import (
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_TTL_SECONDS,
    Options,
    Policy,
)


def tenant_scope(request: RequestView) -> str:
    return "tenant"


def user_scope(request: RequestView) -> str:
    return "user"


# --- defaults ---------------------------------------------------------------------------


def test_defaults_match_the_documented_ones() -> None:
    options = Options.build()
    assert options.header_name == "Idempotency-Key"
    assert options.header_key == b"idempotency-key"
    assert options.environ_key == "HTTP_IDEMPOTENCY_KEY"
    assert options.methods == frozenset({"POST", "PATCH"})
    assert options.required is False
    assert options.ttl_seconds == DEFAULT_TTL_SECONDS == 86400
    assert options.lock_timeout_seconds == DEFAULT_LOCK_TIMEOUT_SECONDS == 60
    assert options.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 1024 * 1024
    assert options.rules == ()
    assert options.scope is None


def test_unmatched_covered_request_uses_the_defaults_with_its_path_as_route() -> None:
    # route None: no template matched, so the concrete path is the route (core.admit).
    assert Options.build().policy_for("POST", "/orders") == Policy(
        route=None,
        required=False,
        ttl_seconds=86400,
        lock_timeout_seconds=60,
        scope=None,
        renewal_interval=20.0,  # three renewals per lock timeout
    )


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"])
def test_methods_outside_the_defaults_pass_through(method: str) -> None:
    assert Options.build().policy_for(method, "/orders") is None


def test_custom_header_name_sets_the_asgi_and_wsgi_lookups() -> None:
    options = Options.build(header_name="X-Request-Key")
    assert options.header_key == b"x-request-key"
    assert options.environ_key == "HTTP_X_REQUEST_KEY"


def test_custom_methods_are_covered() -> None:
    options = Options.build(methods=["post", "put", "delete"])
    assert options.methods == frozenset({"POST", "PUT", "DELETE"})
    assert options.policy_for("DELETE", "/orders/1") is not None
    assert options.policy_for("PATCH", "/orders/1") is None


# --- rules ------------------------------------------------------------------------------


def test_rule_fields_left_none_inherit_the_defaults() -> None:
    options = Options.build(
        required=True, ttl_seconds=3600, lock_timeout_seconds=30, scope=tenant_scope,
        rules=[IdempotencyRule("/orders/{order_id}/refunds", ttl_seconds=600)],
    )  # fmt: skip
    assert options.policy_for("POST", "/orders/7/refunds") == Policy(
        route="/orders/{order_id}/refunds",
        required=True,
        ttl_seconds=600,
        lock_timeout_seconds=30,
        scope=tenant_scope,
        renewal_interval=10.0,
    )


def test_rule_fields_override_the_defaults() -> None:
    options = Options.build(
        required=True,
        scope=tenant_scope,
        rules=[
            IdempotencyRule(
                "/payments",
                required=False,
                ttl_seconds=10,
                lock_timeout_seconds=2.5,
                scope=user_scope,
            )
        ],
    )
    assert options.policy_for("POST", "/payments") == Policy(
        route="/payments",
        required=False,
        ttl_seconds=10,
        lock_timeout_seconds=2.5,
        scope=user_scope,
        renewal_interval=2.5 / 3,
    )


def test_policy_route_is_the_template_not_the_path() -> None:
    options = Options.build(rules=[IdempotencyRule("/orders/{order_id}/refunds")])
    first = options.policy_for("POST", "/orders/1/refunds")
    second = options.policy_for("POST", "/orders/2/refunds")
    assert first is not None and second is not None
    assert first.route == second.route == "/orders/{order_id}/refunds"


def test_first_matching_rule_wins() -> None:
    options = Options.build(
        rules=[
            IdempotencyRule("/orders/special", ttl_seconds=5),
            IdempotencyRule("/orders/{order_id}", ttl_seconds=10),
            IdempotencyRule("/{rest:path}", ttl_seconds=20),
        ]
    )
    special = options.policy_for("POST", "/orders/special")
    other = options.policy_for("POST", "/orders/7")
    fallback = options.policy_for("POST", "/payments/1")
    assert special is not None and special.ttl_seconds == 5
    assert other is not None and other.ttl_seconds == 10
    assert fallback is not None and fallback.ttl_seconds == 20
    assert fallback.route == "/{rest:path}"


def test_disabled_rule_lets_its_routes_pass_through() -> None:
    options = Options.build(
        required=True,
        rules=[IdempotencyRule("/webhooks/{name}", enabled=False), IdempotencyRule("/{p:path}")],
    )
    assert options.policy_for("POST", "/webhooks/stripe") is None
    assert options.policy_for("POST", "/orders") is not None


def test_rule_methods_cover_put_and_delete_beyond_the_defaults() -> None:
    options = Options.build(rules=[IdempotencyRule("/items/{item_id}", methods=["PUT", "DELETE"])])
    assert options.policy_for("PUT", "/items/1") is not None
    assert options.policy_for("DELETE", "/items/1") is not None
    # Rules match on the path alone: the rule's methods replace the defaults on its route.
    assert options.policy_for("POST", "/items/1") is None
    assert options.policy_for("GET", "/items/1") is None
    # Other routes keep the defaults.
    assert options.policy_for("POST", "/orders") is not None
    assert options.policy_for("PUT", "/orders") is None


def test_rule_without_methods_uses_the_middleware_methods() -> None:
    options = Options.build(methods=["PUT"], rules=[IdempotencyRule("/items/{item_id}")])
    assert options.policy_for("PUT", "/items/1") is not None
    assert options.policy_for("POST", "/items/1") is None


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["ttl_seconds", "lock_timeout_seconds"])
@pytest.mark.parametrize("value", [0, -1, -0.001, True, False, math.nan, "60"])
def test_non_positive_deadline_is_refused(field: str, value: Any) -> None:
    settings: dict[str, Any] = {field: value}
    with pytest.raises(ValueError):
        Options.build(**settings)


@pytest.mark.parametrize("field", ["ttl_seconds", "lock_timeout_seconds"])
def test_missing_middleware_deadline_is_refused(field: str) -> None:
    # None means "inherit" on a rule, but the middleware has nothing to inherit from: a None
    # here would only fail later, as a TypeError on the first request (now + None).
    settings: dict[str, Any] = {field: None}
    with pytest.raises(ValueError):
        Options.build(**settings)


@pytest.mark.parametrize("field", ["ttl_seconds", "lock_timeout_seconds"])
def test_infinite_deadline_is_refused(field: str) -> None:
    # An infinite deadline cannot be written as DynamoDB's epoch-seconds TTL attribute
    # (math.ceil(inf) raises at request time), so it must fail at start-up instead.
    settings: dict[str, Any] = {field: math.inf}
    with pytest.raises(ValueError):
        Options.build(**settings)


@pytest.mark.parametrize("methods", [["GET"], ["POST", "HEAD"], ["OPTIONS"], ["CONNECT"], ["X"]])
def test_uncoverable_or_unknown_method_is_refused(methods: list[str]) -> None:
    with pytest.raises(ValueError):
        Options.build(methods=methods)


def test_method_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(ValueError):
        Options.build(methods="POST")


@pytest.mark.parametrize(
    "header_name",
    ["", "Idempotency Key", "Idempotency-Key:", "Idempotency-Key\r\nX: y", "Clé", "a(b)", " Key"],
)
def test_bad_header_name_is_refused(header_name: str) -> None:
    with pytest.raises(ValueError):
        Options.build(header_name=header_name)


def test_non_string_header_name_is_refused() -> None:
    with pytest.raises(ValueError):
        Options.build(header_name=b"Idempotency-Key")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1024", None])
def test_non_positive_max_body_bytes_is_refused(value: Any) -> None:
    with pytest.raises(ValueError):
        Options.build(max_body_bytes=value)


def test_non_callable_scope_is_refused() -> None:
    with pytest.raises(ValueError):
        Options.build(scope="tenant")  # type: ignore[arg-type]


def test_rules_must_be_rule_objects() -> None:
    with pytest.raises(ValueError):
        Options.build(rules=["/orders"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(
            [IdempotencyRule("/orders"), IdempotencyRule("/orders", ttl_seconds=5)],
            id="duplicate-template",
        ),
        pytest.param(
            [IdempotencyRule("/orders/{id}"), IdempotencyRule("/orders/{order_id}")],
            id="same-template-other-name",
        ),
        pytest.param(
            [IdempotencyRule("/{rest:path}"), IdempotencyRule("/orders")],
            id="after-catch-all",
        ),
        pytest.param(
            [IdempotencyRule("/{p:path}"), IdempotencyRule("/orders/{id}", methods=["PUT"])],
            id="after-catch-all-other-methods",
        ),
        pytest.param(
            [
                IdempotencyRule("/{p:path}", enabled=False),
                IdempotencyRule("/orders/{id}"),
            ],
            id="after-disabled-catch-all",
        ),
    ],
)
def test_unreachable_rule_is_refused(rules: list[IdempotencyRule]) -> None:
    with pytest.raises(ValueError):
        Options.build(rules=rules)


@pytest.mark.parametrize(
    "later",
    ["/api/orders", "/api/{resource}"],
)
def test_rule_after_a_prefix_catch_all_is_refused(later: str) -> None:
    # "/api/{rest:path}" matches every path the later rule could match, so it never wins.
    with pytest.raises(ValueError):
        Options.build(rules=[IdempotencyRule("/api/{rest:path}"), IdempotencyRule(later)])


def test_rule_beside_a_prefix_catch_all_is_fine() -> None:
    options = Options.build(
        rules=[IdempotencyRule("/api/{rest:path}"), IdempotencyRule("/api"), IdempotencyRule("/x")]
    )
    assert len(options.rules) == 3


def test_catch_all_last_is_fine() -> None:
    options = Options.build(rules=[IdempotencyRule("/orders"), IdempotencyRule("/{rest:path}")])
    assert len(options.rules) == 2


def test_the_middlewares_typed_options_are_exactly_what_options_build_takes() -> None:
    import inspect

    from idempotency_middleware.policy.options import MiddlewareOptions

    build = inspect.signature(Options.build).parameters
    assert set(MiddlewareOptions.__annotations__) == set(build)


@pytest.mark.parametrize("door", ["asgi", "wsgi"])
def test_an_unknown_option_is_refused_at_construction_by_name(door: str) -> None:
    from idempotency_middleware import IdempotencyMiddleware, IdempotencyWSGIMiddleware, MemoryStore

    make = IdempotencyMiddleware if door == "asgi" else IdempotencyWSGIMiddleware
    with pytest.raises(TypeError, match="ttl"):
        make(lambda *args: None, store=MemoryStore(), ttl=5)  # type: ignore[call-arg, arg-type]


def test_a_clock_without_the_clock_methods_is_refused() -> None:
    with pytest.raises(ValueError, match="clock"):
        Options.build(clock=object())  # type: ignore[arg-type]


# --- problem_base_url -------------------------------------------------------------------


def test_problem_base_url_is_unset_by_default() -> None:
    assert Options.build().problem_base_url is None


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/problems/",
        "http://localhost:8000/problems/",
        "https://docs.example.com/errors#",
        "https://api.example.com/problems?slug=",
        "https://[::1]:8443/p/",
    ],
)
def test_an_absolute_http_url_is_a_problem_base_url(url: str) -> None:
    assert Options.build(problem_base_url=url).problem_base_url == url


@pytest.mark.parametrize(
    "url",
    [
        "",
        "/problems/",
        "problems",
        "urn:example:problem:",
        "ftp://example.com/problems/",
        "https://",
        "https:///problems/",
        "https://example.com/a b/",
        "https://example.com/<x>",
        'https://example.com/"x"',
        "https://example.com/\r\nX-Injected: 1",
        "https://exämple.com/",
        "https://[::1/",
        b"https://example.com/",
        42,
    ],
)
def test_anything_else_is_refused_as_a_problem_base_url(url: Any) -> None:
    with pytest.raises(ValueError, match="problem_base_url"):
        Options.build(problem_base_url=url)


# --- route opt-ins (with_route_rules) -------------------------------------------------------


def opt_in(path: str, *methods: str, **settings: Any) -> IdempotencyRule:
    return IdempotencyRule(path, methods=list(methods), **settings)


def test_a_route_opt_in_matches_on_its_template_and_method() -> None:
    options = Options.build(methods=["PATCH"]).with_route_rules(
        [opt_in("/orders/{order_id}", "POST", required=True, ttl_seconds=5)]
    )

    policy = options.policy_for("POST", "/orders/7")
    assert policy == Policy(
        route="/orders/{order_id}",
        required=True,
        ttl_seconds=5,
        lock_timeout_seconds=60,
        scope=None,
        renewal_interval=20.0,
        route_opt_in=True,
    )
    # Another method of the same path falls through to the defaults (PATCH covered, PUT not).
    fallback = options.policy_for("PATCH", "/orders/7")
    assert fallback is not None and fallback.route is None and not fallback.route_opt_in
    assert options.policy_for("PUT", "/orders/7") is None
    assert options.policy_for("POST", "/orders") is None


def test_route_opt_ins_come_before_the_rules() -> None:
    options = Options.build(rules=[IdempotencyRule("/{rest:path}", enabled=False)])
    opted = options.with_route_rules([opt_in("/payments", "POST")])

    assert options.policy_for("POST", "/payments") is None
    assert opted.policy_for("POST", "/payments") is not None
    assert opted.policy_for("POST", "/orders") is None  # the rule still holds elsewhere


def test_with_route_rules_replaces_and_leaves_the_original_alone() -> None:
    options = Options.build(methods=())
    first = options.with_route_rules([opt_in("/a", "POST")])
    second = first.with_route_rules([opt_in("/b", "POST")])

    assert options.route_policies == ()
    assert first.policy_for("POST", "/a") is not None
    assert second.policy_for("POST", "/a") is None
    assert second.policy_for("POST", "/b") is not None


def test_a_route_without_an_opt_in_sends_the_requests_it_matches_to_the_rules() -> None:
    options = Options.build(
        methods=(), rules=[IdempotencyRule("/items/special", methods=["POST"], required=True)]
    ).with_route_rules(
        [
            IdempotencyRule("/items/special", methods=["POST"], enabled=False),
            IdempotencyRule("/items/{item_id}", methods=["POST", "PUT"], ttl_seconds=5),
        ]
    )
    special = options.policy_for("POST", "/items/special")
    assert special is not None and special.route == "/items/special" and special.required
    # PUT is not the blocking route's method: the opt-in takes it.
    put = options.policy_for("PUT", "/items/special")
    assert put is not None and put.route == "/items/{item_id}" and put.ttl_seconds == 5
    assert options.policy_for_template("POST", "/items/special") == special


def test_route_rules_must_be_rule_objects() -> None:
    with pytest.raises(ValueError, match="IdempotencyRule"):
        Options.build().with_route_rules(["/orders"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("path", "root_path", "covered"),
    [
        ("/v1/payments", "/v1", True),  # a mounted app's own route, under its mount
        ("/payments", "/v1", True),  # a server that keeps the root path out of the path
        ("/v1/payments", "", False),
        ("/v1x/payments", "/v1", False),  # /v1 is not a segment prefix of /v1x
        ("/v1", "/v1", False),
    ],
)
def test_route_opt_ins_match_the_path_without_the_root_path(
    path: str, root_path: str, covered: bool
) -> None:
    options = Options.build(methods=()).with_route_rules([opt_in("/payments", "POST")])
    assert (options.policy_for("POST", path, root_path) is not None) is covered


def test_the_rules_keep_matching_the_whole_path_under_a_root_path() -> None:
    options = Options.build(rules=[IdempotencyRule("/v1/payments", required=True)])
    policy = options.policy_for("POST", "/v1/payments", "/v1")
    assert policy is not None and policy.required


# --- policies for route templates (OpenAPI) ---------------------------------------------


def test_policy_for_template() -> None:
    options = Options.build(
        rules=[
            IdempotencyRule("/internal/{rest:path}", enabled=False),
            IdempotencyRule("/orders/{id:int}", ttl_seconds=7),
            IdempotencyRule("/items/{item_id}", methods=["PUT"]),
        ]
    ).with_route_rules([opt_in("/internal/jobs", "POST", required=True)])

    def ttl(method: str, template: str) -> float | None:
        policy = options.policy_for_template(method, template)
        return None if policy is None else policy.ttl_seconds

    assert ttl("POST", "/orders/{order_id}") == 7  # same shape, another name
    assert ttl("PATCH", "/orders/{order_id}/lines") == 86400  # the defaults
    assert ttl("PUT", "/items/{x}") == 86400
    assert ttl("POST", "/items/{x}") is None  # the rule decides every method of its path
    assert ttl("POST", "/internal/reports") is None  # switched off
    internal = options.policy_for_template("POST", "/internal/jobs")  # the opt-in wins
    assert internal is not None and internal.required
    assert ttl("GET", "/orders") is None


@pytest.mark.parametrize(
    ("rule", "template", "matches"),
    [
        ("/orders/{order_id}", "/orders/{id}", True),
        ("/orders/{id:int}", "/orders/{order_id}", True),
        ("/orders/{id:int}", "/orders/{order_id:int}", True),
        ("/files/{rest:path}", "/files/{a}/{b}", True),
        ("/orders", "/orders/{id}", False),
        ("/orders/{id:int}/x", "/orders/{order_id}", False),
    ],
)
def test_template_matches(rule: str, template: str, matches: bool) -> None:
    from idempotency_middleware.policy.options import template_matches

    assert template_matches(IdempotencyRule(rule), template) is matches
