"""``IdempotencyRule``: Starlette-style route templates, anchored matching, validation."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest

from idempotency_middleware import IdempotencyRule
from idempotency_middleware.policy.rules import compile_template

# --- matching ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/orders/42/refunds", "/orders/abc-DEF_1.2/refunds", "/orders/%20/refunds"],
)
def test_str_parameter_matches_one_segment(path: str) -> None:
    assert IdempotencyRule("/orders/{order_id}/refunds").matches(path)


@pytest.mark.parametrize(
    "path",
    [
        "/orders//refunds",
        "/orders/1/2/refunds",
        "/orders/42/refunds/",
        "/orders/42/refunds/extra",
        "/api/orders/42/refunds",
        "/orders/42/refund",
        "/orders/42/refundsX",
        "orders/42/refunds",
        "/orders/42/refunds\n",
    ],
)
def test_str_parameter_does_not_match_partially(path: str) -> None:
    assert not IdempotencyRule("/orders/{order_id}/refunds").matches(path)


@pytest.mark.parametrize("path", ["/orders/1", "/ordersx", "/x/orders", "/orders/", "/Orders", ""])
def test_literal_template_matches_only_itself(path: str) -> None:
    rule = IdempotencyRule("/orders")
    assert rule.matches("/orders")
    assert not rule.matches(path)


@pytest.mark.parametrize("path", ["/files/a", "/files/a/b/c.txt", "/files/", "/files/a//b/"])
def test_path_parameter_matches_the_rest(path: str) -> None:
    assert IdempotencyRule("/files/{rest:path}").matches(path)


@pytest.mark.parametrize("path", ["/files", "/file/a", "/x/files/a"])
def test_path_parameter_keeps_its_prefix_anchored(path: str) -> None:
    assert not IdempotencyRule("/files/{rest:path}").matches(path)


def test_int_parameter() -> None:
    rule = IdempotencyRule("/orders/{id:int}")
    assert rule.matches("/orders/12")
    assert rule.matches("/orders/0")
    for path in (
        "/orders/abc",
        "/orders/1a",
        "/orders/-1",
        "/orders/1.5",
        "/orders/",
        "/orders/1/",
    ):
        assert not rule.matches(path), path


def test_uuid_parameter() -> None:
    rule = IdempotencyRule("/orders/{id:uuid}/capture")
    value = uuid.uuid4()
    assert rule.matches(f"/orders/{value}/capture")
    assert rule.matches(f"/orders/{str(value).upper()}/capture")
    assert not rule.matches(f"/orders/{value.hex}/capture")
    assert not rule.matches("/orders/not-a-uuid/capture")
    assert not rule.matches(f"/orders/{value}x/capture")


def test_float_parameter() -> None:
    rule = IdempotencyRule("/rates/{value:float}")
    assert rule.matches("/rates/1.5")
    assert rule.matches("/rates/2")
    assert not rule.matches("/rates/1.")
    assert not rule.matches("/rates/abc")


def test_several_parameters() -> None:
    rule = IdempotencyRule("/users/{user_id:int}/orders/{order_id}")
    assert rule.matches("/users/7/orders/abc")
    assert not rule.matches("/users/x/orders/abc")


def test_literal_parts_are_not_regular_expressions() -> None:
    rule = IdempotencyRule("/v1.0/a+b/(x)")
    assert rule.matches("/v1.0/a+b/(x)")
    assert not rule.matches("/v1x0/a+b/(x)")
    assert not rule.matches("/v1.0/aab/(x)")
    assert not rule.matches("/v1.0/a+b/x")


def test_compiled_template_is_anchored() -> None:
    pattern = compile_template("/orders/{id}")
    assert pattern.match("/orders/1")
    assert not pattern.match("/orders/1/x")
    assert not pattern.search("/api/orders/1")


# --- construction -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("orders", id="no-leading-slash"),
        pytest.param("", id="empty"),
        pytest.param("orders/{id}", id="relative-with-param"),
        pytest.param("/orders/{id", id="unclosed-brace"),
        pytest.param("/orders/id}", id="unopened-brace"),
        pytest.param("/orders/{id}}", id="extra-closing-brace"),
        pytest.param("/orders/{{id}}", id="doubled-braces"),
        pytest.param("/orders/{id}/{", id="trailing-open-brace"),
        pytest.param("/orders/{id:foo}", id="unknown-convertor"),
        pytest.param("/orders/{id:INT}", id="convertor-case"),
        pytest.param("/a/{id}/b/{id}", id="repeated-parameter"),
        pytest.param("/a/{id}/b/{id:int}", id="repeated-parameter-other-convertor"),
        pytest.param("/orders/{}", id="empty-name"),
        pytest.param("/orders/{1st}", id="name-starts-with-digit"),
        pytest.param("/orders/{order-id}", id="name-with-dash"),
    ],
)
def test_bad_template_is_refused(template: str) -> None:
    with pytest.raises(ValueError):
        IdempotencyRule(template)


def test_non_string_template_is_refused() -> None:
    with pytest.raises(ValueError):
        IdempotencyRule(123)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["ttl_seconds", "lock_timeout_seconds"])
@pytest.mark.parametrize("value", [0, -1, -0.5, 0.0, True, False, math.nan, "10"])
def test_non_positive_deadline_is_refused(field: str, value: Any) -> None:
    settings: dict[str, Any] = {field: value}
    with pytest.raises(ValueError):
        IdempotencyRule("/orders", **settings)


@pytest.mark.parametrize("field", ["ttl_seconds", "lock_timeout_seconds"])
def test_infinite_deadline_is_refused(field: str) -> None:
    # An infinite deadline cannot be written as DynamoDB's epoch-seconds TTL attribute.
    settings: dict[str, Any] = {field: math.inf}
    with pytest.raises(ValueError):
        IdempotencyRule("/orders", **settings)


@pytest.mark.parametrize("field", ["ttl_seconds", "lock_timeout_seconds"])
def test_fractional_deadline_is_accepted(field: str) -> None:
    settings: dict[str, Any] = {field: 0.25}
    rule = IdempotencyRule("/orders", **settings)
    assert getattr(rule, field) == 0.25


@pytest.mark.parametrize("methods", [["GET"], ["HEAD"], ["OPTIONS"], ["POST", "TRACE"], ["FETCH"]])
def test_uncoverable_or_unknown_method_is_refused(methods: list[str]) -> None:
    with pytest.raises(ValueError):
        IdempotencyRule("/orders", methods=methods)


def test_method_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(ValueError):
        IdempotencyRule("/orders", methods="POST")


def test_enabled_rule_covering_no_method_is_refused() -> None:
    with pytest.raises(ValueError):
        IdempotencyRule("/orders", methods=[])


def test_disabled_rule_may_cover_no_method() -> None:
    assert not IdempotencyRule("/health", methods=[], enabled=False).enabled


def test_methods_are_normalized_to_upper_case() -> None:
    rule = IdempotencyRule("/items/{id}", methods=["put", "Delete"])
    assert rule.methods == ("DELETE", "PUT")


def test_non_callable_scope_is_refused() -> None:
    with pytest.raises(ValueError):
        IdempotencyRule("/orders", scope="tenant")  # type: ignore[arg-type]


def test_a_path_template_matches_a_rest_holding_a_newline() -> None:
    # A disabled catch-all must not let an encoded newline (%0A) fall back to the defaults.
    rule = IdempotencyRule("/internal/{rest:path}", enabled=False)
    assert rule.matches("/internal/\nx")
    assert rule.matches("/internal/a\r\nb/c")


def test_everything_after_the_path_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        IdempotencyRule("/orders", ["POST"])  # type: ignore[call-arg]
    assert IdempotencyRule("/orders", methods=["POST"]).methods == ("POST",)
