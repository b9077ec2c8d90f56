"""The request view a ``scope`` callable gets: its repr names headers, never their values."""

from __future__ import annotations

from idempotency_middleware import HeaderView


def test_the_header_view_repr_lists_names_but_never_values() -> None:
    headers = HeaderView([("Authorization", "Bearer sk_live_secret"), ("X-Tenant", "acme")])
    text = repr(headers)
    assert text == "HeaderView(['authorization', 'x-tenant'])"
    assert "sk_live_secret" not in text
    assert len(headers) == 2
