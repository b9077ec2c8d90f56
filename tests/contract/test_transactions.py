"""Exactly-once business writes: ``completion_transaction()`` and ``Transaction``.

A function's DynamoDB writes commit with its completion record in one TransactWriteItems,
fenced by the claim's owner token. Held to that on moto's server and on Amazon's DynamoDB
Local (ids containing ``dynamodb-local``: skipped in a plain run, run by
``scripts/dynamodb-local.sh -k "transactions and dynamodb-local"``), with plain and
coroutine functions (``tests/support/function_stores.py``), and with the store behind
``tests/support/faultproxy.py`` to see what reaches the wire. What the business tables hold is read
back with a plain boto3 client (``tests/support/transaction_tables.py``), never through the package.

The two backends differ on ``ClientRequestToken`` (see
``test_what_each_backend_does_with_a_client_request_token_and_a_cancelled_transaction``):
the commit must be right on both. Time is a fake clock: lock timeouts are crossed by
advancing it, never by sleeping.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import boto3
import orjson
import pytest
from boto3.dynamodb.conditions import Attr
from botocore.config import Config
from botocore.exceptions import ClientError

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    KeyInProgressError,
    MemoryStore,
    StoreUnavailableError,
    Transaction,
    TransactionConflictError,
    TransactionRejectedError,
    completion_transaction,
    defer_completion,
    idempotent,
)
from idempotency_middleware.engine.decisions import FINISH_ATTEMPTS
from idempotency_middleware.handler.context import CURRENT, CurrentAttempt
from idempotency_middleware.handler.transactions import MAX_WRITES
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.dynamodb.requests import commit_token
from idempotency_middleware.stores.protocol import ClaimRequest
from idempotency_middleware.stores.records import Status
from tests.conftest import REGION
from tests.support.faultproxy import FaultProxy, Mode, SeenRequest
from tests.support.function_stores import (
    Events,
    FunctionStore,
    StepClock,
    fresh_key,
    open_function_store,
)
from tests.support.store_kinds import DYNAMODB_KINDS, LOCAL_KINDS
from tests.support.transaction_tables import BusinessTables, business_tables

SKU = "sku-1"
LOCK_TIMEOUT = 60.0  # idempotent's default: a takeover needs the clock past it


@pytest.fixture(params=DYNAMODB_KINDS)
def fstore(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
    """DynamoDBStore and AsyncDynamoDBStore, on moto and on DynamoDB Local.

    The fake clock is first moved to the real time: DynamoDB Local's TTL sweeper deletes,
    within a second or so, every item whose ``ttl`` is in the real past, and the clock
    starts in 2023 (a claim or a completion would vanish mid-test)."""
    for opened in open_function_store(request, request.param):
        opened.clock.advance(max(time.time() - opened.clock.now(), 0.0))
        yield opened


@pytest.fixture
def endpoint(fstore: FunctionStore, request: pytest.FixtureRequest) -> str:
    """The DynamoDB endpoint ``fstore``'s store talks to."""
    local = fstore.kind in LOCAL_KINDS
    url: str = request.getfixturevalue("dynamodb_local_endpoint" if local else "moto_endpoint")
    return url


@pytest.fixture
def tables(endpoint: str) -> Iterator[BusinessTables]:
    """Fresh orders/inventory tables beside ``fstore``'s, with 5 of ``SKU`` in stock."""
    made = business_tables(endpoint)
    made.set_stock(SKU, 5)
    try:
        yield made
    finally:
        made.close()


def function_key_hash(name: str, key: str) -> str:
    """The idempotency record's key of ``key`` for the function named ``name``."""
    return storage_key("@function", name, None, key)


def unique_name(label: str) -> str:
    return f"tests.transactions.{label}-{uuid.uuid4().hex[:8]}"


def order_placer(tables: BusinessTables, runs: list[str]) -> Callable[..., dict[str, Any]]:
    """The function under test: an order (new) and a stock decrement (while any is left),
    both through the attempt's transaction."""

    def place(key: str, order_id: str, sku: str = SKU) -> dict[str, Any]:
        runs.append(order_id)
        transaction = completion_transaction()
        transaction.put(
            tables.orders_table,
            {"id": order_id, "sku": sku, "quantity": 1},
            condition="attribute_not_exists(#id)",
            names={"#id": "id"},
        )
        transaction.update(
            tables.inventory_table,
            {"sku": sku},
            "SET stock = stock - :one",
            condition=Attr("stock").gte(1),
            values={":one": 1},
        )
        return {"order": order_id, "run": len(runs)}

    return place


