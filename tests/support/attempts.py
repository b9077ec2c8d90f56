"""An attempt as the engine gets it from a door: ``POST /orders`` with key ``key-1``, for
tests that step flows by hand (tests/unit/test_engine.py, tests/e2e/test_wait.py), and the
bookkeeping effects (events, the replay cache) such a test performs as the drivers do."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from idempotency_middleware import HeaderView, RequestView
from idempotency_middleware.engine import decisions
from idempotency_middleware.engine.effects import Effect, Emit, Recall, Remember, emit
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.policy.options import Options


def order_attempt(options: Options, now: float, body: bytes) -> decisions.Attempt:
    policy = options.policy_for("POST", "/orders")
    assert policy is not None
    admitted = decisions.admit(options, policy, "/orders", [b"key-1"])
    assert isinstance(admitted, decisions.Admitted)
    return decisions.begin_attempt(
        admitted,
        method="POST",
        path="/orders",
        query_string=b"",
        content_type=b"application/json",
        body=body,
        request_view=lambda route: RequestView("POST", "/orders", route, "", HeaderView(())),
        now=now,
        owner=new_owner(),
    )


# What a flow yields besides the store calls and runs a test scripts: its events and its
# replay cache. A hand-stepping test performs them as the drivers do (``bookkeeping``).
BOOKKEEPING = (Emit, Recall, Remember)


def bookkeeping(effect: Effect) -> Any:
    """Perform an ``Emit``, ``Recall`` or ``Remember`` as both drivers do; its result."""
    if isinstance(effect, Emit):
        emit(effect)
        return None
    if isinstance(effect, Recall):
        return effect.cache.get(effect.key_hash, effect.now)
    assert isinstance(effect, Remember), effect
    effect.cache.put(effect.record, effect.now)
    return None


def without_bookkeeping(running: Generator[Effect, Any, Any]) -> Generator[Effect, Any, Any]:
    """``running`` as a test steps it by hand: its bookkeeping performed on the way, every
    other effect passed through (closing this closes ``running``)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = running.send(value) if error is None else running.throw(error)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        if isinstance(effect, BOOKKEEPING):
            value = bookkeeping(effect)
            continue
        try:
            value = yield effect
        except GeneratorExit:
            running.close()
            raise
        except BaseException as raised:
            error = raised
