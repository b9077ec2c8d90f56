"""``idempotent``: the function door, held to its contract on every store, for plain and
coroutine functions alike (``tests/support/function_stores.py`` runs each test once per kind).

Each outcome of the contract's table, and each of its bullets, has a test here; the result
codec and the payload fingerprint in depth are ``tests/contract/test_function_results.py``'s.
Time is a fake clock: lock timeouts are crossed by advancing it, never by sleeping.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

import idempotency_middleware
from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyError,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    InvalidKeyError,
    KeyInProgressError,
    KeyReusedError,
    MemoryStore,
    ResultNotStoredError,
    StoreUnavailable,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.engine.decisions import LOST_CLAIM_RELEASE_DELAYS
from idempotency_middleware.functions.idempotent import CALL_METHOD
from idempotency_middleware.stores.records import Status
from idempotency_middleware.testing import FakeClock
from idempotency_middleware.web.asgi_messages import Receive, Scope, Send
from idempotency_middleware.web.wsgi_environ import Environ, StartResponse
from tests.conftest import REGION
from tests.support.faultproxy import FaultProxy
from tests.support.function_stores import (
    CountingStore,
    Events,
    FunctionStore,
    fresh_key,
    function_table,
    open_function_store,
)
from tests.support.ports import free_port
from tests.support.store_kinds import STORE_KINDS


@pytest.fixture(params=STORE_KINDS)
def fstore(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
    """Every store kind; the test's functions are sync or async to match."""
    yield from open_function_store(request, request.param)


HASH = re.compile(r"[0-9a-f]{64}")
FALSY: list[Any] = [None, 0, 0.0, "", [], {}, False]


@dataclasses.dataclass(frozen=True)
class Receipt:
    order: str
    amount: int
    lines: list[str]


def closed_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"


def wait_for_lost_claim_releases(fstore: FunctionStore, store: CountingStore, calls: int) -> None:
    """A claim that failed is released in the background, fenced by its owner token, at
    each of ``LOST_CLAIM_RELEASE_DELAYS`` until one finds it (never, on a store that is
    down): wait for those to end before the store is closed."""
    expected = calls * len(LOST_CLAIM_RELEASE_DELAYS)
    fstore.wait_until(lambda: store.calls["release"] >= expected, "the lost claims' releases")


# --- the outcomes ------------------------------------------------------------------------


def test_a_new_key_runs_the_function_once_and_returns_its_result(fstore: FunctionStore) -> None:
    runs: list[int] = []

    @fstore.decorate(key="key")
    def charge(key: str, amount: int) -> dict[str, Any]:
        runs.append(amount)
        return {"charged": amount, "run": len(runs)}

    assert fstore.run(charge, fresh_key(), 5) == {"charged": 5, "run": 1}
    assert runs == [5]