@contextlib.contextmanager
def own_store(fstore: FunctionStore, endpoint_url: str, **kwargs: Any) -> Iterator[Any]:
    """A store of ``fstore``'s flavour on the function table, on ``endpoint_url`` (a proxy,
    say), closed on ``fstore``'s loop for the async flavour."""
    table = fstore.store.layout.table_name
    kind: Any = AsyncDynamoDBStore if fstore.is_async else DynamoDBStore
    # A breaker that never opens: these tests refuse a store's commits for the seconds a
    # completion is retried, then use the store again at once (the breaker has its tests).
    kwargs.setdefault("breaker_threshold", 1_000)
    store: Any = kind(
        table, endpoint_url=endpoint_url, region_name=REGION, clock=fstore.clock, **kwargs
    )
    try:
        yield store
    finally:
        if fstore.loop is None:
            store.close()
        else:
            fstore.loop.run_until_complete(store.aclose())


# --- Transaction on its own: what it builds and what it refuses -----------------------------


def bare_transaction(key_hash: str = "a" * 64) -> tuple[Transaction, CurrentAttempt]:
    """A Transaction for an attempt on idempotency table ``idem`` (key attribute ``pk``)."""
    claim = ClaimRequest(key_hash, "f" * 64, "owner-1", 1_700_000_000.0, LOCK_TIMEOUT)
    attempt = CurrentAttempt(claim, 3600.0, http=False)
    return Transaction(attempt, "idem", "pk"), attempt


def test_writes_are_serialized_as_boto3_tables_do() -> None:
    transaction, _ = bare_transaction()
    transaction.put(
        "orders",
        {
            "id": "o-1",
            "quantity": 2,
            "price": Decimal("9.99"),
            "blob": b"\x00\xff",
            "tags": {"red", "blue"},
            "sizes": {Decimal("1"), Decimal("2.5")},
            "blobs": {b"x"},
            "meta": {"nested": {"deep": [1, "x", None, True]}},
        },
        condition="attribute_not_exists(#id)",
        names={"#id": "id"},
    )
    transaction.update(
        "inventory",
        {"sku": "s-1"},
        "SET stock = stock - :one",
        condition="stock >= :one",
        values={":one": 1},
    )
    transaction.delete("carts", {"user": "u-1", "line": 3})
    transaction.check("users", {"user": "u-1"}, "attribute_exists(#u)", names={"#u": "user"})

    put, update, delete, check = transaction.items
    item = put["Put"]["Item"]
    assert sorted(item["tags"]["SS"]) == ["blue", "red"]
    assert sorted(item["sizes"]["NS"]) == ["1", "2.5"]
    assert item["blobs"] == {"BS": [b"x"]}
    del item["tags"], item["sizes"], item["blobs"]
    assert put == {
        "Put": {
            "TableName": "orders",
            "Item": {
                "id": {"S": "o-1"},
                "quantity": {"N": "2"},
                "price": {"N": "9.99"},
                "blob": {"B": b"\x00\xff"},
                "meta": {
                    "M": {
                        "nested": {
                            "M": {
                                "deep": {
                                    "L": [{"N": "1"}, {"S": "x"}, {"NULL": True}, {"BOOL": True}]
                                }
                            }
                        }
                    }
                },
            },
            "ConditionExpression": "attribute_not_exists(#id)",
            "ExpressionAttributeNames": {"#id": "id"},
        }
    }
    assert update == {
        "Update": {
            "TableName": "inventory",
            "Key": {"sku": {"S": "s-1"}},
            "UpdateExpression": "SET stock = stock - :one",
            "ConditionExpression": "stock >= :one",
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }
    }
    assert delete == {
        "Delete": {"TableName": "carts", "Key": {"user": {"S": "u-1"}, "line": {"N": "3"}}}
    }
    assert check == {
        "ConditionCheck": {
            "TableName": "users",
            "Key": {"user": {"S": "u-1"}},
            "ConditionExpression": "attribute_exists(#u)",
            "ExpressionAttributeNames": {"#u": "user"},
        }
    }
    assert len(transaction) == 4


def test_a_condition_object_is_built_into_the_expression_with_its_placeholders_merged() -> None:
    transaction, _ = bare_transaction()
    transaction.update(
        "inventory",
        {"sku": "s-1"},
        "SET #s = #s - :one",
        condition=Attr("stock").gte(Decimal(1)) & Attr("state").eq("open"),
        names={"#s": "stock"},
        values={":one": 1},
    )
    (entry,) = transaction.items
    body = entry["Update"]
    assert body["ConditionExpression"] == "(#n0 >= :v0 AND #n1 = :v1)"
    assert body["ExpressionAttributeNames"] == {"#s": "stock", "#n0": "stock", "#n1": "state"}
    assert body["ExpressionAttributeValues"] == {
        ":one": {"N": "1"},
        ":v0": {"N": "1"},
        ":v1": {"S": "open"},
    }


@pytest.mark.parametrize(
    ("names", "values"),
    [({"#n0": "other"}, None), (None, {":v0": 1})],
    ids=["name", "value"],
)
def test_a_placeholder_both_given_and_made_by_a_condition_object_is_a_value_error(
    names: dict[str, str] | None, values: dict[str, Any] | None
) -> None:
    transaction, _ = bare_transaction()
    with pytest.raises(ValueError, match="placeholder"):
        transaction.delete(
            "orders", {"id": "o-1"}, condition=Attr("state").eq("open"), names=names, values=values
        )
    assert len(transaction) == 0


