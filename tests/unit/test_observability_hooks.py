"""``on_event`` takes a sequence of hooks; the metrics hooks need their extras, and record
a duplicate's wait."""

from __future__ import annotations

import sys
import threading

import pytest
from prometheus_client import CollectorRegistry

from idempotency_middleware import (
    IdempotencyEvent,
    IdempotencyMiddleware,
    IdempotentConsumer,
    MemoryStore,
    idempotent,
)
from idempotency_middleware.events import Hooks, one_hook
from idempotency_middleware.observability import OpenTelemetry, Prometheus


def test_every_hook_of_a_sequence_hears_every_event() -> None:
    first: list[str] = []
    second: list[str] = []

    @idempotent(
        store=MemoryStore(),
        key=lambda order: order,
        on_event=[lambda e: first.append(e.kind), lambda e: second.append(e.kind)],
    )
    def charge(order: str) -> str:
        return order

    charge("order-1")
    assert first == second == ["claimed", "completed"]


def test_a_hook_of_a_sequence_that_raises_costs_only_its_own_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []

    def broken(event: IdempotencyEvent) -> None:
        raise RuntimeError("metrics backend down")

    hook = one_hook([broken, lambda event: heard.append(event.kind)])
    assert isinstance(hook, Hooks)
    hook(IdempotencyEvent("claimed", "hash", "POST", "/orders"))
    assert heard == ["claimed"]
    assert "on_event hook" in caplog.text


@pytest.mark.parametrize("on_event", [42, "hook", [print, 42], (None,)])
def test_on_event_that_is_neither_a_hook_nor_a_sequence_of_hooks_is_refused(
    on_event: object,
) -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="on_event must be a callable"):
        IdempotencyMiddleware(app, store=MemoryStore(), on_event=on_event)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_event must be a callable"):
        IdempotentConsumer(
            print,
            store=MemoryStore(),
            key=str,
            on_event=on_event,  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="on_event must be a callable"):
        MemoryStore(on_event=on_event)  # type: ignore[arg-type]


def test_a_store_takes_a_sequence_of_hooks() -> None:
    registry = CollectorRegistry()
    heard: list[IdempotencyEvent] = []
    store = MemoryStore(on_event=[Prometheus(registry=registry), heard.append])
    assert store.observers.observers == (Prometheus(registry=registry),)


@pytest.mark.parametrize(
    ("hook", "module", "extra"),
    [(Prometheus, "prometheus_client", "prometheus"), (OpenTelemetry, "opentelemetry", "otel")],
)
def test_a_hook_without_its_library_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, hook: type, module: str, extra: str
) -> None:
    for name in list(sys.modules):
        if name == module or name.startswith(f"{module}."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ModuleNotFoundError, match=rf"idempotency-middleware\[{extra}\]"):
        hook()


def test_a_duplicate_that_waited_records_its_wait() -> None:
    registry = CollectorRegistry()
    started, finish = threading.Event(), threading.Event()

    @idempotent(
        store=MemoryStore(),
        key=lambda order: order,
        name="charge",
        wait_seconds=30,
        on_event=Prometheus(registry=registry),
    )
    def charge(order: str) -> str:
        started.set()
        assert finish.wait(30)
        return order

    first = threading.Thread(target=charge, args=("order-1",))
    first.start()
    assert started.wait(30)
    waiting = threading.Thread(target=charge, args=("order-1",))
    waiting.start()
    # The duplicate is waiting once it has claimed in vain: its first poll is on the store.
    while not any(
        s.name == "idempotency_store_duration_seconds_count" and s.value >= 2
        for family in registry.collect()
        for s in family.samples
        if s.labels.get("operation") == "claim"
    ):
        waiting.join(0.01)
    finish.set()
    first.join(30)
    waiting.join(30)

    waits = [
        (s.labels, s.value)
        for family in registry.collect()
        for s in family.samples
        if s.name == "idempotency_wait_duration_seconds_count"
    ]
    assert waits == [({"door": "function", "route": "charge", "store": "memory"}, 1.0)]
