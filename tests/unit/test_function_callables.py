"""What ``idempotent`` decorates besides plain functions: callable objects and partials
(their return annotation is their ``__call__``'s / the wrapped function's), and what it
refuses with a message that names the function."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

import pytest

from idempotency_middleware import (
    IdempotentConsumer,
    MemoryStore,
    StoreUnavailable,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.engine.decisions import Attempt
from idempotency_middleware.engine.effects import Run
from idempotency_middleware.engine.renewal import LoopRenewals
from idempotency_middleware.events import Reporter
from idempotency_middleware.policy.options import Options
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult, Completion
from idempotency_middleware.testing import FakeClock


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


class AsyncHandler:
    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, key: str) -> int:
        self.runs += 1
        return self.runs


def test_an_object_with_an_async_call_is_an_async_function() -> None:
    handler = AsyncHandler()
    handle = idempotent(store=MemoryStore(), key="key")(handler)

    async def twice() -> tuple[int, int]:
        return await handle("k-1"), await handle("k-1")

    assert asyncio.run(twice()) == (1, 1)
    assert handler.runs == 1


def test_a_sync_function_returning_an_awaitable_is_a_type_error_with_the_key_released() -> None:
    async def charge(key: str) -> str:
        return "charged"

    def wrapper(key: str) -> Coroutine[Any, Any, str]:
        return charge(key)

    store = MemoryStore()
    handle = idempotent(store=store, key="key")(wrapper)

    with pytest.raises(TypeError, match="returned an awaitable: decorate the async def"):
        handle("k-1")
    with pytest.raises(TypeError, match="returned an awaitable"):
        # Released: the retry ran (and failed) again; no KeyInProgressError.
        handle("k-1")


@pytest.mark.parametrize(
    "function",
    [lambda key: key, functools.partial(make_receipt, 7)],
    ids=["lambda", "partial"],
)
def test_a_lambda_or_a_partial_needs_a_name(function: Callable[..., Any]) -> None:
    with pytest.raises(TypeError, match="pass name="):
        idempotent(store=MemoryStore(), key=lambda key: key)(function)
    idempotent(store=MemoryStore(), key=lambda key: key, name="named")(function)


class Throttled:
    """A store whose every call fails as DynamoDB does when it throttles."""

    def _fail(self) -> NoReturn:
        error = StoreUnavailable("DynamoDB PutItem failed: throttled")
        error.code = "ThrottlingException"
        raise error

    def claim(self, request: ClaimRequest) -> ClaimResult:
        self._fail()

    def complete(self, completion: Completion) -> bool:
        self._fail()

    def release(self, key_hash: str, owner: str) -> bool:
        self._fail()

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        self._fail()


def test_store_unavailable_error_carries_the_stores_code_and_cause() -> None:
    handle = idempotent(store=Throttled(), key="key")(make_receipt)

    with pytest.raises(StoreUnavailableError) as raised:
        handle(1, "k-1")

    assert raised.value.code == "ThrottlingException"
    assert isinstance(raised.value.__cause__, StoreUnavailable)
    assert "throttled" in str(raised.value.__cause__)


def test_each_event_loop_renews_its_own_claims() -> None:
    # Before, a lease started on a second loop dropped the first loop's leases, so a call
    # still running there went unrenewed and could be taken over (and run twice).
    # The leases are granted at the clock's time, which never moves: no renewal falls due,
    # so each loop's active leases are exactly the ones it started.
    clock = FakeClock()
    renewals = LoopRenewals(MemoryStore(), Reporter(None), clock)
    policy = Options.build().default_policy
    started = threading.Barrier(2, timeout=60)
    finish = threading.Event()
    owners: dict[str, list[str]] = {}

    def lease(owner: str) -> Run:
        granted_at = clock.now()
        claim = ClaimRequest(owner, "fp", owner, granted_at, policy.lock_timeout_seconds)
        return Run(Attempt("CALL", "f", policy, claim), granted_at, http=False)

    async def hold(owner: str) -> None:
        renewals.start(lease(owner))
        started.wait()
        await asyncio.to_thread(finish.wait)
        loop = asyncio.get_running_loop()
        owners[owner] = list(renewals._leases_of(loop).leases.active)
        renewals.stop(owner)

    threads = [threading.Thread(target=asyncio.run, args=(hold(owner),)) for owner in ("a", "b")]
    for thread in threads:
        thread.start()
    finish.set()
    for thread in threads:
        thread.join(timeout=10)
    assert owners == {"a": ["a"], "b": ["b"]}


class Upper:
    def __call__(self, message: str) -> str:
        return message.upper()


@pytest.mark.parametrize(
    ("handler", "name"),
    [
        (str.upper, "builtins.str.upper"),
        (len, "builtins.len"),
        (Upper(), f"{__name__}.Upper"),
    ],
    ids=["unbound-builtin-method", "builtin", "callable-object"],
)
def test_builtins_and_callable_objects_are_named_by_their_module_on_every_door(
    handler: Callable[[str], Any], name: str
) -> None:
    consumer = IdempotentConsumer(handler, store=MemoryStore(), key=str)
    assert consumer.name == name
    assert consumer.process("abc").action == "ack"
    runs = idempotent(store=MemoryStore(), key=lambda *args: "k")(handler)
    assert runs("abc") == handler("abc")


@pytest.mark.parametrize(
    "handler",
    [lambda message: message, functools.partial(str.split, sep=","), "abc".upper],
    ids=["lambda", "partial", "bound-builtin-method"],
)
def test_a_consumer_handler_without_a_name_of_its_own_needs_name(
    handler: Callable[..., Any],
) -> None:
    with pytest.raises(TypeError, match=r"consumer handler .*has no name of its own.*pass name="):
        IdempotentConsumer(handler, store=MemoryStore(), key=str)
    with pytest.raises(TypeError, match="pass name="):
        idempotent(store=MemoryStore(), key=lambda *args: "k")(handler)
    assert IdempotentConsumer(handler, store=MemoryStore(), key=str, name="n").name == "n"