@pytest.mark.parametrize(
    "write",
    [
        lambda t: t.put("orders", {"id": "o-1", "price": 1.5}),
        lambda t: t.delete("orders", {"id": 1.0}),
        lambda t: t.update("orders", {"id": "o-1"}, "SET p = :p", values={":p": 0.5}),
        lambda t: t.check("orders", {"id": "o-1"}, Attr("price").gt(0.5)),
        lambda t: t.put("orders", {"id": "o-1", "meta": {"nested": [0.1]}}),
    ],
    ids=["item", "key", "values", "condition-object", "nested"],
)
def test_a_float_anywhere_is_a_type_error_at_the_call(write: Callable[[Transaction], None]) -> None:
    transaction, _ = bare_transaction()
    with pytest.raises(TypeError, match="Decimal"):
        write(transaction)
    assert len(transaction) == 0


def test_ninety_nine_writes_fit_and_the_hundredth_is_a_value_error() -> None:
    transaction, _ = bare_transaction()
    for number in range(MAX_WRITES):
        transaction.update("inventory", {"sku": f"s-{number}"}, "SET n = :n", values={":n": 1})
    assert MAX_WRITES == 99
    assert len(transaction) == 99
    with pytest.raises(ValueError, match="at most 99 writes"):
        transaction.put("orders", {"id": "one-too-many"})
    assert len(transaction) == 99


def test_two_writes_on_one_item_are_a_value_error() -> None:
    transaction, _ = bare_transaction()
    transaction.update("inventory", {"sku": "s-1"}, "SET n = :n", values={":n": 1})
    with pytest.raises(ValueError, match="two writes on one item"):
        transaction.delete("inventory", {"sku": "s-1"})
    with pytest.raises(ValueError, match="two writes on one item"):
        transaction.check("inventory", {"sku": "s-1"}, "attribute_exists(sku)")
    transaction.update("orders", {"id": "o-1"}, "SET n = :n", values={":n": 1})
    with pytest.raises(ValueError, match="two writes on one item"):
        transaction.put("orders", {"id": "o-1", "total": 3})
    # Other items of the same tables are fine.
    transaction.delete("inventory", {"sku": "s-2"})
    transaction.put("orders", {"id": "o-2", "total": 3})
    assert len(transaction) == 4


@pytest.mark.parametrize(
    ("first", "second"),
    [(1, Decimal("1.0")), (Decimal("10"), Decimal("1E+1")), (b"k", bytearray(b"k"))],
    ids=["int-and-decimal", "exponent", "bytes-and-bytearray"],
)
def test_two_writes_on_one_item_named_by_equal_key_values_are_a_value_error(
    first: Any, second: Any
) -> None:
    transaction, _ = bare_transaction()
    transaction.update("orders", {"id": first}, "SET n = :n", values={":n": 1})
    with pytest.raises(ValueError, match="two writes on one item"):
        transaction.delete("orders", {"id": second})


def test_a_write_on_the_attempts_own_idempotency_record_is_a_value_error() -> None:
    key_hash = "b" * 64
    transaction, _ = bare_transaction(key_hash)
    with pytest.raises(ValueError, match="own idempotency record"):
        transaction.put("idem", {"pk": key_hash, "status": "completed"})
    with pytest.raises(ValueError, match="own idempotency record"):
        transaction.update("idem", {"pk": key_hash}, "SET x = :x", values={":x": 1})
    with pytest.raises(ValueError, match="own idempotency record"):
        transaction.delete("idem", {"pk": key_hash})
    # Another key of the idempotency table, or the same key in another table, is not it.
    transaction.put("idem", {"pk": "c" * 64})
    transaction.delete("other", {"pk": key_hash})
    assert len(transaction) == 2


def test_malformed_writes_are_value_errors() -> None:
    transaction, _ = bare_transaction()
    with pytest.raises(ValueError, match="table"):
        transaction.put("", {"id": "o-1"})
    with pytest.raises(ValueError, match="non-empty mapping"):
        transaction.delete("orders", {})
    with pytest.raises(ValueError, match="update expression"):
        transaction.update("orders", {"id": "o-1"}, " ")
    with pytest.raises(ValueError, match="needs a condition"):
        transaction.check("orders", {"id": "o-1"}, None)
    with pytest.raises(ValueError, match="non-empty expression"):
        transaction.delete("orders", {"id": "o-1"}, condition="  ")
    with pytest.raises(TypeError, match="condition must be"):
        transaction.delete("orders", {"id": "o-1"}, condition=42)
    assert len(transaction) == 0


