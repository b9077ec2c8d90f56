"""``IdempotentConsumer``: every delivery gets a verdict for its broker (ack, retry, dead).

The whole table of situations runs on every store kind (``STORE_KINDS``: memory, SQLite,
Redis, PostgreSQL, DynamoDB on moto and on DynamoDB Local), each with a sync and an async
handler; "the store is unavailable" there is a closed port (a missing directory for SQLite).
Handlers are written once as plain functions; ``FunctionStore.adapt`` makes them coroutine
functions for async kinds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotentConsumer,
    InvalidKeyError,
    KeyInProgressError,
    KeyReusedError,
    MemoryStore,
    Outcome,
    StoredResultUnreadableError,
    StoreUnavailableError,
    TransactionConflictError,
    completion_transaction,
    defer_completion,
)
from idempotency_middleware.consumers.consumer import message_payload
from tests.conftest import REGION, new_table
from tests.support.faultproxy import FaultProxy
from tests.support.function_stores import (
    DownStore,
    Events,
    FunctionStore,
    Hold,
    fresh_key,
    function_table,
    open_function_store,
)
from tests.support.store_kinds import STORE_KINDS
from tests.support.transaction_tables import create_business_tables


@pytest.fixture(params=STORE_KINDS)
def fstore(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
    yield from open_function_store(request, request.param)


class Boom(Exception):
    pass


class Handler:
    """A handler recording the messages it ran, failing while ``failures`` lasts."""

    def __init__(self, failures: int = 0) -> None:
        self.runs: list[Any] = []
        self.failures = failures

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        self.runs.append(message["id"])
        if self.failures:
            self.failures -= 1
            raise Boom(f"could not process {message['id']}")
        return {"processed": message["id"]}


def consumer_for(
    fstore: FunctionStore,
    handler: Handler,
    *,
    hold: Hold | None = None,
    store: Any = None,
    **options: Any,
) -> IdempotentConsumer:
    """A consumer of this kind's flavour keyed by the message's ``id``."""

    def handle(message: dict[str, Any]) -> dict[str, Any]:
        return handler(message)

    options.setdefault("name", f"tests.consumers.{fresh_key('orders')}")
    return IdempotentConsumer(
        fstore.adapt(handle, hold),
        store=fstore.store if store is None else store,
        key=lambda message: message["id"],
        clock=fstore.clock,
        **options,
    )


def process(
    fstore: FunctionStore, consumer: IdempotentConsumer, message: Any, count: int | None = None
) -> Outcome:
    method = consumer.aprocess if fstore.is_async else consumer.process
    outcome: Outcome = fstore.run(method, message, count)
    return outcome


def forget(fstore: FunctionStore, consumer: IdempotentConsumer, key: str) -> bool:
    if fstore.is_async:
        return bool(fstore.run(consumer.aforget, key))
    return consumer.forget(key)


def message(key: str | None = None, body: str = "order-1") -> dict[str, Any]:
    return {"id": key or fresh_key(), "body": body}


# -- the table -----------------------------------------------------------------------------


def test_a_new_message_is_acked_with_the_handlers_result(fstore: FunctionStore) -> None:
    handler = Handler()
    consumer = consumer_for(fstore, handler)
    delivered = message()

    assert process(fstore, consumer, delivered) == Outcome("ack", {"processed": delivered["id"]})
    assert handler.runs == [delivered["id"]]


def test_a_redelivery_after_completion_is_acked_with_the_stored_result(
    fstore: FunctionStore,
) -> None:
    handler = Handler()
    consumer = consumer_for(fstore, handler)
    delivered = message()
    process(fstore, consumer, delivered, 1)

    outcome = process(fstore, consumer, delivered, 2)

    assert outcome == Outcome("ack", {"processed": delivered["id"]}, replayed=True)
    assert handler.runs == [delivered["id"]]


def test_a_redelivery_while_the_first_runs_is_retried_later(fstore: FunctionStore) -> None:
    handler = Handler()
    hold = fstore.hold()
    consumer = consumer_for(fstore, handler, hold=hold)
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")

    outcome = process(fstore, consumer, delivered)

    assert outcome.action == "retry"
    assert outcome.retry_after is not None and outcome.retry_after > 0
    assert outcome.result is None and not outcome.replayed
    hold.open()
    assert first.result().action == "ack"
    assert handler.runs == [delivered["id"]]


def test_a_redelivery_while_the_first_runs_comes_back_when_its_claim_could_be_taken_over(
    fstore: FunctionStore,
) -> None:
    # Each redelivery counts against SQS's maxReceiveCount: a duplicate of a long run is put
    # back until the running claim's lock expires (plus the clock skew margin), not for 1 s.
    hold = fstore.hold()
    consumer = consumer_for(
        fstore, Handler(), hold=hold, lock_timeout_seconds=30, clock_skew_seconds=2
    )
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")
    fstore.clock.advance(5)

    outcome = process(fstore, consumer, delivered)

    # Claimed at t, locked until t + 30 (or later, renewed); asked at t + 5: free at t + 32.
    assert outcome.action == "retry" and isinstance(outcome.error, KeyInProgressError)
    assert outcome.retry_after is not None and 27 <= outcome.retry_after <= 32
    assert outcome.retry_after == int(outcome.retry_after)  # whole seconds, rounded up
    hold.open()
    assert first.result().action == "ack"


@pytest.mark.parametrize(("max_attempts", "count"), [(None, 9), (3, None), (3, 2)])
def test_a_failing_handler_below_max_attempts_is_retried_with_the_key_released(
    fstore: FunctionStore, max_attempts: int | None, count: int | None
) -> None:
    handler = Handler(failures=1)
    exhausted: list[Any] = []
    consumer = consumer_for(
        fstore,
        handler,
        max_attempts=max_attempts,
        on_exhausted=lambda message, error: exhausted.append(message),
    )
    delivered = message()

    outcome = process(fstore, consumer, delivered, count)

    assert outcome.action == "retry"
    assert isinstance(outcome.error, Boom)
    assert outcome.retry_after is None and outcome.result is None
    assert exhausted == []
    # Released: the next delivery runs the handler again.
    assert process(fstore, consumer, delivered).action == "ack"
    assert handler.runs == [delivered["id"]] * 2


def test_a_handler_failing_on_its_last_attempt_is_dead_and_redrivable(
    fstore: FunctionStore,
) -> None:
    handler = Handler(failures=1)
    exhausted: list[tuple[Any, Exception]] = []
    consumer = consumer_for(
        fstore,
        handler,
        max_attempts=3,
        on_exhausted=lambda message, error: exhausted.append((message, error)),
    )
    delivered = message()

    outcome = process(fstore, consumer, delivered, 3)

    assert outcome.action == "dead"
    assert isinstance(outcome.error, Boom)
    assert exhausted == [(delivered, outcome.error)]
    # The key was released: a redrive from the dead-letter queue runs it again.
    assert process(fstore, consumer, delivered, 1) == Outcome("ack", {"processed": delivered["id"]})
    assert len(exhausted) == 1


def test_an_on_exhausted_that_raises_makes_the_delivery_a_retry(fstore: FunctionStore) -> None:
    def on_exhausted(message: Any, error: Exception) -> None:
        raise RuntimeError("the dead-letter table is down")

    consumer = consumer_for(fstore, Handler(failures=1), max_attempts=1, on_exhausted=on_exhausted)

    outcome = process(fstore, consumer, message(), 1)

    assert outcome.action == "retry"
    assert isinstance(outcome.error, RuntimeError)
    assert str(outcome.error) == "the dead-letter table is down"


@pytest.mark.parametrize("key", [None, ""])
def test_a_message_without_a_key_is_dead_without_running(
    fstore: FunctionStore, key: str | None
) -> None:
    handler = Handler()
    exhausted: list[Any] = []
    consumer = IdempotentConsumer(
        fstore.adapt(handler),
        store=fstore.store,
        key=lambda message: key,
        name=fresh_key("keyless"),
        on_exhausted=lambda message, error: exhausted.append(error),
        clock=fstore.clock,
    )

    outcome = process(fstore, consumer, message())

    assert outcome.action == "dead"
    assert isinstance(outcome.error, InvalidKeyError)
    assert exhausted == [outcome.error]
    assert handler.runs == []


def test_a_key_reused_with_another_payload_is_dead_and_the_first_record_untouched(
    fstore: FunctionStore,
) -> None:
    handler = Handler()
    exhausted: list[Any] = []
    consumer = consumer_for(
        fstore, handler, on_exhausted=lambda message, error: exhausted.append(error)
    )
    key = fresh_key()
    process(fstore, consumer, message(key, body="order-1"))

    outcome = process(fstore, consumer, message(key, body="order-2"))

    assert outcome.action == "dead"
    assert isinstance(outcome.error, KeyReusedError)
    assert exhausted == [outcome.error]
    assert handler.runs == [key]
    replay = process(fstore, consumer, message(key, body="order-1"))
    assert replay == Outcome("ack", {"processed": key}, replayed=True)


def test_an_unavailable_store_is_a_retry_never_an_ack(fstore: FunctionStore) -> None:
    handler = Handler()
    consumer = consumer_for(fstore, handler, store=fstore.unavailable(), max_attempts=1)

    outcome = process(fstore, consumer, message(), 1)

    assert outcome.action == "retry"
    assert isinstance(outcome.error, StoreUnavailableError)
    assert outcome.retry_after is not None and outcome.retry_after > 0
    assert handler.runs == []


# -- redrive -------------------------------------------------------------------------------


def test_forget_clears_a_completed_key_so_the_next_delivery_runs_again(
    fstore: FunctionStore,
) -> None:
    handler = Handler()
    consumer = consumer_for(fstore, handler)
    delivered = message()
    process(fstore, consumer, delivered)

    assert forget(fstore, consumer, delivered["id"]) is True
    assert forget(fstore, consumer, delivered["id"]) is False
    assert process(fstore, consumer, delivered).replayed is False
    assert handler.runs == [delivered["id"]] * 2


def test_forget_on_an_idempotent_function_clears_its_key(fstore: FunctionStore) -> None:
    runs: list[str] = []

    @fstore.decorate(key="key", name=fresh_key("charge"))
    def charge(key: str) -> str:
        runs.append(key)
        return "charged"

    key = fresh_key()
    fstore.run(charge, key)
    forgotten = fstore.run(charge.aforget, key) if fstore.is_async else charge.forget(key)  # type: ignore[attr-defined]

    assert forgotten is True
    fstore.run(charge, key)
    assert runs == [key, key]


def test_forget_on_an_idempotent_function_also_clears_its_replay_cache(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []

    @fstore.decorate(key="key", name=fresh_key("charge"), replay_cache_size=8)
    def charge(key: str) -> str:
        runs.append(key)
        return "charged"

    key = fresh_key()
    fstore.run(charge, key)
    assert fstore.run(charge, key) == "charged"  # a replay: its record is now in the cache
    forgotten = fstore.run(charge.aforget, key) if fstore.is_async else charge.forget(key)  # type: ignore[attr-defined]

    assert forgotten is True
    assert fstore.run(charge, key) == "charged"
    assert runs == [key, key]  # it ran again, not replayed from the cache
    assert fstore.run(charge, key) == "charged"
    assert runs == [key, key]  # and its new result replays


def test_forget_on_a_consumer_also_clears_its_replay_cache(fstore: FunctionStore) -> None:
    handler = Handler()
    consumer = consumer_for(fstore, handler, replay_cache_size=8)
    delivered = message()
    process(fstore, consumer, delivered)
    assert process(fstore, consumer, delivered).replayed is True  # now in the cache

    assert forget(fstore, consumer, delivered["id"]) is True
    assert process(fstore, consumer, delivered).replayed is False
    assert handler.runs == [delivered["id"]] * 2


def test_required_false_runs_a_message_without_key_unprotected() -> None:
    runs: list[Any] = []
    consumer = IdempotentConsumer(
        runs.append,
        store=MemoryStore(),
        key=lambda m: m.get("id"),
        name=fresh_key(),
        required=False,
    )
    keyless = {"body": "order-1"}
    assert [consumer.process(keyless).action for _ in range(2)] == ["ack", "ack"]
    assert runs == [keyless, keyless]  # no key: each delivery runs
    keyed = message()
    assert [consumer.process(keyed).replayed for _ in range(2)] == [False, True]
    assert runs == [keyless, keyless, keyed]


def test_a_consumer_and_a_function_with_the_same_name_share_their_keys(
    fstore: FunctionStore,
) -> None:
    name = fresh_key("shared")
    runs: list[str] = []

    @fstore.decorate(key=lambda message: message["id"], payload=message_payload, name=name)
    def handle(message: dict[str, Any]) -> dict[str, Any]:
        runs.append(message["id"])
        return {"processed": message["id"]}

    delivered = message()
    fstore.run(handle, delivered)
    consumer = consumer_for(fstore, Handler(), name=name)

    assert process(fstore, consumer, delivered) == Outcome(
        "ack", {"processed": delivered["id"]}, replayed=True
    )
    assert runs == [delivered["id"]]


# -- the attempt's features in a handler ---------------------------------------------------


def test_a_consumers_attempts_are_reported_as_events(fstore: FunctionStore) -> None:
    events = Events()
    name = fresh_key("observed")
    consumer = consumer_for(fstore, Handler(failures=1), name=name, on_event=events)
    delivered = message()

    process(fstore, consumer, delivered)  # fails: released
    process(fstore, consumer, delivered)  # completes
    process(fstore, consumer, delivered)  # replays

    assert events.kinds() == ["claimed", "released", "claimed", "completed", "replayed"]
    assert {event.route for event in events.all} == {name}


def test_a_duplicate_that_waits_is_acked_with_the_first_deliverys_result(
    fstore: FunctionStore,
) -> None:
    handler = Handler()
    hold = fstore.hold()
    consumer = consumer_for(fstore, handler, hold=hold, wait_seconds=30)
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")
    fstore.when_waiting(hold, first)

    outcome = process(fstore, consumer, delivered)

    assert outcome == Outcome("ack", {"processed": delivered["id"]}, replayed=True)
    assert first.result().replayed is False
    assert handler.runs == [delivered["id"]]
    assert fstore.clock.slept, "the duplicate did not wait"


def test_a_long_handler_keeps_its_lease_renewed_so_a_redelivery_is_retried(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    handler = Handler()
    hold = fstore.hold()
    events = Events()
    # Renewed every 0.1 s of the clock.
    consumer = consumer_for(
        fstore, handler, hold=hold, store=counting, lock_timeout_seconds=0.3, on_event=events
    )
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")
    fstore.clock.advance(0.2)  # a renewal is due; the lock (0.3) still holds
    fstore.wait_until(lambda: counting.renewed >= 1, "a renewal of the running lease")
    fstore.clock.advance(0.2)  # past the first lock, inside the renewed one

    assert process(fstore, consumer, delivered).action == "retry"
    hold.open()
    assert first.result().action == "ack"
    assert handler.runs == [delivered["id"]]
    assert not events.of("taken_over")


def test_a_redelivery_takes_over_from_a_dead_owner(fstore: FunctionStore) -> None:
    handler = Handler()
    hold = fstore.hold()
    consumer = consumer_for(fstore, handler, hold=hold)  # lock timeout: 60 s
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")
    fstore.clock.advance(61)  # its lease ran out: no renewal came

    assert process(fstore, consumer, delivered) == Outcome("ack", {"processed": delivered["id"]})
    hold.open()
    assert first.result().action == "ack"  # its completion is fenced out, it still acks
    assert handler.runs == [delivered["id"]] * 2


def test_a_handlers_transaction_commits_with_the_completion(moto_endpoint: str) -> None:
    """On DynamoDB, the handler's writes land with its completion, once; a failed condition
    writes nothing and makes the delivery a retry with the key released."""
    with (
        create_business_tables(moto_endpoint) as tables,
        DynamoDBStore(
            new_table(moto_endpoint), endpoint_url=moto_endpoint, region_name=REGION
        ) as store,
    ):
        runs: list[str] = []

        def place(message: dict[str, Any]) -> str:
            runs.append(message["id"])
            completion_transaction().put(
                tables.orders_table,
                {"id": message["order"]},
                condition="attribute_not_exists(#id)",
                names={"#id": "id"},
            )
            return str(message["order"])

        consumer = IdempotentConsumer(place, store=store, key=lambda m: m["id"], name=fresh_key())
        placed = {"id": "m-1", "order": "o-1"}
        assert consumer.process(placed) == Outcome("ack", "o-1")
        assert consumer.process(placed) == Outcome("ack", "o-1", replayed=True)
        assert tables.order_ids() == ["o-1"]

        clash = {"id": "m-2", "order": "o-1"}  # the order exists: the condition fails
        outcome = consumer.process(clash)
        assert outcome.action == "retry"
        assert isinstance(outcome.error, TransactionConflictError)
        assert runs == ["m-1", "m-2"]
        assert consumer.process(clash).action == "retry"  # released: it ran again
        assert runs == ["m-1", "m-2", "m-2"]


def test_defer_completion_in_a_handler_is_refused_as_in_a_function() -> None:
    def handle(message: Any) -> None:
        defer_completion()

    consumer = IdempotentConsumer(handle, store=MemoryStore(), key=str, name=fresh_key())

    outcome = consumer.process("m-1")

    assert outcome.action == "retry"
    assert isinstance(outcome.error, LookupError)


def test_on_store_error_run_acks_a_delivery_run_without_protection() -> None:
    runs: list[str] = []

    def handle(message: str) -> str:
        runs.append(message)
        return "done"

    consumer = IdempotentConsumer(
        handle, store=DownStore(), key=str, name=fresh_key(), on_store_error="run"
    )

    assert consumer.process("m-1") == Outcome("ack", "done")
    assert runs == ["m-1"]


def test_store_calls_per_delivery_new_two_redelivered_one_running_duplicate_one(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    hold = fstore.hold()
    consumer = consumer_for(fstore, Handler(), hold=hold, store=counting)
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")

    process(fstore, consumer, delivered)  # a duplicate while the first runs
    assert counting.calls == {"claim": 2}
    hold.open()
    first.result()
    assert counting.calls == {"claim": 2, "complete": 1}
    process(fstore, consumer, delivered)  # redelivered after it completed
    assert counting.calls == {"claim": 3, "complete": 1}


def test_store_calls_for_a_failing_handler_the_claim_and_the_release(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    consumer = consumer_for(fstore, Handler(failures=1), store=counting)

    assert process(fstore, consumer, message()).action == "retry"
    assert counting.calls == {"claim": 1, "release": 1}


# -- the default payload -------------------------------------------------------------------


def test_an_sqs_redelivery_with_a_new_receipt_handle_is_the_same_payload() -> None:
    boto3_message = {"MessageId": "m", "ReceiptHandle": "r-1", "Body": "b", "Attributes": {}}
    lambda_record = {"messageId": "m", "receiptHandle": "r-1", "body": "b", "attributes": {}}

    assert message_payload(boto3_message) == "b"
    assert message_payload({**boto3_message, "ReceiptHandle": "r-2"}) == "b"
    assert message_payload(lambda_record) == "b"
    assert message_payload({"eventSource": "aws:sqs", "body": "b"}) == "b"
    assert message_payload({"body": "b", "id": 1}) == {"body": "b", "id": 1}


def test_a_redelivered_sqs_message_replays_rather_than_mismatching() -> None:
    store = MemoryStore()
    runs: list[str] = []

    def handle(message: dict[str, Any]) -> str:
        runs.append(message["Body"])
        return "done"

    consumer = IdempotentConsumer(handle, store=store, key=lambda m: m["MessageId"])
    delivery = {"MessageId": "m-1", "ReceiptHandle": "r-1", "Body": "x", "Attributes": {}}
    assert consumer.process(delivery, 1).action == "ack"

    again = {**delivery, "ReceiptHandle": "r-2", "Attributes": {"ApproximateReceiveCount": "2"}}
    assert consumer.process(again, 2) == Outcome("ack", "done", replayed=True)
    assert runs == ["x"]


# -- wrong uses ----------------------------------------------------------------------------


def test_process_and_aprocess_refuse_the_other_flavour_of_handler() -> None:
    store = MemoryStore()

    def plain(message: Any) -> None:
        return None

    async def coroutine(message: Any) -> None:
        return None

    sync_consumer = IdempotentConsumer(plain, store=store, key=str)
    async_consumer = IdempotentConsumer(coroutine, store=store, key=str)
    with pytest.raises(TypeError, match="aprocess"):
        async_consumer.process("m")
    with pytest.raises(TypeError, match=r"consumer\.process"):
        asyncio.run(sync_consumer.aprocess("m"))


def test_a_store_that_cannot_serve_the_handler_is_a_type_error() -> None:
    class SyncOnly:
        def claim(self, request: Any) -> Any:
            return None

        def complete(self, completion: Any) -> bool:
            return False

        def release(self, key_hash: str, owner: str) -> bool:
            return False

        def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
            return False

    async def coroutine(message: Any) -> None:
        return None

    with pytest.raises(TypeError, match="needs an async store"):
        IdempotentConsumer(coroutine, store=SyncOnly(), key=str)


def test_the_timing_options_can_be_read_back() -> None:
    consumer = IdempotentConsumer(
        print,
        store=MemoryStore(),
        key=str,
        ttl_seconds=600,
        lock_timeout_seconds=25,
        clock_skew_seconds=0.5,
        max_attempts=4,
    )
    default = IdempotentConsumer(print, store=MemoryStore(), key=str)

    assert (consumer.ttl_seconds, consumer.lock_timeout_seconds) == (600, 25)
    assert (consumer.clock_skew_seconds, consumer.max_attempts) == (0.5, 4)
    assert (default.ttl_seconds, default.lock_timeout_seconds) == (86400, 60)
    assert (default.clock_skew_seconds, default.max_attempts) == (1.0, None)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"key": "id"}, "key must be a callable"),
        ({"on_exhausted": 3}, "on_exhausted"),
    ],
)
def test_bad_options_are_type_errors_naming_them(options: dict[str, Any], match: str) -> None:
    def handle(message: Any) -> None:
        return None

    arguments: dict[str, Any] = {"store": MemoryStore(), "key": str, **options}
    with pytest.raises(TypeError, match=match):
        IdempotentConsumer(handle, **arguments)


# -- one delivery story --------------------------------------------------------------------


def test_a_message_is_processed_once_then_forgotten_and_redriven(
    fstore: FunctionStore,
) -> None:
    handler = Handler()
    hold = fstore.hold()
    consumer = consumer_for(fstore, handler, hold=hold)
    delivered = message()
    method = consumer.aprocess if fstore.is_async else consumer.process
    first = fstore.start(method, delivered, 1)
    fstore.wait_until(hold.entered.is_set, "the first delivery to run")

    assert process(fstore, consumer, delivered, 2).action == "retry"
    hold.open()
    assert first.result() == Outcome("ack", {"processed": delivered["id"]})
    assert process(fstore, consumer, delivered, 3).replayed is True
    assert forget(fstore, consumer, delivered["id"]) is True
    assert process(fstore, consumer, delivered, 1) == Outcome("ack", {"processed": delivered["id"]})
    assert handler.runs == [delivered["id"]] * 2


# -- the rarer paths -----------------------------------------------------------------------


def test_an_async_on_exhausted_is_awaited() -> None:
    given_up: list[str] = []

    async def handle(message: str) -> None:
        raise Boom(message)

    async def on_exhausted(message: str, error: Exception) -> None:
        given_up.append(message)

    consumer = IdempotentConsumer(
        handle,
        store=MemoryStore(),
        key=str,
        name=fresh_key(),
        max_attempts=1,
        on_exhausted=on_exhausted,
    )

    assert asyncio.run(consumer.aprocess("m-1", 1)).action == "dead"
    assert given_up == ["m-1"]


def test_an_async_on_exhausted_for_a_sync_handler_is_a_type_error() -> None:
    async def on_exhausted(message: str, error: Exception) -> None:
        return None

    with pytest.raises(TypeError, match="on_exhausted is a coroutine function"):
        IdempotentConsumer(print, store=MemoryStore(), key=str, name="p", on_exhausted=on_exhausted)


def test_a_result_too_large_to_keep_is_acked_and_its_redelivery_too_without_a_result() -> None:
    runs: list[str] = []

    def handle(message: str) -> str:
        runs.append(message)
        return "x" * 100

    consumer = IdempotentConsumer(
        handle, store=MemoryStore(max_response_bytes=10), key=str, name=fresh_key()
    )

    assert consumer.process("m-1") == Outcome("ack", "x" * 100)
    assert consumer.process("m-1") == Outcome("ack", None, replayed=True)
    assert runs == ["m-1"]


def test_a_stored_result_that_cannot_be_read_is_dead_and_never_run_again() -> None:
    runs: list[str] = []

    def unreadable(data: bytes) -> Any:
        raise ValueError("corrupt")

    def handle(message: str) -> str:
        runs.append(message)
        return "done"

    consumer = IdempotentConsumer(
        handle,
        store=MemoryStore(),
        key=str,
        name=fresh_key(),
        serializer=(lambda value: b"done", unreadable),
    )
    consumer.process("m-1")

    outcome = consumer.process("m-1")

    assert outcome.action == "dead"
    assert isinstance(outcome.error, StoredResultUnreadableError)
    assert isinstance(outcome.error.__cause__, ValueError)
    assert runs == ["m-1"]


class SyncDeleteOnly(MemoryStore):
    """A store whose operator methods are sync only, as DynamoDBStore's."""

    adelete = None  # type: ignore[assignment]


