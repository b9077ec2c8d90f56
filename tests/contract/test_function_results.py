"""What an ``idempotent`` function's replay gives back, and what identifies its work.

The result codec: a replay returns a value equal to the first call's and of the same type,
for JSON values (falsy ones too), and for dataclasses, Pydantic models, tuples, dates,
UUIDs, ``Decimal`` and enums named in the return annotation. This module's annotations are
strings (``from __future__ import annotations``), as they are in most code. What cannot
be given back is a ``TypeError`` raised with the key released, so a retry runs again.

The payload fingerprint: the canonical JSON of the arguments (or of ``payload=``'s value),
so key order does not matter; what has no JSON form is a ``TypeError`` naming the argument,
raised before anything is claimed.

Most tests run on ``MemoryStore`` with a plain and a coroutine function; the stores' own
encodings are covered by one round trip on every store kind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import enum
import functools
import math
import pickle
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_middleware import KeyReusedError, MemoryStore, idempotent
from idempotency_middleware.functions.payloads import canonical_json
from idempotency_middleware.testing import FakeClock
from tests.support.function_stores import (
    Events,
    FunctionStore,
    fresh_key,
    open_function_store,
)
from tests.support.store_kinds import MEMORY_KINDS, STORE_KINDS


@pytest.fixture(params=MEMORY_KINDS)
def fstore(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
    """A ``MemoryStore``, for a plain function and for a coroutine function."""
    yield from open_function_store(request, request.param)


@pytest.fixture(params=STORE_KINDS)
def any_store(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
    """Every store kind (``tests/support/function_stores.py``)."""
    yield from open_function_store(request, request.param)


# --- the types results are made of --------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    price: decimal.Decimal


@dataclasses.dataclass
class Address:
    street: str
    city: str


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    placed_at: datetime.datetime
    lines: list[Line]
    ship_to: Address | None
    by_warehouse: dict[str, Line]
    color: Color
    dimensions: tuple[int, int, int]
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Tree:
    value: int
    children: list[Tree] = dataclasses.field(default_factory=list)


class InvoiceLine(pydantic.BaseModel):
    sku: str
    amount: decimal.Decimal


class Invoice(pydantic.BaseModel):
    id: uuid.UUID
    issued: datetime.datetime
    due: datetime.date
    lines: list[InvoiceLine]
    priority: Priority


@dataclasses.dataclass
class Shipment:
    invoice: Invoice
    when: datetime.date | None


ORDER = Order(
    id=uuid.UUID("7a4c1e2e-0f5b-4c55-9a5d-6b1f2a3c4d5e"),
    placed_at=datetime.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=datetime.timezone.utc),
    lines=[Line("a", 1, decimal.Decimal("9.99")), Line("b", 2, decimal.Decimal("0.10"))],
    ship_to=Address("1 Main St", "Springfield"),
    by_warehouse={"north": Line("a", 1, decimal.Decimal("9.99"))},
    color=Color.GREEN,
    dimensions=(10, 20, 30),
    notes=["fragile"],
)
INVOICE = Invoice(
    id=uuid.UUID(int=7),
    issued=datetime.datetime(
        2024, 5, 1, 9, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
    ),
    due=datetime.date(2024, 6, 1),
    lines=[InvoiceLine(sku="a", amount=decimal.Decimal("12.50"))],
    priority=Priority.HIGH,
)


def same(first: Any, second: Any) -> bool:
    """Equal and of the same type all the way down (``==`` alone has ``1 == 1.0 == True``)."""
    if type(first) is not type(second):
        return False
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(same(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(same, first, second))
    if dataclasses.is_dataclass(first):
        return all(
            same(getattr(first, field.name), getattr(second, field.name))
            for field in dataclasses.fields(first)
        )
    if isinstance(first, pydantic.BaseModel):
        return all(
            same(getattr(first, name), getattr(second, name)) for name in type(first).model_fields
        )
    return bool(first == second)


def replay_twice(fstore: FunctionStore, function: Callable[..., Any], **options: Any) -> Any:
    """Decorate ``function`` (which takes ``key``); call it with a fresh key, then again.
    The replay must not run it and must be the same as the first result; it is returned."""
    runs: list[int] = []

    @functools.wraps(function)  # keeps its annotations, resolved in this module
    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return function(*args, **kwargs)

    decorated = fstore.decorate(key="key", **options)(counted)
    key = fresh_key()
    first = fstore.run(decorated, key)
    replayed = fstore.run(decorated, key)
    assert runs == [1], "the replay ran the function"
    assert same(replayed, first), (first, replayed)
    return replayed


# --- JSON values ---------------------------------------------------------------------------

JSON_VALUES: list[Any] = [
    {"id": 1, "tags": ["a", "b"], "nested": {"ok": True, "ratio": 0.25, "none": None}},
    [1, "two", 3.5, None, True, {"k": []}],
    "naïve café ✓ 日本",
    2**63 - 1,
    -(2**63),
    1e-300,
    0.1,
    -0.5,
    True,
    {"": {"": [[], {}]}},
]
FALSY: list[Any] = [None, 0, 0.0, "", [], {}, False]


@pytest.mark.parametrize("value", JSON_VALUES, ids=repr)
def test_json_values_replay_equal_and_of_the_same_type(fstore: FunctionStore, value: Any) -> None:
    def produce(key: str) -> Any:
        return value

    assert same(replay_twice(fstore, produce), value)


@pytest.mark.parametrize("value", FALSY, ids=repr)
def test_falsy_values_replay_equal_and_of_the_same_type(fstore: FunctionStore, value: Any) -> None:
    def produce(key: str):  # type: ignore[no-untyped-def]  # unannotated on purpose
        return value

    assert same(replay_twice(fstore, produce), value)


def no_order(key: str) -> Order | None:
    return None


def no_orders(key: str) -> list[Order]:
    return []


def no_invoices(key: str) -> dict[str, Invoice]:
    return {}


def zero(key: str) -> int:
    return 0


def nothing_true(key: str) -> bool:
    return False


def empty_text(key: str) -> str:
    return ""


def no_tuple(key: str) -> tuple[int, ...]:
    return ()


@pytest.mark.parametrize(
    "function",
    [no_order, no_orders, no_invoices, zero, nothing_true, empty_text, no_tuple],
    ids=lambda function: function.__name__,
)
def test_falsy_values_under_annotations_replay_equal_and_of_the_same_type(
    fstore: FunctionStore, function: Callable[[str], Any]
) -> None:
    assert same(replay_twice(fstore, function), function("key"))


# --- dataclasses and Pydantic models, named in the return annotation ----------------------


def an_order(key: str) -> Order:
    return ORDER


def orders(key: str) -> list[Order]:
    return [ORDER, dataclasses.replace(ORDER, ship_to=None, notes=[])]


def maybe_order(key: str) -> Order | None:
    return ORDER


def orders_by_id(key: str) -> dict[str, Order]:
    return {"o-1": ORDER}


def order_and_count(key: str) -> tuple[Order, int]:
    return (ORDER, 2)


def a_tree(key: str) -> Tree:
    return Tree(1, [Tree(2), Tree(3, [Tree(4)])])


def an_invoice(key: str) -> Invoice:
    return INVOICE


def invoices(key: str) -> list[Invoice]:
    return [INVOICE, INVOICE.model_copy(update={"lines": []})]


def maybe_invoice(key: str) -> Invoice | None:
    return INVOICE


def invoices_by_id(key: str) -> dict[str, Invoice]:
    return {"i-7": INVOICE}


def a_shipment(key: str) -> Shipment:
    return Shipment(INVOICE, None)


def a_later_class(key: str) -> DefinedAfterTheFunction:
    return DefinedAfterTheFunction("resolved at first use")


@dataclasses.dataclass
class DefinedAfterTheFunction:
    text: str


STRUCTURED = [
    an_order,
    orders,
    maybe_order,
    orders_by_id,
    order_and_count,
    a_tree,
    an_invoice,
    invoices,
    maybe_invoice,
    invoices_by_id,
    a_shipment,
    a_later_class,
]


@pytest.mark.parametrize("function", STRUCTURED, ids=lambda function: function.__name__)
def test_dataclasses_and_pydantic_models_replay_as_themselves(
    fstore: FunctionStore, function: Callable[[str], Any]
) -> None:
    replayed = replay_twice(fstore, function)
    assert same(replayed, function("key"))


# --- tuples, dates, UUIDs, Decimal, enums under annotations -------------------------------


def a_pair(key: str) -> tuple[int, str]:
    return (1, "one")


def some_numbers(key: str) -> tuple[int, ...]:
    return (1, 2, 3)


def a_bare_tuple(key: str) -> tuple:  # type: ignore[type-arg]
    return (1, "x", None)


def a_naive_datetime(key: str) -> datetime.datetime:
    return datetime.datetime(2024, 2, 29, 23, 59, 59, 999999)


def an_aware_datetime(key: str) -> datetime.datetime:
    return datetime.datetime(2024, 1, 1, 8, tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))


def a_date(key: str) -> datetime.date:
    return datetime.date(2024, 2, 29)


def a_time(key: str) -> datetime.time:
    return datetime.time(13, 37, 0, 250)


def a_uuid(key: str) -> uuid.UUID:
    return uuid.UUID("12345678-1234-5678-1234-567812345678")


def a_decimal(key: str) -> decimal.Decimal:
    return decimal.Decimal("1234.5000")


def a_color(key: str) -> Color:
    return Color.RED


def a_priority(key: str) -> Priority:
    return Priority.HIGH


def dated_amounts(key: str) -> tuple[datetime.date, decimal.Decimal]:
    return (datetime.date(2024, 1, 31), decimal.Decimal("-0.01"))


def timestamps(key: str) -> list[datetime.datetime]:
    return [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2, 3, 4, 5)]


def ids_by_name(key: str) -> dict[str, uuid.UUID]:
    return {"a": uuid.UUID(int=1), "b": uuid.UUID(int=2)}


def maybe_when(key: str) -> datetime.datetime | None:
    return datetime.datetime(2030, 12, 31)


def colors(key: str) -> list[Color]:
    return [Color.GREEN, Color.RED]


SCALARS = [
    a_pair,
    some_numbers,
    a_bare_tuple,
    a_naive_datetime,
    an_aware_datetime,
    a_date,
    a_time,
    a_uuid,
    a_decimal,
    a_color,
    a_priority,
    dated_amounts,
    timestamps,
    ids_by_name,
    maybe_when,
    colors,
]


@pytest.mark.parametrize("function", SCALARS, ids=lambda function: function.__name__)
def test_tuples_dates_uuids_decimals_and_enums_under_annotations_replay_as_themselves(
    fstore: FunctionStore, function: Callable[[str], Any]
) -> None:
    replayed = replay_twice(fstore, function)
    assert same(replayed, function("key"))


def test_a_rich_result_round_trips_on_every_store(any_store: FunctionStore) -> None:
    def checkout(key: str) -> tuple[Order, Invoice, list[Tree]]:
        return (ORDER, INVOICE, [Tree(1, [Tree(2)])])

    replayed = replay_twice(any_store, checkout)
    assert same(replayed, checkout("key"))


# --- what cannot be given back: TypeError, with the key released -------------------------


@dataclasses.dataclass
class Unnamed:
    value: int


def a_set(key: str) -> Any:
    return {"a", "b"}


def an_object(key: str) -> Any:
    return object()


def some_bytes(key: str) -> Any:
    return b"\x00\x01"


def an_unannotated_tuple(key: str) -> Any:
    return (1, 2)


def not_a_number(key: str) -> float:
    return math.nan


def infinity(key: str) -> float:
    return math.inf


def an_unnamed_dataclass(key: str) -> Any:
    return Unnamed(1)


def an_unannotated_datetime(key: str) -> Any:
    return datetime.datetime(2024, 1, 1)


def a_huge_int(key: str) -> int:
    return 2**64


def an_unresolvable_annotation(key: str) -> NoSuchType:  # type: ignore[name-defined]  # noqa: F821
    return 1


def a_tuple_inside_a_list(key: str) -> list[Any]:
    return [(1, 2)]


UNSTORABLE = [
    a_set,
    an_object,
    some_bytes,
    an_unannotated_tuple,
    not_a_number,
    infinity,
    an_unnamed_dataclass,
    an_unannotated_datetime,
    a_huge_int,
    an_unresolvable_annotation,
    a_tuple_inside_a_list,
]


def assert_type_error_with_the_key_released(
    fstore: FunctionStore, function: Callable[..., Any], **options: Any
) -> None:
    """Two calls with one key: both run (the first released the key) and both raise a
    ``TypeError`` naming the function."""
    runs: list[int] = []
    events = Events()

    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return function(*args, **kwargs)

    decorated = fstore.decorate(key="key", on_event=events, **options)(counted)
    key = fresh_key()
    for _ in range(2):
        with pytest.raises(TypeError, match=f"idempotent function .*{function.__name__}"):
            fstore.run(decorated, key)
    assert runs == [1, 1], "the retry did not run: the key was not released"
    assert events.kinds() == ["claimed", "released"] * 2


@pytest.mark.parametrize("function", UNSTORABLE, ids=lambda function: function.__name__)
def test_a_result_that_cannot_be_given_back_raises_type_error_with_the_key_released(
    fstore: FunctionStore, function: Callable[[str], Any]
) -> None:
    assert_type_error_with_the_key_released(fstore, function)


def a_datetime_as_a_date(key: str) -> datetime.date:
    return datetime.datetime(2024, 1, 2, 3, 4, 5)  # a datetime is a date


def a_tree_as_an_order(key: str) -> Order:
    return Tree(1)  # type: ignore[return-value]


@pytest.mark.parametrize(
    "function",
    [a_datetime_as_a_date, a_tree_as_an_order],
    ids=["datetime-as-date", "tree-as-order"],
)
def test_a_result_its_annotation_cannot_rebuild_raises_type_error_naming_the_function(
    fstore: FunctionStore, function: Callable[[str], Any]
) -> None:
    assert_type_error_with_the_key_released(fstore, function)


def test_a_result_its_annotation_cannot_rebuild_still_releases_the_key(
    fstore: FunctionStore,
) -> None:
    # Whatever it raises today (see the bug above), the retry runs again.
    runs: list[int] = []

    @fstore.decorate(key="key")
    def stamp(key: str) -> datetime.date:
        runs.append(1)
        return datetime.datetime(2024, 1, 2, 3, 4, 5)

    key = fresh_key()
    for _ in range(2):
        with pytest.raises((TypeError, ValueError)):
            fstore.run(stamp, key)
    assert runs == [1, 1]


def test_a_serializer_dumps_returning_str_raises_type_error_with_the_key_released(
    fstore: FunctionStore,
) -> None:
    def text_dumps(value: Any) -> bytes:
        return repr(value)  # type: ignore[return-value]  # the mistake under test

    def a_value(key: str) -> complex:
        return 1 + 2j

    assert_type_error_with_the_key_released(fstore, a_value, serializer=(text_dumps, pickle.loads))


# --- serializer=(dumps, loads) -------------------------------------------------------------


class Money:
    """Not JSON, not a dataclass: needs a serializer."""

    def __init__(self, cents: int, currency: str) -> None:
        self.cents = cents
        self.currency = currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.cents, self.currency) == (
            other.cents,
            other.currency,
        )

    def __hash__(self) -> int:
        return hash((self.cents, self.currency))


def some_money(key: str) -> frozenset[Money]:
    return frozenset({Money(100, "EUR"), Money(5, "USD")})


def test_a_serializer_pair_stores_what_json_cannot(fstore: FunctionStore) -> None:
    dumps_calls: list[Any] = []

    def dumps(value: Any) -> bytes:
        dumps_calls.append(value)
        return pickle.dumps(value)

    replayed = replay_twice(fstore, some_money, serializer=(dumps, pickle.loads))
    assert replayed == some_money("key")
    assert type(replayed) is frozenset
    assert len(dumps_calls) == 1


def test_a_serializer_pair_replaces_the_json_codec(fstore: FunctionStore) -> None:
    def dumps(value: Any) -> bytes:
        return b"wrapped:" + pickle.dumps(value)

    def loads(data: bytes) -> Any:
        assert data.startswith(b"wrapped:")
        return pickle.loads(data[len(b"wrapped:") :])

    def a_tuple(key: str) -> Any:  # a tuple needs no annotation with a serializer
        return (1, "a")

    assert replay_twice(fstore, a_tuple, serializer=(dumps, loads)) == (1, "a")


# --- the payload fingerprint ---------------------------------------------------------------


@dataclasses.dataclass
class Customer:
    id: int
    email: str


class Card(pydantic.BaseModel):
    last4: str
    expiry: datetime.date


ACCEPTED_ARGUMENTS: list[tuple[str, Any, Any, Any]] = [
    # (id, a value, an equal value built differently, a different value)
    ("dict-key-order", {"a": 1, "b": {"x": 1, "y": 2}}, {"b": {"y": 2, "x": 1}, "a": 1}, {"a": 2}),
    ("dataclass", Customer(1, "a@example.com"), Customer(1, "a@example.com"), Customer(2, "a")),
    (
        "pydantic",
        Card(last4="4242", expiry=datetime.date(2030, 1, 1)),
        Card(last4="4242", expiry=datetime.date(2030, 1, 1)),
        Card(last4="4242", expiry=datetime.date(2031, 1, 1)),
    ),
    ("date", datetime.date(2024, 1, 1), datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)),
    (
        "datetime",
        datetime.datetime(2024, 1, 1, 12),
        datetime.datetime(2024, 1, 1, 12),
        datetime.datetime(2024, 1, 1, 13),
    ),
    ("uuid", uuid.UUID(int=1), uuid.UUID("00000000-0000-0000-0000-000000000001"), uuid.UUID(int=2)),
    ("decimal", decimal.Decimal("1.50"), decimal.Decimal("1.50"), decimal.Decimal("1.51")),
    ("set", {3, 1, 2}, {2, 3, 1}, {1, 2}),
    ("mixed-set", {"b", 1, "a"}, frozenset(["a", 1, "b"]), {"a", 1}),
    ("bytes", b"\x00\xff", bytearray(b"\x00\xff"), b"\x00\xfe"),
    ("enum", Color.RED, Color("red"), Color.GREEN),
    ("tuple", (1, "a"), (1, "a"), (1, "b")),
]


@pytest.mark.parametrize(
    ("value", "equal", "different"),
    [case[1:] for case in ACCEPTED_ARGUMENTS],
    ids=[case[0] for case in ACCEPTED_ARGUMENTS],
)
def test_payload_arguments_are_fingerprinted_by_their_canonical_json(
    fstore: FunctionStore, value: Any, equal: Any, different: Any
) -> None:
    runs: list[Any] = []

    @fstore.decorate(key="key")
    def handle(key: str, argument: Any) -> str:
        runs.append(argument)
        return "handled"

    key = fresh_key()
    assert fstore.run(handle, key, value) == "handled"
    assert fstore.run(handle, key, equal) == "handled"  # the same payload: a replay
    with pytest.raises(KeyReusedError):
        fstore.run(handle, key, different)
    assert runs == [value]


def test_a_payload_callables_value_is_fingerprinted_by_its_canonical_json(
    fstore: FunctionStore,
) -> None:
    runs: list[str] = []

    @fstore.decorate(key="key", payload=lambda key, order, trace: {"order": order, "v": 1})
    def place(key: str, order: dict[str, Any], trace: str) -> str:
        runs.append(trace)
        return "placed"

    key = fresh_key()
    assert fstore.run(place, key, {"sku": "a", "qty": 1}, "t-1") == "placed"
    assert fstore.run(place, key, {"qty": 1, "sku": "a"}, "t-2") == "placed"
    with pytest.raises(KeyReusedError):
        fstore.run(place, key, {"sku": "a", "qty": 2}, "t-3")
    assert runs == ["t-1"]


def test_canonical_json_ignores_key_order_and_set_order() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == b'{"a":[1,{"c":3,"d":2}],"b":1}'
    assert canonical_json({3, 1, 2}) == canonical_json({2, 1, 3}) == b"[1,2,3]"
    assert canonical_json(b"\x01\xab") == b'"01ab"'
    assert canonical_json(decimal.Decimal("2.50")) == b'"2.50"'


class Opaque:
    """An argument with no JSON form."""


UNFINGERPRINTABLE: list[tuple[str, Any]] = [
    ("object", Opaque()),
    ("function", lambda: None),
    ("nested", {"retries": [1, Opaque()]}),
    ("huge-int", 2**64),
]


@pytest.mark.parametrize(
    "value",
    [case[1] for case in UNFINGERPRINTABLE],
    ids=[case[0] for case in UNFINGERPRINTABLE],
)
def test_an_argument_without_json_form_raises_type_error_naming_it_before_any_claim(
    fstore: FunctionStore, value: Any
) -> None:
    counting = fstore.counting()
    events = Events()
    runs: list[str] = []

    @fstore.decorate(key="key", store=counting, on_event=events)
    def send(key: str, recipient: str, options: Any) -> str:
        runs.append(key)
        return "sent"

    with pytest.raises(TypeError, match="argument 'options'"):
        fstore.run(send, fresh_key(), "someone", value)
    assert runs == []
    assert counting.total() == 0, counting.calls  # the store was never asked
    assert events.all == []


def test_a_payload_without_json_form_raises_type_error_before_any_claim(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()
    runs: list[str] = []

    @fstore.decorate(key="key", store=counting, payload=lambda key: {"at": Opaque()})
    def send(key: str) -> str:
        runs.append(key)
        return "sent"

    with pytest.raises(TypeError, match="payload"):
        fstore.run(send, fresh_key())
    assert runs == []
    assert counting.total() == 0


def test_a_nan_argument_raises_type_error_naming_it_before_any_claim(
    fstore: FunctionStore,
) -> None:
    counting = fstore.counting()

    @fstore.decorate(key="key", store=counting)
    def measure(key: str, reading: float | None) -> str:
        return "measured"

    with pytest.raises(TypeError, match="argument 'reading'"):
        fstore.run(measure, fresh_key(), math.nan)
    assert counting.total() == 0


def test_a_nan_argument_and_none_are_two_payloads(fstore: FunctionStore) -> None:
    runs: list[float | None] = []

    @fstore.decorate(key="key")
    def measure(key: str, reading: float | None) -> str:
        runs.append(reading)
        return "measured"

    key = fresh_key()
    fstore.run(measure, key, None)
    with pytest.raises(TypeError, match="argument 'reading'"):
        fstore.run(measure, key, math.inf)
    assert runs == [None]


# --- properties ----------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=16,
)

_CLOCK = FakeClock()
_STORE = MemoryStore(clock=_CLOCK)


def _echo(key: str, value: Any) -> Any:
    return value


async def _aecho(key: str, value: Any) -> Any:
    return value


# (Typed here: mypy makes a decorated function returning ``Any`` untyped.)
echo: Callable[[str, Any], Any] = idempotent(store=_STORE, key="key", clock=_CLOCK)(_echo)
aecho: Callable[[str, Any], Awaitable[Any]] = idempotent(store=_STORE, key="key", clock=_CLOCK)(
    _aecho
)


@settings(max_examples=150, deadline=None)
@given(value=JSON)
def test_property_any_json_value_replays_equal_and_of_the_same_type(value: Any) -> None:
    key = fresh_key()
    assert echo(key, value) is value
    assert same(echo(key, value), value)


@settings(max_examples=50, deadline=None)
@given(value=JSON)
def test_property_any_json_value_replays_from_a_coroutine_function(value: Any) -> None:
    async def twice() -> Any:
        key = fresh_key()
        await aecho(key, value)
        return await aecho(key, value)

    assert same(asyncio.run(twice()), value)


@settings(max_examples=100, deadline=None)
@given(value=st.dictionaries(st.text(max_size=6), JSON, min_size=1, max_size=6))
def test_property_a_payload_in_any_key_order_is_the_same_payload(value: dict[str, Any]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert canonical_json(reordered) == canonical_json(value)
    key = fresh_key()
    echo(key, value)
    assert same(echo(key, reordered), value)  # a replay, not a KeyReusedError