def test_writes_after_the_attempt_finished_or_went_live_are_runtime_errors() -> None:
    transaction, attempt = bare_transaction()
    transaction.put("orders", {"id": "o-1"})
    attempt.finished = True
    with pytest.raises(RuntimeError, match="finished"):
        transaction.put("orders", {"id": "o-2"})
    streaming, live = bare_transaction()
    live.go_live()
    with pytest.raises(RuntimeError, match="streaming"):
        streaming.put("orders", {"id": "o-3"})
    assert (len(transaction), len(streaming)) == (1, 0)


# --- completion_transaction(): only inside an attempt, on a DynamoDB store -------------------


def test_completion_transaction_outside_any_attempt_is_a_lookup_error() -> None:
    assert CURRENT.get() is None
    with pytest.raises(LookupError, match="completion_transaction"):
        completion_transaction()


@pytest.mark.parametrize("kind", ["memory", "memory-async", "sqlite", "sqlite-async"])
def test_completion_transaction_on_a_store_that_is_not_dynamodb_is_a_type_error(
    kind: str, request: pytest.FixtureRequest
) -> None:
    runs: list[str] = []
    with contextlib.contextmanager(open_function_store)(request, kind) as other:

        @other.decorate(key="key")
        def work(key: str) -> str:
            runs.append(key)
            completion_transaction()
            return "unreachable"

        key = fresh_key()
        with pytest.raises(TypeError, match="needs a DynamoDB store"):
            other.run(work, key)
        with pytest.raises(TypeError):  # the key was released: it runs (and fails) again
            other.run(work, key)
        assert runs == [key, key]