class AsyncDeleteOnly(MemoryStore):
    """A store whose operator methods are async only, as AsyncDynamoDBStore's."""

    delete = None  # type: ignore[assignment]


def test_aforget_runs_a_sync_only_delete_off_the_event_loop() -> None:
    store = SyncDeleteOnly()
    consumer = IdempotentConsumer(str.upper, store=store, key=str, name=fresh_key())
    consumer.process("m-1")

    assert asyncio.run(consumer.aforget("m-1")) is True
    assert consumer.process("m-1").replayed is False


def test_forget_on_a_store_without_a_sync_delete_says_to_use_aforget() -> None:
    consumer = IdempotentConsumer(str.upper, store=AsyncDeleteOnly(), key=str, name=fresh_key())

    with pytest.raises(TypeError, match="aforget"):
        consumer.forget("m-1")
    with pytest.raises(TypeError, match="non-empty str"):
        asyncio.run(consumer.aforget(""))


def test_a_misspelled_option_names_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"'ttl' \(did you mean 'ttl_seconds'\?\).*max_attempts"):
        IdempotentConsumer(
            lambda message: None,
            store=MemoryStore(),
            key=lambda message: "k",
            ttl=60,  # type: ignore[call-arg]
        )


# -- a store that goes down while the handler runs -------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_store_lost_while_the_handler_runs_acks_the_done_work_and_keeps_the_key_held(
    fault_proxy: FaultProxy, moto_endpoint: str, flavour: str
) -> None:
    """The claim lands; the store stops answering (connections reset) before the completion.
    The handler's work is done, so the delivery is an ``ack`` with its result (a ``retry``
    would run it again once the claim's lock ran out); the claim stays held until its lock
    timeout, so a duplicate meanwhile is a ``retry`` and does not run."""
    table = function_table(moto_endpoint)
    runs: list[str] = []

    def handle(message: dict[str, Any]) -> str:
        runs.append(message["id"])
        fault_proxy.set("refuse")  # the store is lost while the handler runs
        return "done"

    delivered = message()
    # (The completion is retried for seconds against the refusing store: an opened circuit
    # breaker would answer the duplicate instead of the held claim.)
    options: dict[str, Any] = {
        "endpoint_url": fault_proxy.url,
        "region_name": REGION,
        "breaker_threshold": 1_000,
    }
    if flavour == "sync":
        with DynamoDBStore(table, max_attempts=1, **options) as store:
            consumer = IdempotentConsumer(
                handle, store=store, key=lambda m: m["id"], name=fresh_key(), max_attempts=1
            )
            outcome = consumer.process(delivered, 1)
            fault_proxy.set("pass")
            again = consumer.process(delivered, 2)
    else:

        async def ahandle(message: dict[str, Any]) -> str:
            return handle(message)

        async def deliver_twice() -> tuple[Outcome, Outcome]:
            async with AsyncDynamoDBStore(table, max_attempts=1, **options) as store:
                consumer = IdempotentConsumer(
                    ahandle, store=store, key=lambda m: m["id"], name=fresh_key(), max_attempts=1
                )
                first = await consumer.aprocess(delivered, 1)
                fault_proxy.set("pass")
                return first, await consumer.aprocess(delivered, 2)

        outcome, again = asyncio.run(deliver_twice())

    assert outcome == Outcome("ack", "done")
    assert again.action == "retry", again  # the claim it could not complete is still held
    assert again.retry_after is not None and again.retry_after > 1
    assert runs == [delivered["id"]]


