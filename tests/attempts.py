"""An attempt as the engine gets it from a door: ``POST /orders`` with key ``key-1``, for
tests that step flows by hand (tests/test_engine.py, tests/test_wait.py)."""

from __future__ import annotations

from idempotency_middleware import HeaderView, RequestView, core
from idempotency_middleware.options import Options


def order_attempt(options: Options, now: float, body: bytes) -> core.Attempt:
    policy = options.policy_for("POST", "/orders")
    assert policy is not None
    admitted = core.admit(options, policy, "/orders", [b"key-1"])
    assert isinstance(admitted, core.Admitted)
    return core.begin_attempt(
        admitted,
        method="POST",
        path="/orders",
        query_string=b"",
        content_type=b"application/json",
        body=body,
        request_view=lambda route: RequestView("POST", "/orders", route, "", HeaderView(())),
        now=now,
    )
