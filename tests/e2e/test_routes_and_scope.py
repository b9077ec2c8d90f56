"""Per-route configuration (``IdempotencyRule``) and key scoping, on both adapters and both
stores, through real servers.

The scenario of the rules issue, in a few readable lines: payments require a key for 7 days
per API key, order updates are keyed per order, and a route can be switched off.
"""

from __future__ import annotations

import threading
import time
import uuid

import httpx

from idempotency_middleware import IdempotencyRule, RequestView, scope_by_header
from idempotency_middleware.testing import FakeClock
from tests.support.apps import PATCH_ORDER, POST_ORDERS, POST_PAYMENTS, PUT_ORDER
from tests.support.servers import Harness

JSON = {"content-type": "application/json"}


def _key() -> str:
    return f'"{uuid.uuid4()}"'


def _post(
    client: httpx.Client,
    path: str,
    key: str | None,
    body: bytes = b'{"a": 1}',
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    sent = {**JSON, **(headers or {})}
    if key is not None:
        sent["Idempotency-Key"] = key
    return client.post(path, content=body, headers=sent)


PAYMENTS_RULES = [
    IdempotencyRule(
        "/payments", required=True, ttl_seconds=7 * 86400, scope=scope_by_header("X-Api-Key")
    ),
    IdempotencyRule("/orders/{order_id}", methods=["PATCH", "PUT"]),
    IdempotencyRule("/status/{code:int}", enabled=False),
]


def test_a_rule_can_require_a_key_where_the_defaults_do_not(harness: Harness) -> None:
    client = harness.serve(rules=PAYMENTS_RULES)
    refused = _post(client, "/payments", None, headers={"X-Api-Key": "k1"})
    assert refused.status_code == 400
    assert refused.headers["content-type"] == "application/problem+json"
    assert harness.calls(POST_PAYMENTS) == 0
    # Routes without a rule keep the default: no key passes through.
    assert _post(client, "/orders", None).status_code == 201
    assert harness.calls(POST_ORDERS) == 1


def test_scoped_keys_keep_two_clients_apart(harness: Harness) -> None:
    client = harness.serve(rules=PAYMENTS_RULES)
    key = '"1"'  # low entropy on purpose: the case scope exists for
    alice = _post(client, "/payments", key, headers={"X-Api-Key": "alice"})
    bob = _post(client, "/payments", key, headers={"X-Api-Key": "bob"})
    assert alice.status_code == bob.status_code == 201
    assert "idempotent-replayed" not in bob.headers  # bob never sees alice's response
    assert harness.calls(POST_PAYMENTS) == 2
    again = _post(client, "/payments", key, headers={"X-Api-Key": "alice"})
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == alice.content
    assert harness.calls(POST_PAYMENTS) == 2


def test_without_a_scope_the_same_key_is_shared_by_every_client(harness: Harness) -> None:
    client = harness.serve()
    key = '"1"'
    first = _post(client, "/payments", key, headers={"X-Api-Key": "alice"})
    second = _post(client, "/payments", key, headers={"X-Api-Key": "bob"})
    assert second.headers["idempotent-replayed"] == "true"
    assert second.content == first.content  # the leak a scope prevents


def test_a_rule_covers_methods_the_defaults_do_not(harness: Harness) -> None:
    client = harness.serve(rules=PAYMENTS_RULES)
    key = _key()
    first = client.put("/orders/7", content=b'{"x": 1}', headers={**JSON, "Idempotency-Key": key})
    second = client.put("/orders/7", content=b'{"x": 1}', headers={**JSON, "Idempotency-Key": key})
    assert first.status_code == 200
    assert second.headers["idempotent-replayed"] == "true"
    assert harness.calls(PUT_ORDER) == 1


def test_without_a_rule_put_passes_through_even_with_a_key(harness: Harness) -> None:
    client = harness.serve()
    key = _key()
    for _ in range(2):
        client.put("/orders/7", content=b"{}", headers={**JSON, "Idempotency-Key": key})
    assert harness.calls(PUT_ORDER) == 2


def test_the_same_key_on_two_concrete_paths_of_one_template_is_a_422(harness: Harness) -> None:
    client = harness.serve(rules=PAYMENTS_RULES)
    key = _key()
    headers = {**JSON, "Idempotency-Key": key}
    assert client.patch("/orders/1", content=b'{"r": 1}', headers=headers).status_code == 200
    other_order = client.patch("/orders/2", content=b'{"r": 1}', headers=headers)
    assert other_order.status_code == 422  # never a silent replay of order 1's refund
    assert harness.calls(PATCH_ORDER) == 1


def test_a_disabled_rule_leaves_its_route_alone(harness: Harness) -> None:
    client = harness.serve(rules=PAYMENTS_RULES, required=True)
    key = _key()
    for _ in range(2):
        response = client.post("/status/201", headers={"Idempotency-Key": key})
        assert response.status_code == 201
        assert "idempotent-replayed" not in response.headers
    # Even a malformed key is not looked at on a disabled route.
    assert client.post("/status/201", headers={"Idempotency-Key": '"bad'}).status_code == 201


def test_matching_order_decides_first_match_wins(harness: Harness) -> None:
    rules = [
        IdempotencyRule("/orders/{order_id:int}", enabled=False),
        IdempotencyRule("/orders/{order_id}", methods=["PATCH"]),
    ]
    client = harness.serve(rules=rules)
    key = _key()
    headers = {**JSON, "Idempotency-Key": key}
    for _ in range(2):
        client.patch("/orders/5", content=b"{}", headers=headers)  # int: disabled rule wins
    assert harness.calls(PATCH_ORDER) == 2
    client.patch("/orders/abc", content=b"{}", headers=headers)
    replay = client.patch("/orders/abc", content=b"{}", headers=headers)
    assert replay.headers["idempotent-replayed"] == "true"
    assert harness.calls(PATCH_ORDER) == 3


def test_per_route_ttl_overrides_the_default(harness: Harness) -> None:
    clock = FakeClock(time.time())
    client = harness.serve(
        rules=[IdempotencyRule("/orders", ttl_seconds=60)], ttl_seconds=3600, clock=clock
    )
    orders_key, payments_key = _key(), _key()
    _post(client, "/orders", orders_key)
    _post(client, "/payments", payments_key)
    clock.advance(61)  # past the route's TTL, inside the default one
    assert "idempotent-replayed" not in _post(client, "/orders", orders_key).headers
    assert _post(client, "/payments", payments_key).headers["idempotent-replayed"] == "true"
    assert harness.calls(POST_ORDERS) == 2
    assert harness.calls(POST_PAYMENTS) == 1


def test_rule_fields_left_none_inherit_the_middleware_defaults(harness: Harness) -> None:
    # The rule only adds PUT; `required=True` comes from the middleware.
    client = harness.serve(
        rules=[IdempotencyRule("/orders/{order_id}", methods=["PUT"])], required=True
    )
    assert client.put("/orders/1", content=b"{}", headers=JSON).status_code == 400
    assert harness.calls(PUT_ORDER) == 0


def test_a_tenant_scope_separates_tenants_on_every_route(harness: Harness) -> None:
    from idempotency_middleware import scope_by_tenant_header

    client = harness.serve(scope=scope_by_tenant_header("X-Tenant-Id"))
    key = _key()
    _post(client, "/orders", key, headers={"X-Tenant-Id": "acme"})
    other = _post(client, "/orders", key, body=b'{"b": 2}', headers={"X-Tenant-Id": "globex"})
    assert other.status_code == 201  # not a 422: another tenant's key space
    assert harness.calls(POST_ORDERS) == 2


def test_the_scope_callable_gets_the_same_request_view_on_both_adapters(harness: Harness) -> None:
    seen: list[RequestView] = []
    lock = threading.Lock()

    def scope(view: RequestView) -> str:
        with lock:
            seen.append(view)
        return view.headers.get("x-tenant-id", "")

    rules = [IdempotencyRule("/orders/{order_id}", methods=["PATCH"], scope=scope)]
    client = harness.serve(rules=rules)
    client.patch(
        "/orders/42?b=2&a=1",
        content=b"{}",
        headers={**JSON, "Idempotency-Key": _key(), "X-Tenant-ID": "acme"},
    )
    assert len(seen) == 1
    view = seen[0]
    assert view.method == "PATCH"
    assert view.path == "/orders/42"
    assert view.route == "/orders/{order_id}"
    assert view.query == "b=2&a=1"
    assert view.headers["X-TENANT-ID"] == "acme"  # case-insensitive
    assert view.headers.get("content-type") == "application/json"
    assert view.client is not None and view.client[0] == "127.0.0.1"
    assert "missing" not in view.headers