def test_a_deliverys_requests_on_the_wire_new_two_redelivered_one_running_duplicate_one(
    fault_proxy: FaultProxy, moto_endpoint: str
) -> None:
    """What reaches DynamoDB (counted by the proxy in front of moto): a new delivery is
    two requests (the claim, the completion), a redelivery after it completed one, a
    duplicate while the first runs one."""
    started, finish = threading.Event(), threading.Event()

    def handle(message: dict[str, Any]) -> str:
        started.set()
        finish.wait(10)
        return "done"

    delivered = message()
    with DynamoDBStore(
        function_table(moto_endpoint), endpoint_url=fault_proxy.url, region_name=REGION
    ) as store:
        consumer = IdempotentConsumer(handle, store=store, key=lambda m: m["id"], name=fresh_key())
        fault_proxy.forget()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(consumer.process, delivered)
            assert started.wait(10)
            claimed = fault_proxy.operations()
            fault_proxy.forget()
            duplicate = consumer.process(delivered)
            on_duplicate = fault_proxy.operations()
            fault_proxy.forget()
            finish.set()
            assert first.result(10) == Outcome("ack", "done")
            completed = fault_proxy.operations()
        fault_proxy.forget()
        redelivered = consumer.process(delivered)
        on_redelivery = fault_proxy.operations()

    assert duplicate.action == "retry" and redelivered == Outcome("ack", "done", replayed=True)
    # New: a conditional put (the claim), then an update (the completion).
    assert (claimed, completed) == (["PutItem"], ["UpdateItem"])
    assert on_duplicate == ["PutItem"]  # its failed condition returns the running record
    assert on_redelivery == ["PutItem"]  # its failed condition returns the stored result