def test_the_same_key_and_payload_replays_the_stored_result_without_running(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []

    @fstore.decorate(key="key")
    def checkout(key: str, order: str) -> Receipt:
        runs.append(order)
        return Receipt(order, 42, ["a", "b"])

    key = fresh_key()
    first = fstore.run(checkout, key, "o-1")
    replayed = fstore.run(checkout, key, "o-1")
    assert replayed == first == Receipt("o-1", 42, ["a", "b"])
    assert type(replayed) is Receipt
    assert replayed is not first  # rebuilt from the store, not handed back from memory
    assert runs == ["o-1"]


def test_falsy_results_are_replayed_equal_and_of_the_same_type(fstore: FunctionStore) -> None:
    runs: list[Any] = []

    @fstore.decorate(key="key")
    def answer(key: str, index: int) -> Any:
        runs.append(index)
        return FALSY[index]

    for index, value in enumerate(FALSY):
        key = fresh_key()
        assert fstore.run(answer, key, index) == value
        replayed = fstore.run(answer, key, index)
        assert replayed == value and type(replayed) is type(value), (value, replayed)
    assert runs == list(range(len(FALSY)))


def test_positional_keyword_and_default_arguments_are_the_same_payload(
    fstore: FunctionStore,
) -> None:
    runs: list[int] = []

    @fstore.decorate(key="key")
    def charge(key: str, amount: int = 5) -> int:
        runs.append(amount)
        return amount

    key = fresh_key()
    assert fstore.run(charge, key, 5) == 5
    assert fstore.run(charge, key=key, amount=5) == 5
    assert fstore.run(charge, key) == 5
    assert runs == [5]


def test_the_same_key_with_another_payload_raises_key_reused_without_running(
    fstore: FunctionStore,
) -> None:
    runs: list[int] = []

    @fstore.decorate(key="key")
    def charge(key: str, amount: int) -> int:
        runs.append(amount)
        return amount

    key = fresh_key()
    assert fstore.run(charge, key, 5) == 5
    with pytest.raises(KeyReusedError):
        fstore.run(charge, key, 6)
    assert runs == [5]
    assert fstore.run(charge, key, 5) == 5  # the first payload still replays


def test_the_same_key_while_the_first_call_runs_raises_key_in_progress(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []
    hold = fstore.hold()
    events = Events()

    @fstore.decorate(key="key", hold=hold, on_event=events)
    def export(key: str) -> str:
        runs.append(key)
        return "exported"

    key = fresh_key()
    first = fstore.start(export, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    with pytest.raises(KeyInProgressError) as refused:
        fstore.run(export, key)
    assert refused.value.retry_after > 0
    assert [event.kind for event in events.all] == ["claimed", "conflict"]
    hold.open()
    assert first.result() == "exported"
    assert fstore.run(export, key) == "exported"
    assert runs == [key]


def test_a_duplicate_that_waits_gets_the_first_calls_result_without_running(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []
    hold = fstore.hold()

    @fstore.decorate(key="key", hold=hold, wait_seconds=30)
    def export(key: str) -> dict[str, int]:
        runs.append(key)
        return {"rows": 3}

    key = fresh_key()
    first = fstore.start(export, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    # When the duplicate first pauses between polls, the first call is let finish.
    fstore.when_waiting(hold, first)
    assert fstore.run(export, key) == {"rows": 3}
    assert first.result() == {"rows": 3}
    assert runs == [key]
    assert fstore.clock.slept, "the duplicate did not wait"


def test_a_duplicate_that_waits_past_wait_seconds_raises_key_in_progress(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []
    hold = fstore.hold()

    @fstore.decorate(key="key", hold=hold, wait_seconds=5)
    def export(key: str) -> str:
        runs.append(key)
        return "exported"

    key = fresh_key()
    first = fstore.start(export, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    with pytest.raises(KeyInProgressError):
        fstore.run(export, key)
    waited = sum(fstore.clock.slept)
    assert 0 < waited < 5 + 1e-6
    hold.open()
    assert first.result() == "exported"
    assert runs == [key]


def test_an_exception_propagates_and_releases_the_key_so_a_retry_runs(
    fstore: FunctionStore,
) -> None:
    runs: list[int] = []
    events = Events()

    @fstore.decorate(key="key", on_event=events)
    def flaky(key: str) -> str:
        runs.append(len(runs) + 1)
        if len(runs) == 1:
            raise ConnectionError("the payment provider hung up")
        return "paid"

    key = fresh_key()
    with pytest.raises(ConnectionError, match="hung up"):
        fstore.run(flaky, key)
    assert events.kinds() == ["claimed", "released"]
    assert fstore.run(flaky, key) == "paid"
    assert fstore.run(flaky, key) == "paid"
    assert runs == [1, 2]


def test_a_dead_owner_is_taken_over_and_its_completion_fenced_out(
    fstore: FunctionStore,
) -> None:
    hold = fstore.hold()
    events = Events()
    numbers = itertools.count(1)

    @fstore.decorate(key="key", hold=hold, on_event=events)  # lock timeout: 60 s
    def work(key: str) -> int:
        return next(numbers)

    key = fresh_key()
    first = fstore.start(work, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    # Its lease runs out (no renewal came: the clock jumped past the lock timeout).
    fstore.clock.advance(61)
    assert fstore.run(work, key) == 1  # the next call takes over and runs
    hold.open()
    assert first.result() == 2  # the dead owner finishes after all, with its own result
    assert fstore.run(work, key) == 1  # what is stored is the second call's result
    assert next(numbers) == 3  # the function ran twice in all
    assert len(events.of("lost")) == 1  # the first's completion was fenced out
    assert len(events.of("completed")) == 1
    assert events.kinds()[-1] == "replayed"


def test_a_takeover_is_reported_as_taken_over(fstore: FunctionStore) -> None:
    hold = fstore.hold()
    events = Events()

    @fstore.decorate(key="key", hold=hold, on_event=events)
    def work(key: str) -> str:
        return "done"

    key = fresh_key()
    first = fstore.start(work, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    fstore.clock.advance(61)
    assert fstore.run(work, key) == "done"
    hold.open()
    first.result()
    assert events.kinds()[:3] == ["claimed", "taken_over", "completed"]


def test_lease_renewal_keeps_a_long_running_call_from_being_taken_over(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    hold = fstore.hold()
    events = Events()

    # Renewed every 0.1 s of the clock.
    @fstore.decorate(
        key="key", store=counting, hold=hold, lock_timeout_seconds=0.3, on_event=events
    )
    def slow(key: str) -> str:
        return "slow"

    key = fresh_key()
    first = fstore.start(slow, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    fstore.clock.advance(0.2)  # a renewal is due; the lock (0.3) still holds
    fstore.wait_until(lambda: counting.renewed >= 1, "a renewal of the running call's lease")
    fstore.clock.advance(0.2)  # past the first lock, inside the renewed one
    with pytest.raises(KeyInProgressError):
        fstore.run(slow, key)
    hold.open()
    assert first.result() == "slow"
    assert fstore.run(slow, key) == "slow"
    assert not events.of("taken_over")
    assert not events.of("lost")
    assert len(events.of("completed")) == 1


def test_store_unavailable_on_the_claim_fails_closed_without_running(
    fstore: FunctionStore,
) -> None:
    down = CountingStore(fstore.unavailable())
    runs: list[str] = []
    events = Events()

    @fstore.decorate(key="key", store=down, on_event=events)
    def charge(key: str) -> str:
        runs.append(key)
        return "charged"

    with pytest.raises(StoreUnavailableError) as refused:
        fstore.run(charge, fresh_key())
    assert isinstance(refused.value, IdempotencyError)
    assert runs == []
    assert events.of("store_error")[0].operation == "claim"
    wait_for_lost_claim_releases(fstore, down, calls=1)


def test_on_store_error_run_runs_the_function_unprotected(fstore: FunctionStore) -> None:
    down = CountingStore(fstore.unavailable())
    runs: list[str] = []
    events = Events()

    @fstore.decorate(key="key", store=down, on_store_error="run", on_event=events)
    def charge(key: str) -> int:
        runs.append(key)
        return len(runs)

    key = fresh_key()
    assert fstore.run(charge, key) == 1
    assert fstore.run(charge, key) == 2  # unprotected: every call runs
    assert runs == [key, key]
    fail_opens = events.of("fail_open")
    assert len(fail_opens) == 2
    # A claim the circuit breaker refused never reached the store: nothing to release (a
    # fast refusing server opens it with the first claim's background releases).
    sent = sum(1 for event in fail_opens if event.cause != "breaker_open")
    assert sent >= 1
    wait_for_lost_claim_releases(fstore, down, calls=sent)


def recover(store: Any, fault_proxy: FaultProxy, clock: FakeClock) -> None:
    """The network comes back for a store whose failed claim's background releases (one per
    ``LOST_CLAIM_RELEASE_DELAYS``, instant on the fake clock) all met the refusing network:
    with the claim, six failures, so its breaker opens (the default threshold is five). Wait
    for that, then let the cool-down pass, so the next call is its half-open probe, whatever
    the order the releases and the test ran in."""
    deadline = time.monotonic() + 30
    while store.breaker_state != "open":
        assert time.monotonic() < deadline, "the lost claim's releases never opened the breaker"
        time.sleep(0.01)
    fault_proxy.set("pass")
    clock.advance(store.breaker.cooldown_seconds)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_store_behind_a_refusing_network_fails_closed_then_recovers(
    flavour: str, fault_proxy: FaultProxy, moto_endpoint: str
) -> None:
    table = function_table(moto_endpoint)
    clock = FakeClock()
    runs: list[str] = []
    key = fresh_key()

    def charge(key: str) -> str:
        runs.append(key)
        return "charged"

    options: dict[str, Any] = {"endpoint_url": fault_proxy.url, "region_name": REGION}
    fault_proxy.set("refuse")
    if flavour == "sync":
        with DynamoDBStore(table, max_attempts=1, clock=clock, **options) as store:
            sync_charge = idempotent(store=store, key="key", clock=clock)(charge)
            with pytest.raises(StoreUnavailableError):
                sync_charge(key)
            recover(store, fault_proxy, clock)
            assert sync_charge(key) == "charged"
            assert sync_charge(key) == "charged"
    else:

        async def scenario() -> None:
            async with AsyncDynamoDBStore(table, max_attempts=1, clock=clock, **options) as store:

                @idempotent(store=store, key="key", clock=clock)
                async def async_charge(key: str) -> str:
                    return charge(key)

                with pytest.raises(StoreUnavailableError):
                    await async_charge(key)
                await asyncio.to_thread(recover, store, fault_proxy, clock)
                assert await async_charge(key) == "charged"
                assert await async_charge(key) == "charged"

        asyncio.run(scenario())
    assert runs == [key]


def test_an_unserializable_argument_raises_type_error_naming_it_before_any_claim(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    events = Events()
    runs: list[str] = []

    @fstore.decorate(key="key", store=counting, on_event=events)
    def notify(key: str, channel: object) -> str:
        runs.append(key)
        return "sent"

    with pytest.raises(TypeError, match="'channel'"):
        fstore.run(notify, fresh_key(), object())
    assert runs == []
    assert counting.total() == 0, counting.calls
    assert events.all == []


def test_an_unserializable_result_raises_type_error_and_releases_the_key(
    fstore: FunctionStore,
) -> None:
    runs: list[int] = []
    events = Events()

    @fstore.decorate(key="key", on_event=events)
    def tags(key: str) -> Any:
        runs.append(len(runs) + 1)
        return {"b", "a"} if len(runs) == 1 else ["a", "b"]

    key = fresh_key()
    with pytest.raises(TypeError, match=r"result \(set\)"):
        fstore.run(tags, key)
    assert events.kinds() == ["claimed", "released"]
    assert fstore.run(tags, key) == ["a", "b"]  # released: the retry runs
    assert fstore.run(tags, key) == ["a", "b"]
    assert runs == [1, 2]


def test_a_result_too_large_to_keep_completes_and_raises_result_not_stored(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []
    # Incompressible and larger than a DynamoDB item, on every kind.
    big = base64.b64encode(os.urandom(600 * 1024)).decode("ascii")

    @fstore.decorate(key="key")
    def export(key: str) -> str:
        runs.append(key)
        return big

    key = fresh_key()
    assert fstore.run(export, key) == big
    with pytest.raises(ResultNotStoredError) as refused:
        fstore.run(export, key)
    assert refused.value.size >= len(big)
    assert runs == [key]  # completed: it never runs again under this key


def test_a_completed_key_is_kept_for_ttl_seconds_then_runs_again(fstore: FunctionStore) -> None:
    runs: list[int] = []

    @fstore.decorate(key="key", ttl_seconds=100)
    def report(key: str, month: str) -> int:
        runs.append(len(runs) + 1)
        return len(runs)

    key = fresh_key()
    assert fstore.run(report, key, "may") == 1
    fstore.clock.advance(99)
    assert fstore.run(report, key, "may") == 1  # still within its TTL: a replay
    fstore.clock.advance(2)
    assert fstore.run(report, key, "june") == 2  # expired: the key is new work again
    assert runs == [1, 2]


# --- the bullets: methods, keys, payloads, names -----------------------------------------


def test_methods_leave_self_out_of_the_payload(fstore: FunctionStore) -> None:
    runs: list[str] = []

    class Payments:
        def __init__(self, region: str) -> None:
            self.region = region  # and not JSON: in the payload it would be a TypeError

        @fstore.decorate(key="order_id")
        def charge(self, order_id: str, amount: int) -> str:
            runs.append(self.region)
            return f"{self.region}:{amount}"

    key = fresh_key()
    assert fstore.run(Payments("eu").charge, key, 5) == "eu:5"
    assert fstore.run(Payments("us").charge, key, 5) == "eu:5"
    assert runs == ["eu"]
    with pytest.raises(KeyReusedError):
        fstore.run(Payments("us").charge, key, 6)


def test_classmethods_leave_cls_out_of_the_payload(fstore: FunctionStore) -> None:
    runs: list[str] = []

    class Importer:
        source = "ftp"

        @classmethod
        @fstore.decorate(key="batch")
        def load(cls, batch: str) -> str:
            runs.append(cls.source)
            return cls.source

    class S3Importer(Importer):
        source = "s3"

    key = fresh_key()
    assert fstore.run(Importer.load, key) == "ftp"
    assert fstore.run(S3Importer.load, key) == "ftp"
    assert runs == ["ftp"]


def test_the_key_may_be_a_callable_taking_the_arguments(fstore: FunctionStore) -> None:
    runs: list[str] = []

    @fstore.decorate(key=lambda message: message["messageId"])
    def consume(message: dict[str, str]) -> str:
        runs.append(message["body"])
        return message["body"].upper()

    key = fresh_key()
    assert fstore.run(consume, {"messageId": key, "body": "hi"}) == "HI"
    assert fstore.run(consume, message={"messageId": key, "body": "hi"}) == "HI"
    with pytest.raises(KeyReusedError):  # the default payload: the whole message
        fstore.run(consume, {"messageId": key, "body": "other"})
    assert runs == ["hi"]


def test_a_payload_callable_says_what_identifies_the_work(fstore: FunctionStore) -> None:
    runs: list[str] = []

    @fstore.decorate(
        key=lambda message: message["messageId"],
        payload=lambda message: message["body"],
    )
    def consume(message: dict[str, Any]) -> str:
        runs.append(message["receipt"])
        return "done"

    key = fresh_key()
    first = {"messageId": key, "body": {"order": 1}, "receipt": "r-1"}
    redelivered = {"messageId": key, "body": {"order": 1}, "receipt": "r-2"}
    assert fstore.run(consume, first) == "done"
    assert fstore.run(consume, redelivered) == "done"  # the receipt is no part of the work
    with pytest.raises(KeyReusedError):
        fstore.run(consume, {"messageId": key, "body": {"order": 2}, "receipt": "r-3"})
    assert runs == ["r-1"]


def test_name_keeps_keys_across_a_rename(fstore: FunctionStore) -> None:
    runs: list[str] = []

    @fstore.decorate(key="key", name="orders.create")
    def create_order(key: str, amount: int) -> str:
        runs.append("create_order")
        return "created"

    # The same function after a rename (or a move to another module).
    @fstore.decorate(key="key", name="orders.create")
    def place_order(key: str, amount: int) -> str:
        runs.append("place_order")
        return "placed"

    key = fresh_key()
    assert fstore.run(create_order, key, 1) == "created"
    assert fstore.run(place_order, key, 1) == "created"
    assert runs == ["create_order"]


def test_without_name_each_function_has_its_own_keys(fstore: FunctionStore) -> None:
    runs: list[str] = []
    events = Events()

    @fstore.decorate(key="key", on_event=events)
    def create_order(key: str) -> str:
        runs.append("create_order")
        return "created"

    @fstore.decorate(key="key", on_event=events)
    def cancel_order(key: str) -> str:
        runs.append("cancel_order")
        return "cancelled"

    key = fresh_key()
    assert fstore.run(create_order, key) == "created"
    assert fstore.run(cancel_order, key) == "cancelled"
    assert runs == ["create_order", "cancel_order"]
    routes = [event.route for event in events.of("claimed")]
    assert routes == [
        f"{__name__}.{create_order.__qualname__}",
        f"{__name__}.{cancel_order.__qualname__}",
    ]
    assert routes[0].endswith("<locals>.create_order")


def test_required_false_runs_calls_without_a_key_unprotected_every_time(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    runs: list[str | None] = []

    @fstore.decorate(key="key", store=counting, required=False)
    def work(key: str | None) -> int:
        runs.append(key)
        return len(runs)

    assert fstore.run(work, None) == 1
    assert fstore.run(work, None) == 2
    assert fstore.run(work, "") == 3
    assert counting.total() == 0  # the store was never asked
    key = fresh_key()
    assert fstore.run(work, key) == 4  # a key still protects the call
    assert fstore.run(work, key) == 4


@pytest.mark.parametrize("missing", [None, ""], ids=["none", "empty"])
def test_a_missing_or_empty_key_raises_invalid_key_error_a_value_error(
    fstore: FunctionStore, missing: str | None
) -> None:
    runs: list[str | None] = []

    @fstore.decorate(key="key")
    def work(key: str | None) -> str:
        runs.append(key)
        return "ran"

    @fstore.decorate(key=lambda order: order.get("id"))
    def by_callable(order: dict[str, Any]) -> str:
        runs.append("callable")
        return "ran"

    with pytest.raises(InvalidKeyError) as refused:
        fstore.run(work, missing)
    assert isinstance(refused.value, ValueError)
    with pytest.raises(ValueError):
        fstore.run(by_callable, {"id": missing})
    assert runs == []


@pytest.mark.parametrize("key", [42, b"bytes-key"], ids=["int", "bytes"])
def test_a_key_that_is_not_a_str_raises_type_error(fstore: FunctionStore, key: object) -> None:
    runs: list[object] = []

    @fstore.decorate(key="key")
    def work(key: object) -> str:
        runs.append(key)
        return "ran"

    with pytest.raises(TypeError, match="must be a str"):
        fstore.run(work, key)
    assert runs == []


def test_a_key_naming_no_parameter_is_refused_at_decoration(fstore: FunctionStore) -> None:
    def work(order_id: str) -> str:
        return order_id

    with pytest.raises(TypeError, match="'key'"):
        fstore.decorate(key="key")(work)


def test_generator_functions_are_refused_at_decoration(fstore: FunctionStore) -> None:
    def numbers(key: str) -> Iterator[int]:
        yield 1

    async def async_numbers(key: str) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(TypeError, match="generator"):
        idempotent(store=fstore.store, key="key", clock=fstore.clock)(
            async_numbers if fstore.is_async else numbers
        )


def test_an_async_function_with_a_sync_only_store_is_refused_at_decoration() -> None:
    async def work(key: str) -> str:
        return key

    with (
        DynamoDBStore("idem", endpoint_url=closed_endpoint(), region_name=REGION) as store,
        pytest.raises(TypeError, match="needs an async store"),
    ):
        idempotent(store=store, key="key")(work)


def test_a_sync_function_with_an_async_only_store_is_refused_at_decoration() -> None:
    store = AsyncDynamoDBStore("idem", endpoint_url=closed_endpoint(), region_name=REGION)

    def work(key: str) -> str:
        return key

    with pytest.raises(TypeError, match="needs a sync store"):
        idempotent(store=store, key="key")(work)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"key": 5}, TypeError),
        ({"key": ""}, TypeError),
        ({"key": "key", "payload": "amount"}, TypeError),
        ({"key": "key", "name": ""}, TypeError),
        ({"key": "key", "serializer": (repr,)}, TypeError),
        ({"key": "key", "on_store_error": "retry"}, ValueError),
        ({"key": "key", "lock_timeout_seconds": 0}, ValueError),
        ({"key": "key", "wait_seconds": -1}, ValueError),
        ({"key": "key", "replay_cache_size": -1}, ValueError),
    ],
    ids=repr,
)
def test_malformed_options_are_refused_when_the_decorator_is_made(
    options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        idempotent(store=MemoryStore(), **options)


def test_the_exceptions_are_public_and_share_one_base() -> None:
    for name in (
        "KeyInProgressError",
        "KeyReusedError",
        "InvalidKeyError",
        "StoreUnavailableError",
        "ResultNotStoredError",
    ):
        exported = getattr(idempotency_middleware, name)
        assert issubclass(exported, IdempotencyError), name
        assert name in idempotency_middleware.__all__
    assert issubclass(InvalidKeyError, ValueError)
    assert StoreUnavailable is StoreUnavailableError
    assert KeyInProgressError("busy", retry_after=2).retry_after == 2
    assert ResultNotStoredError("too large", size=7).size == 7


# --- one table for functions and HTTP routes ---------------------------------------------


def _asgi_orders(runs: list[str]) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass
        runs.append("http")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b'{"via": "http"}'})

    return app


def _wsgi_orders(runs: list[str]) -> Any:
    def app(environ: Environ, start_response: StartResponse) -> list[bytes]:
        environ["wsgi.input"].read()
        runs.append("http")
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"via": "http"}']

    return app


@pytest.mark.parametrize("name", ["/orders", "POST /orders"])
def test_a_function_and_an_asgi_route_with_the_same_key_both_run(name: str) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    runs: list[str] = []
    key = fresh_key()
    app = IdempotencyMiddleware(_asgi_orders(runs), store=store, clock=clock)

    @idempotent(store=store, key="key", name=name, clock=clock)
    async def create_order(key: str) -> dict[str, str]:
        runs.append("function")
        return {"via": "function"}

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for _ in range(2):
                assert await create_order(key) == {"via": "function"}
                response = await client.post("/orders", headers={"Idempotency-Key": key})
                assert response.status_code == 201
                assert response.json() == {"via": "http"}

    asyncio.run(scenario())
    assert runs == ["function", "http"]  # each ran once, under its own namespace
    assert len(store) == 2


@pytest.mark.parametrize("name", ["/orders", "POST /orders"])
def test_a_function_and_a_wsgi_route_with_the_same_key_both_run(name: str) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    runs: list[str] = []
    key = fresh_key()
    app = IdempotencyWSGIMiddleware(_wsgi_orders(runs), store=store, clock=clock)

    @idempotent(store=store, key="key", name=name, clock=clock)
    def create_order(key: str) -> dict[str, str]:
        runs.append("function")
        return {"via": "function"}

    try:
        transport = httpx.WSGITransport(app=app)
        with httpx.Client(transport=transport, base_url="http://127.0.0.1") as client:
            for _ in range(2):
                response = client.post("/orders", headers={"Idempotency-Key": key})
                assert response.status_code == 201
                assert response.json() == {"via": "http"}
                assert create_order(key) == {"via": "function"}
    finally:
        app.close()
    assert runs == ["http", "function"]
    assert len(store) == 2


# --- what is stored, what is reported, what is cached -----------------------------------


def test_the_store_holds_neither_the_key_nor_the_payload_in_clear(fstore: FunctionStore) -> None:
    events = Events()
    key = fresh_key("secret-key")
    card = fresh_key("secret-card")

    @fstore.decorate(key="key", on_event=events)
    def pay(key: str, card: str) -> str:
        return "paid"

    assert fstore.run(pay, key, card) == "paid"
    key_hash = events.of("claimed")[0].key_hash
    assert HASH.fullmatch(key_hash)
    record = fstore.get(key_hash)
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.response is not None and record.response.body == b'"paid"'
    assert HASH.fullmatch(record.fingerprint)
    stored = repr(record) + fstore.raw(key_hash)
    assert key_hash in stored  # the raw view did find the record
    assert key not in stored
    assert card not in stored
    assert "secret" not in stored


def test_events_carry_method_call_the_name_as_route_and_no_status(
    fstore: FunctionStore,
) -> None:
    events = Events()

    @fstore.decorate(key="key", name="billing.charge", on_event=events)
    def charge(key: str, amount: int) -> int:
        if amount < 0:
            raise ValueError("negative amount")
        return amount

    key, other = fresh_key(), fresh_key()
    fstore.run(charge, key, 1)
    fstore.run(charge, key, 1)
    with pytest.raises(KeyReusedError):
        fstore.run(charge, key, 2)
    with pytest.raises(ValueError):
        fstore.run(charge, other, -1)
    assert events.kinds() == ["claimed", "completed", "replayed", "mismatch", "claimed", "released"]
    for event in events.all:
        assert event.method == CALL_METHOD == "CALL"
        assert event.route == "billing.charge"
        assert event.status is None
        assert HASH.fullmatch(event.key_hash)
        assert key not in repr(event) and other not in repr(event)
    assert len({event.key_hash for event in events.all}) == 2


def test_the_replay_cache_answers_a_second_replay_without_a_store_call(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    runs: list[str] = []

    @fstore.decorate(key="key", store=counting, replay_cache_size=8)
    def lookup(key: str, region: str) -> str:
        runs.append(key)
        return f"{region}-result"

    key = fresh_key()
    assert fstore.run(lookup, key, "eu") == "eu-result"  # claim, complete
    assert fstore.run(lookup, key, "eu") == "eu-result"  # claim (held: completed), cached
    before = counting.total()
    assert before == 3, counting.calls
    assert fstore.run(lookup, key, "eu") == "eu-result"
    with pytest.raises(KeyReusedError):
        fstore.run(lookup, key, "us")
    assert counting.total() == before  # answered from the process's cache
    assert runs == [key]


def test_the_replay_cache_is_off_by_default(fstore: FunctionStore) -> None:
    counting = fstore.counting()

    @fstore.decorate(key="key", store=counting)
    def lookup(key: str) -> str:
        return "result"

    key = fresh_key()
    for _ in range(3):
        assert fstore.run(lookup, key) == "result"
    assert counting.calls["claim"] == 3
