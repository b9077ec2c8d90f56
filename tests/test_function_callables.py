"""What ``idempotent`` decorates besides plain functions: callable objects and partials
(their return annotation is their ``__call__``'s / the wrapped function's), and what it
refuses with a message that names the function."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from idempotency_middleware import MemoryStore, idempotent


@dataclasses.dataclass
class Receipt:
    number: int


class Handler:
    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, key: str) -> Receipt:
        self.runs += 1
        return Receipt(self.runs)


def test_a_callable_object_is_decorated_and_its_result_rebuilt_from_its_call() -> None:
    handler = Handler()
    handle = idempotent(store=MemoryStore(), key="key")(handler)

    first = handle("k-1")
    replay = handle("k-1")

    assert first == replay == Receipt(1)
    assert type(replay) is Receipt
    assert handler.runs == 1


def make_receipt(prefix: int, key: str) -> Receipt:
    return Receipt(prefix)


def test_a_partial_is_rebuilt_from_the_wrapped_functions_annotation() -> None:
    store = MemoryStore()
    handle = idempotent(store=store, key=lambda key: key, name="receipts")(
        functools.partial(make_receipt, 7)
    )

    assert handle(key="k-1") == handle(key="k-1") == Receipt(7)
    assert type(handle(key="k-1")) is Receipt


def test_an_unresolvable_return_annotation_is_a_type_error_naming_the_function() -> None:
    def dangling(key: str) -> NotDefinedAnywhere:  # type: ignore[name-defined]  # noqa: F821
        return {"a": 1}

    handle = idempotent(store=MemoryStore(), key="key")(dangling)

    with pytest.raises(TypeError, match="dangling: its return annotation cannot be resolved"):
        handle("k-1")
    # The key was released: fixing nothing, a retry fails the same way (it ran again).
    with pytest.raises(TypeError, match="cannot be resolved"):
        handle("k-1")
