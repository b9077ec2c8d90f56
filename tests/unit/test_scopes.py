"""Ready-made scope callables and the read-only request view they receive."""

from __future__ import annotations

import pytest

from idempotency_middleware import HeaderView, RequestView, scope_by_header, scope_by_tenant_header


def view(*headers: tuple[str, str]) -> RequestView:
    return RequestView(
        method="POST", path="/orders", route="/orders", query="", headers=HeaderView(headers)
    )


# --- HeaderView -------------------------------------------------------------------------


def test_header_view_is_case_insensitive() -> None:
    headers = HeaderView([("X-Api-Key", "secret")])
    assert headers["x-api-key"] == "secret"
    assert headers["X-API-KEY"] == "secret"
    assert headers.get("x-Api-key") == "secret"
    assert "X-API-Key" in headers
    assert "x-other" not in headers


def test_header_view_get_returns_a_default_for_missing_headers() -> None:
    headers = HeaderView([])
    assert headers.get("authorization") is None
    assert headers.get("authorization", "") == ""
    with pytest.raises(KeyError):
        headers["authorization"]


def test_header_view_joins_repeated_headers() -> None:
    headers = HeaderView([("Accept", "a"), ("X-Other", "o"), ("accept", "b"), ("ACCEPT", "c")])
    assert headers["accept"] == "a, b, c"
    assert len(headers) == 2
    assert sorted(headers) == ["accept", "x-other"]


def test_header_view_is_read_only() -> None:
    headers = HeaderView([("a", "1")])
    assert not hasattr(headers, "__setitem__")
    assert not hasattr(headers, "__delitem__")


def test_header_view_does_not_treat_non_strings_as_names() -> None:
    name: object = b"a"
    assert name not in HeaderView([("a", "1")])


# --- scope_by_header --------------------------------------------------------------------


def test_scope_by_header_never_returns_the_credential() -> None:
    scope = scope_by_header("Authorization")
    value = scope(view(("Authorization", "Bearer sk_live_abcdef123456")))
    assert value
    assert "sk_live_abcdef123456" not in value
    assert "Bearer" not in value


def test_scope_by_header_is_stable_for_one_credential() -> None:
    scope = scope_by_header()
    assert scope(view(("Authorization", "Bearer a"))) == scope(view(("authorization", "Bearer a")))


def test_scope_by_header_differs_between_credentials() -> None:
    scope = scope_by_header("X-Api-Key")
    assert scope(view(("X-Api-Key", "key-one"))) != scope(view(("X-Api-Key", "key-two")))


def test_scope_by_header_without_the_header_is_the_empty_scope() -> None:
    assert scope_by_header()(view()) == ""
    assert scope_by_header("X-Api-Key")(view(("Authorization", "Bearer a"))) == ""


def test_scope_by_header_name_is_case_insensitive() -> None:
    scope = scope_by_header("X-API-KEY")
    assert scope(view(("x-api-key", "k"))) == scope_by_header("x-api-key")(view(("X-Api-Key", "k")))
    assert scope(view(("x-api-key", "k"))) != ""


def test_scope_by_header_distinguishes_a_credential_from_its_hash() -> None:
    scope = scope_by_header()
    hashed = scope(view(("Authorization", "a")))
    assert scope(view(("Authorization", hashed))) != hashed


# --- scope_by_tenant_header -------------------------------------------------------------


def test_scope_by_tenant_header_differs_between_tenants() -> None:
    scope = scope_by_tenant_header()
    assert scope(view(("X-Tenant-Id", "acme"))) != scope(view(("X-Tenant-Id", "globex")))


def test_scope_by_tenant_header_is_stable_for_one_tenant() -> None:
    scope = scope_by_tenant_header("X-Org")
    assert scope(view(("X-Org", "acme"))) == scope(view(("x-org", "acme")))


def test_scope_by_tenant_header_keeps_tenants_apart_from_the_anonymous_scope() -> None:
    scope = scope_by_tenant_header()
    assert scope(view(("X-Tenant-Id", "acme"))) != scope(view())


def test_tenant_and_credential_scopes_do_not_collide() -> None:
    tenant = scope_by_tenant_header("X-Value")
    credential = scope_by_header("X-Value")
    hashed = credential(view(("X-Value", "v")))
    assert tenant(view(("X-Value", hashed))) != hashed