def test_one_transaction_per_attempt_gone_when_the_attempt_ends(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    seen: list[Transaction] = []

    @fstore.decorate(key="key")
    def work(key: str) -> int:
        first = completion_transaction()
        assert completion_transaction() is first
        seen.append(first)
        return len(seen)

    assert fstore.run(work, fresh_key()) == 1
    assert fstore.run(work, fresh_key()) == 2
    assert seen[0] is not seen[1]  # each attempt has its own
    # Nothing of the finished attempt is visible to the caller's context afterwards...
    if fstore.loop is None:
        with pytest.raises(LookupError):
            completion_transaction()
    else:

        async def call_then_look() -> None:
            await work(fresh_key())
            with pytest.raises(LookupError):
                completion_transaction()

        fstore.loop.run_until_complete(call_then_look())
    # ...and a Transaction kept past its attempt takes no writes.
    with pytest.raises(RuntimeError, match="finished"):
        seen[0].put(tables.orders_table, {"id": "late"})
    assert tables.orders() == []


def test_a_write_on_the_functions_own_record_is_refused_inside_the_call(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    name = unique_name("own-record")
    idempotency_table = fstore.store.layout.table_name

    @fstore.decorate(key="key", name=name)
    def work(key: str) -> str:
        completion_transaction().put(
            idempotency_table, {"pk": function_key_hash(name, key), "status": "completed"}
        )
        return "unreachable"

    key = fresh_key()
    with pytest.raises(ValueError, match="own idempotency record"):
        fstore.run(work, key)
    assert fstore.get(function_key_hash(name, key)) is None  # released


# --- @idempotent with writes: every outcome, on both stores and both backends ----------------


def test_a_commit_writes_once_and_a_replay_writes_nothing(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    runs: list[str] = []
    name = unique_name("place")
    events = Events()
    place = fstore.decorate(key="key", name=name, on_event=events)(order_placer(tables, runs))
    key = fresh_key()

    assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 1}
    assert tables.order_ids() == ["o-1"]
    assert tables.stock(SKU) == 4
    record = fstore.get(function_key_hash(name, key))
    assert record is not None and record.status is Status.COMPLETED

    assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 1}  # replayed
    assert runs == ["o-1"]
    assert tables.order_ids() == ["o-1"]
    assert tables.stock(SKU) == 4
    assert events.kinds() == ["claimed", "completed", "replayed"]


def test_a_failed_business_condition_writes_nothing_and_releases_the_key(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    runs: list[str] = []
    name = unique_name("sold-out")
    events = Events()
    place = fstore.decorate(key="key", name=name, on_event=events)(order_placer(tables, runs))
    tables.set_stock(SKU, 0)
    key = fresh_key()

    with pytest.raises(TransactionConflictError) as raised:
        fstore.run(place, key, "o-1")
    assert (raised.value.position, raised.value.reason) == (1, "ConditionalCheckFailed")
    assert tables.orders() == []  # the put (position 0) did not land either
    assert tables.stock(SKU) == 0
    assert fstore.get(function_key_hash(name, key)) is None
    assert [event.kind for event in events.all] == ["claimed", "transaction_conflict", "released"]

    tables.set_stock(SKU, 1)  # restocked: the retry runs and commits
    assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 2}
    assert tables.order_ids() == ["o-1"]
    assert tables.stock(SKU) == 0


def test_a_function_that_raises_writes_nothing_and_releases_the_key(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    name = unique_name("raises")
    attempts = itertools.count(1)

    @fstore.decorate(key="key", name=name)
    def place(key: str) -> str:
        order_placer(tables, [])(key, "o-1")
        if next(attempts) == 1:
            raise RuntimeError("payment declined")
        return "placed"

    key = fresh_key()
    with pytest.raises(RuntimeError, match="payment declined"):
        fstore.run(place, key)
    assert tables.orders() == []
    assert tables.stock(SKU) == 5
    assert fstore.get(function_key_hash(name, key)) is None
    assert fstore.run(place, key) == "placed"
    assert (tables.order_ids(), tables.stock(SKU)) == (["o-1"], 4)


def test_a_write_dynamodb_refuses_is_a_transaction_rejected_error_with_nothing_written(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    """A put, then an update of the same item: the put named the table's key first, so the
    Transaction cannot tell; DynamoDB refuses the whole transaction (ValidationException)."""
    name = unique_name("rejected")

    @fstore.decorate(key="key", name=name)
    def place(key: str) -> str:
        transaction = completion_transaction()
        transaction.put(tables.inventory_table, {"sku": "new", "stock": 1})
        transaction.update(
            tables.inventory_table, {"sku": "new"}, "SET stock = :n", values={":n": 2}
        )
        return "unreachable"

    key = fresh_key()
    with pytest.raises(TransactionRejectedError) as raised:
        fstore.run(place, key)
    assert raised.value.reason == "ValidationException"
    assert isinstance(raised.value, ValueError)
    assert tables.stock("new") is None
    assert fstore.get(function_key_hash(name, key)) is None


def test_an_owner_taken_over_before_its_commit_writes_nothing(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    hold = fstore.hold()
    name = unique_name("taken-over")
    numbers = itertools.count(1)

    @fstore.decorate(key="key", name=name, hold=hold)  # lock timeout: 60 s
    def place(key: str) -> dict[str, Any]:
        return order_placer(tables, [])(key, f"o-{next(numbers)}")

    key = fresh_key()
    first = fstore.start(place, key)
    fstore.wait_until(hold.entered.is_set, "the first call to run")
    # While the first runs, its lease runs out (no renewal came: the clock jumped past it),
    # and another call with the key takes it over and commits.
    fstore.clock.advance(LOCK_TIMEOUT + 1)
    assert fstore.run(place, key) == {"order": "o-1", "run": 1}
    hold.open()
    with pytest.raises(KeyInProgressError):
        first.result()  # ran (as o-2) but its commit was fenced out: nothing of it landed
    assert next(numbers) == 3
    assert tables.order_ids() == ["o-1"]
    assert tables.stock(SKU) == 4
    assert fstore.run(place, key) == {"order": "o-1", "run": 1}  # the second's, replayed


def test_ninety_nine_writes_commit_with_the_completion_in_one_transaction(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    """DynamoDB's 100 actions: 98 orders, the stock decrement and the completion."""

    @fstore.decorate(key="key")
    def place_many(key: str) -> int:
        transaction = completion_transaction()
        for number in range(MAX_WRITES - 1):
            transaction.put(tables.orders_table, {"id": f"o-{number:02d}"})
        transaction.update(
            tables.inventory_table, {"sku": SKU}, "SET stock = stock - :one", values={":one": 1}
        )
        return len(transaction)

    assert fstore.run(place_many, fresh_key()) == 99
    assert tables.order_ids() == [f"o-{number:02d}" for number in range(98)]
    assert tables.stock(SKU) == 4


# --- 4 MB: writes and result over DynamoDB's transaction limit -------------------------------

BIG_ORDERS = 11
BIG_ORDER_BYTES = 365_000  # under DynamoDB's 400 KB item limit; 4.02 MB for the eleven
# Random, so that it stays about 270 KB once stored compressed: small enough for the item.
BIG_RESULT = base64.b64encode(os.urandom(270_000)).decode()


def test_a_transaction_over_4_mb_is_rejected_without_s3_and_lands_with_the_result_in_s3(
    fstore: FunctionStore, tables: BusinessTables, endpoint: str, moto_endpoint: str
) -> None:
    """11 orders of 365 KB (4.02 MB) fit; with a 270 KB result beside them they do not. A
    store without a bucket refuses before sending; one with a bucket (on moto's S3 for both
    backends: DynamoDB Local has none) moves the result there and commits."""
    runs: list[int] = []
    name = unique_name("big")

    def big(key: str) -> str:
        runs.append(len(runs) + 1)
        transaction = completion_transaction()
        for number in range(BIG_ORDERS):
            transaction.put(
                tables.orders_table, {"id": f"big-{number}", "pad": "x" * BIG_ORDER_BYTES}
            )
        return BIG_RESULT

    key = fresh_key()
    with pytest.raises(TransactionRejectedError) as raised:
        fstore.run(fstore.decorate(key="key", name=name)(big), key)
    assert raised.value.reason == "too_large"
    assert tables.orders() == []
    assert fstore.get(function_key_hash(name, key)) is None  # released

    bucket = f"idem-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    try:
        s3.create_bucket(Bucket=bucket)
        with own_store(
            fstore, endpoint, s3_bucket=bucket, s3_endpoint_url=moto_endpoint
        ) as with_s3:
            with_bucket = fstore.decorate(key="key", name=name, store=with_s3)(big)
            assert fstore.run(with_bucket, key) == BIG_RESULT
            assert len(tables.orders()) == BIG_ORDERS
            assert fstore.run(with_bucket, key) == BIG_RESULT  # replayed from S3
            assert runs == [1, 2]
        objects = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert len(objects) == 1 and objects[0]["Size"] > 270_000
    finally:
        s3.close()
    assert len(tables.orders()) == BIG_ORDERS


# --- on the wire: round trips, the commit token, faults during the commit --------------------


def body_of(request: SeenRequest) -> dict[str, Any]:
    parsed: dict[str, Any] = orjson.loads(request.body)
    return parsed


def commits(proxy: FaultProxy) -> list[SeenRequest]:
    return [seen for seen in proxy.seen() if seen.operation == "TransactWriteItems"]


def test_a_new_key_with_writes_costs_two_calls_and_carries_the_commit_token(
    fstore: FunctionStore, tables: BusinessTables, endpoint: str
) -> None:
    name = unique_name("wire")
    key = fresh_key()
    with FaultProxy(endpoint) as proxy, own_store(fstore, proxy.url) as store:
        place = fstore.decorate(key="key", name=name, store=store)(order_placer(tables, []))
        assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 1}
        claim, commit = proxy.seen()
    assert (claim.operation, commit.operation) == ("PutItem", "TransactWriteItems")
    owner = body_of(claim)["Item"]["owner"]["S"]
    record = fstore.get(function_key_hash(name, key))
    assert record is not None and record.owner == owner
    sent = body_of(commit)
    token = commit_token(owner)
    assert sent["ClientRequestToken"] == token
    operations = [next(iter(entry)) for entry in sent["TransactItems"]]
    assert operations == ["Put", "Update", "Update"]  # the writes in order, then the completion
    completion = sent["TransactItems"][-1]["Update"]
    assert completion["ExpressionAttributeValues"][":txn"] == {"S": token}
    assert (tables.order_ids(), tables.stock(SKU)) == (["o-1"], 4)


def test_an_attempt_that_adds_no_writes_completes_with_a_plain_update(
    fstore: FunctionStore, tables: BusinessTables, endpoint: str
) -> None:
    with FaultProxy(endpoint) as proxy, own_store(fstore, proxy.url) as store:

        @fstore.decorate(key="key", store=store)
        def look(key: str) -> int:
            return len(completion_transaction())

        assert fstore.run(look, fresh_key()) == 0
        assert proxy.operations() == ["PutItem", "UpdateItem"]


@pytest.mark.parametrize("mode", ["cut", "error", "throttle"])
def test_a_commit_retried_after_a_fault_carries_the_same_token_and_writes_once(
    fstore: FunctionStore, tables: BusinessTables, endpoint: str, mode: Mode
) -> None:
    """``cut``: the first commit landed but its answer was lost; ``error``/``throttle``: it
    never reached DynamoDB. The store retries it (``max_attempts=1``: the engine's finishing
    retries, each rebuilding the request), and it lands exactly once."""
    name = unique_name(f"retried-{mode}")
    key = fresh_key()
    with FaultProxy(endpoint) as proxy, own_store(fstore, proxy.url, max_attempts=1) as store:
        place = fstore.decorate(key="key", name=name, store=store)(order_placer(tables, []))
        proxy.set(mode, operations={"TransactWriteItems"}, count=1)
        assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 1}
        sent = commits(proxy)
        assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 1}  # replayed
    assert [seen.fault for seen in sent] == [mode, "pass"]
    assert sent[0].body == sent[1].body  # same payload (DynamoDB refuses another one)
    owner = body_of(proxy.seen()[0])["Item"]["owner"]["S"]
    assert body_of(sent[1])["ClientRequestToken"] == commit_token(owner)
    assert tables.order_ids() == ["o-1"]
    assert tables.stock(SKU) == 4


@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_a_commit_that_never_reaches_the_store_writes_nothing_and_keeps_the_key(
    fstore: FunctionStore, tables: BusinessTables, endpoint: str, mode: Mode
) -> None:
    name = unique_name(f"unreachable-{mode}")
    key = fresh_key()
    runs: list[str] = []
    options = {"max_attempts": 1, "read_timeout": 1.0, "connect_timeout": 1.0}
    with FaultProxy(endpoint) as proxy, own_store(fstore, proxy.url, **options) as store:
        place = fstore.decorate(key="key", name=name, store=store)(order_placer(tables, runs))
        proxy.set(mode, operations={"TransactWriteItems"})
        if mode == "hang":
            # Each hung commit waits out its read timeout in real time, which the fake clock
            # does not see: it is moved on by as much at each retry's sleep, so the commit
            # is retried for FINISH_SECONDS of the clock, as it would be in real time.
            waits_out(fstore.clock, options["read_timeout"])
        with pytest.raises(StoreUnavailableError, match="whole or not at all"):
            fstore.run(place, key, "o-1")
        fstore.clock.at_next_sleep(None, None)
        # The commit and its finishing retries, for FINISH_SECONDS (on the fake clock).
        assert len(commits(proxy)) >= FINISH_ATTEMPTS
    assert tables.orders() == []  # none landed
    assert tables.stock(SKU) == 5
    # The store reachable again: the same function and keys, on the store's own client (its
    # default timeouts and retries), not through the proxy whose connections were hung.
    again = fstore.decorate(key="key", name=name)(order_placer(tables, runs))
    with pytest.raises(KeyInProgressError):  # claimed until its lock timeout
        fstore.run(again, key, "o-1")
    fstore.clock.advance(LOCK_TIMEOUT + 1)
    assert fstore.run(again, key, "o-1") == {"order": "o-1", "run": 2}
    assert runs == ["o-1", "o-1"]
    assert (tables.order_ids(), tables.stock(SKU)) == (["o-1"], 4)


def waits_out(clock: StepClock, seconds: float) -> None:
    """At every sleep of ``clock`` from now on, move it ``seconds`` further first."""

    def hook() -> None:
        clock.advance(seconds)
        clock.at_next_sleep(hook, async_hook)

    async def async_hook() -> None:
        hook()

    clock.at_next_sleep(hook, async_hook)


def test_a_commit_whose_every_answer_is_lost_lands_whole_and_is_replayed(
    fstore: FunctionStore, tables: BusinessTables, endpoint: str
) -> None:
    """Every TransactWriteItems is forwarded and its answer cut: the first lands, the
    re-sent ones apply nothing (DynamoDB Local: the token; moto: the completion's condition),
    so the writes are there exactly once and a retry replays the result."""
    name = unique_name("all-cut")
    key = fresh_key()
    runs: list[str] = []
    with FaultProxy(endpoint) as proxy, own_store(fstore, proxy.url, max_attempts=1) as store:
        place = fstore.decorate(key="key", name=name, store=store)(order_placer(tables, runs))
        proxy.set("cut", operations={"TransactWriteItems"})
        with pytest.raises(StoreUnavailableError):
            fstore.run(place, key, "o-1")
        assert len(commits(proxy)) > FINISH_ATTEMPTS
        proxy.set("pass")
        assert (tables.order_ids(), tables.stock(SKU)) == (["o-1"], 4)
        assert fstore.run(place, key, "o-1") == {"order": "o-1", "run": 1}  # replayed
    assert runs == ["o-1"]
    assert tables.stock(SKU) == 4


# --- what the two backends do with tokens and cancellations ----------------------------------


def _attempt(send: Callable[[], Any]) -> str:
    """``"ok"``, or the error code DynamoDB answered."""
    try:
        send()
    except ClientError as error:
        return str(error.response["Error"]["Code"])
    return "ok"


@pytest.mark.parametrize("backend", ["moto", "dynamodb-local"])
def test_what_each_backend_does_with_a_client_request_token_and_a_cancelled_transaction(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Sent directly with boto3 (no retries), the same TransactWriteItems (a conditional
    decrement of 5 in stock) twice with one ClientRequestToken:

    - DynamoDB Local: the second succeeds WITHOUT applying (stock 4); the same token with
      another payload fails with IdempotentParameterMismatchException (stock still 4).
    - moto: the token is ignored: the second applies again (stock 3), and another payload
      under the same token applies too (stock 1), no error.

    A cancelled transaction, on both: TransactionCanceledException with one
    CancellationReason per action, in order, ``{"Code": "None"}`` for the actions that were
    fine and ``ConditionalCheckFailed`` for every action whose condition failed (all of them,
    not only the first), each carrying the item as it was (``Item``) when that action asked
    for ``ReturnValuesOnConditionCheckFailure=ALL_OLD``, and none when it did not. Nothing of
    a cancelled transaction is applied.

    The package's commit is right on both: where the token is ignored, a re-sent commit
    fails the completion's ``#status = :in_progress`` condition, and the ``txn`` attribute in
    the returned record tells it that its own commit landed."""
    local = backend == "dynamodb-local"
    url: str = request.getfixturevalue("dynamodb_local_endpoint" if local else "moto_endpoint")
    tables = business_tables(url)
    client = boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name=REGION,
        config=Config(retries={"total_max_attempts": 1}),
    )
    try:
        tables.set_stock("s", 5)

        def decrement(by: int, token: str) -> Any:
            return client.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": tables.inventory_table,
                            "Key": {"sku": {"S": "s"}},
                            "UpdateExpression": "SET stock = stock - :by",
                            "ConditionExpression": "stock >= :by",
                            "ExpressionAttributeValues": {":by": {"N": str(by)}},
                        }
                    }
                ],
                ClientRequestToken=token,
            )

        token = uuid.uuid4().hex[:36]
        assert _attempt(lambda: decrement(1, token)) == "ok"
        assert tables.stock("s") == 4
        assert _attempt(lambda: decrement(1, token)) == "ok"
        assert tables.stock("s") == (4 if local else 3)
        mismatch = _attempt(lambda: decrement(2, token))
        if local:
            assert (mismatch, tables.stock("s")) == ("IdempotentParameterMismatchException", 4)
        else:
            assert (mismatch, tables.stock("s")) == ("ok", 1)

        tables.set_stock("empty", 0)
        tables.set_stock("few", 2)
        with pytest.raises(ClientError) as raised:
            client.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": tables.orders_table, "Item": {"id": {"S": "o-1"}}}},
                    {
                        "Update": {
                            "TableName": tables.inventory_table,
                            "Key": {"sku": {"S": "empty"}},
                            "UpdateExpression": "SET stock = stock - :one",
                            "ConditionExpression": "stock >= :one",
                            "ExpressionAttributeValues": {":one": {"N": "1"}},
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    {
                        "ConditionCheck": {
                            "TableName": tables.inventory_table,
                            "Key": {"sku": {"S": "few"}},
                            "ConditionExpression": "stock > :many",
                            "ExpressionAttributeValues": {":many": {"N": "100"}},
                        }
                    },
                    {"Delete": {"TableName": tables.inventory_table, "Key": {"sku": {"S": "s"}}}},
                ]
            )
        response = raised.value.response
        assert response["Error"]["Code"] == "TransactionCanceledException"
        reasons = response["CancellationReasons"]
        assert [reason["Code"] for reason in reasons] == [
            "None",
            "ConditionalCheckFailed",
            "ConditionalCheckFailed",
            "None",
        ]
        assert reasons[1]["Item"] == {"sku": {"S": "empty"}, "stock": {"N": "0"}}
        assert "Item" not in reasons[2]  # no ALL_OLD asked for
        assert "Item" not in reasons[0] and "Item" not in reasons[3]
        assert tables.orders() == []
        assert (tables.stock("empty"), tables.stock("few")) == (0, 2)
        assert tables.stock("s") == (4 if local else 1)
    finally:
        client.close()
        tables.close()


# --- refusals that leave nothing behind, and calls that are not the request's attempt -----


def test_a_write_on_a_table_that_does_not_exist_is_rejected_and_the_key_released(
    fstore: FunctionStore, tables: BusinessTables
) -> None:
    """Refused before anything applied (and refused again as it stands): not an outage
    answered 503 with the key locked, but a TransactionRejectedError naming DynamoDB's
    own message, with the key released."""
    name = unique_name("no-table")
    missing = f"missing-{uuid.uuid4().hex[:8]}"

    @fstore.decorate(key="key", name=name)
    def place(key: str) -> str:
        completion_transaction().put(missing, {"id": key})
        return "unreachable"

    key = fresh_key()
    with pytest.raises(TransactionRejectedError) as raised:
        fstore.run(place, key)
    assert raised.value.reason == "ResourceNotFoundException"
    assert fstore.store.layout.table_name not in str(raised.value)
    assert fstore.get(function_key_hash(name, key)) is None


def test_a_deferral_and_writes_in_one_attempt_are_refused_in_either_order() -> None:
    transaction, attempt = bare_transaction()
    attempt.http, attempt.transaction = True, transaction
    transaction.put("orders", {"id": "o-1"})
    token = CURRENT.set(attempt)
    try:
        with pytest.raises(ValueError, match="cannot also commit writes"):
            defer_completion()
        other, deferring = bare_transaction()
        deferring.http = True
        CURRENT.set(deferring)
        defer_completion()
        with pytest.raises(ValueError, match="deferred its completion"):
            other.put("orders", {"id": "o-2"})
    finally:
        CURRENT.reset(token)


def test_a_function_running_unprotected_inside_an_attempt_does_not_take_it_for_its_own() -> None:
    """A call without a key (required=False) inside another attempt runs with no attempt:
    completion_transaction() there is a LookupError, not the outer attempt's transaction."""
    store = MemoryStore()
    seen: list[str] = []

    @idempotent(store=store, key="key", required=False, name=unique_name("inner"))
    def inner(key: str | None) -> str:
        try:
            completion_transaction()
        except LookupError:
            seen.append("no attempt")
        except TypeError:
            seen.append("the outer attempt")
        return "inner"

    @idempotent(store=store, key="key", name=unique_name("outer"))
    def outer(key: str) -> str:
        inner(None)
        return "outer"

    assert outer(fresh_key()) == "outer"
    assert seen == ["no attempt"]
