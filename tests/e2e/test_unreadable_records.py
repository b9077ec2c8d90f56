"""A stored record that cannot be decoded (corrupt bytes where its response is) is never
replayed and never run again: the HTTP doors answer 500 problem+json
``stored-response-unreadable`` (not the server's plain-text 500), functions and consumers
raise ``StoredResultUnreadableError``, and every door reports an ``unreadable`` event.

The bytes are written behind the store's back (tests/support/raw_records.py) into a SQLite file, a
Redis hash, a PostgreSQL row and a DynamoDB item on moto; the doors are the ASGI middleware
(uvicorn + FastAPI), the WSGI middleware (waitress + Flask), Django (waitress) and
``idempotent`` / ``IdempotentConsumer``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import (
    IdempotencyEvent,
    IdempotentConsumer,
    SQLiteStore,
    StoredResultUnreadableError,
    idempotent,
)
from idempotency_middleware.stores.dynamodb.requests import TableLayout, item_to_record
from idempotency_middleware.stores.records import (
    Record,
    Status,
    StoredResponse,
    UnreadableResponse,
    decode_response,
    encode_response,
    read_response,
    record_from_fields,
)
from tests.conftest import open_harness
from tests.e2e.test_adapter_paths import EventLog, assert_problem
from tests.e2e.test_django import DjangoServers
from tests.support.apps import POST_ORDERS
from tests.support.raw_records import RAW_KINDS, RawStore, open_raw_store, raw_store_of
from tests.support.servers import SQLITE_COMBOS, Combo, Harness

# Bytes no store ever wrote: an unknown format byte, a cut-short head, a zlib stream that
# does not decompress, a head that is not JSON.
CORRUPT = [
    b"\xff\x00garbage",
    b"\x01\x00\x00",
    b"\x02not zlib at all",
    b"\x01\x00\x00\x00\x05{{{{{body",
]

DOOR_COMBOS = [Combo(adapter, store) for adapter in ("asgi", "wsgi") for store in RAW_KINDS]


@pytest.fixture(params=DOOR_COMBOS, ids=lambda combo: combo.id)
def raw_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from open_harness(request, request.param)


@pytest.fixture(params=RAW_KINDS)
def raw_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RawStore]:
    yield from open_raw_store(request, request.param, tmp_path)


@pytest.fixture
def django_servers() -> Iterator[DjangoServers]:
    with contextlib.ExitStack() as stack:
        yield DjangoServers(stack)


def key_hash_of(events: EventLog) -> str:
    return events.wait_for("completed").key_hash


# --- the records layer ---------------------------------------------------------------------


@pytest.mark.parametrize("blob", [b"", *CORRUPT])
def test_bytes_that_are_no_stored_response_decode_to_unreadable_not_an_exception(
    blob: bytes,
) -> None:
    with pytest.raises(ValueError):
        decode_response(blob)

    unreadable = read_response(blob)

    assert type(unreadable) is UnreadableResponse
    assert unreadable.reason


def test_a_stored_response_still_reads_back_as_it_was() -> None:
    response = StoredResponse(201, [(b"content-type", b"text/plain")], b"x" * 5000)

    assert read_response(encode_response(response)) == response


# --- HTTP doors on every store -------------------------------------------------------------


def test_an_undecodable_record_is_a_500_problem_and_never_runs_again(
    raw_harness: Harness,
) -> None:
    events = EventLog()
    client = raw_harness.serve(on_event=events)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = client.post("/orders", json={"n": 1}, headers=key)
    assert first.status_code == 201
    raw_store_of(raw_harness).corrupt(key_hash_of(events), CORRUPT[0])

    retries = [client.post("/orders", json={"n": 1}, headers=key) for _ in range(2)]

    for retry in retries:
        assert_problem(retry, 500, "stored-response-unreadable")
        assert "idempotent-replayed" not in retry.headers
    assert raw_harness.calls(POST_ORDERS) == 1
    unreadable = events.wait_for("unreadable")
    assert unreadable.status == 500
    assert unreadable.error is not None and "format" in unreadable.error


@pytest.fixture(params=SQLITE_COMBOS, ids=lambda combo: combo.id)
def sqlite_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from open_harness(request, request.param)


def test_the_unreadable_problem_follows_the_problem_base_url(sqlite_harness: Harness) -> None:
    raw_harness = sqlite_harness
    events = EventLog()
    base = "https://api.example.com/problems/"
    client = raw_harness.serve(on_event=events, problem_base_url=base)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    client.post("/orders", json={"n": 1}, headers=key)
    raw_store_of(raw_harness).corrupt(key_hash_of(events), CORRUPT[0])

    retry = client.post("/orders", json={"n": 1}, headers=key)

    assert retry.json()["type"] == base + "stored-response-unreadable"
    assert retry.headers["cache-control"] == "no-store"
    assert int(retry.headers["content-length"]) == len(retry.content)


@pytest.mark.parametrize("asgi", [False, True], ids=["wsgi", "asgi"])
def test_django_answers_an_undecodable_record_with_the_500_problem(
    django_servers: DjangoServers, tmp_path: Path, asgi: bool
) -> None:
    store = SQLiteStore(tmp_path / "django.sqlite3")
    served = django_servers.start(store=store, asgi=asgi)
    key = str(uuid.uuid4())
    assert served.post_order(key).status_code == 201
    raw = RawStore("sqlite", store, store.path)
    raw.corrupt(served.events.wait_for("completed").key_hash, CORRUPT[1])

    retry = served.post_order(key)

    assert_problem(retry, 500, "stored-response-unreadable")
    assert served.state.calls("POST /orders/{order_id}") == 1
    assert served.events.wait_for("unreadable").status == 500
    store.close()


# --- functions and consumers on every store --------------------------------------------------


def test_an_undecodable_result_raises_and_the_function_never_runs_again(
    raw_store: RawStore,
) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []

    @idempotent(store=raw_store.store, key="order_id", on_event=events.append)
    def charge(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"charged": order_id}

    order_id = uuid.uuid4().hex
    assert charge(order_id) == {"charged": order_id}
    completed = next(event for event in events if event.kind == "completed")
    raw_store.corrupt(completed.key_hash, CORRUPT[2])

    for _ in range(2):
        with pytest.raises(StoredResultUnreadableError, match="cannot be read"):
            charge(order_id)

    assert runs == [order_id]
    assert [event.kind for event in events].count("unreadable") == 2


def test_a_consumer_gives_up_on_an_undecodable_result_without_running(
    raw_store: RawStore,
) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []

    def handle(message: str) -> str:
        runs.append(message)
        return message.upper()

    consumer = IdempotentConsumer(
        handle,
        store=raw_store.store,
        key=str,
        name=f"unreadable-{uuid.uuid4().hex}",
        on_event=events.append,
    )
    message = uuid.uuid4().hex
    assert consumer.process(message).action == "ack"
    completed = next(event for event in events if event.kind == "completed")
    raw_store.corrupt(completed.key_hash, CORRUPT[3])

    outcome = consumer.process(message)

    assert outcome.action == "dead"
    assert isinstance(outcome.error, StoredResultUnreadableError)
    assert runs == [message]
    assert "unreadable" in [event.kind for event in events]


# --- records whose other fields are corrupt ---------------------------------------------------

# Per store kind, (field, value) writes no store makes: an unknown status, text that is not
# UTF-8, a deadline that is no number, a missing field (None: removed). PostgreSQL's typed,
# NOT NULL columns leave only the status to corrupt.
CORRUPT_FIELDS: dict[str, list[tuple[str, Any]]] = {
    "sqlite": [
        ("status", "bogus"),
        ("fingerprint", b"\xff\xfe"),
        ("owner", b"\x80"),
        ("expires_at", "soon"),
    ],
    "redis": [
        ("status", b"bogus"),
        ("fingerprint", b"\xff\xfe"),
        ("expires_at", b"soon"),
        ("owner", None),
        ("status", None),
    ],
    "postgres": [("status", "bogus")],
    "dynamodb": [
        ("status", {"S": "bogus"}),
        ("fingerprint", {"N": "1"}),
        ("owner", None),
    ],
}
FIELD_CASES = [(kind, *case) for kind, cases in CORRUPT_FIELDS.items() for case in cases]


def test_a_record_with_corrupt_fields_decodes_to_an_unreadable_completed_record() -> None:
    record = record_from_fields("k", "bogus", "f", "o", 1.0, 2.0, None)

    assert record.status is Status.COMPLETED
    assert type(record.response) is UnreadableResponse
    assert "bogus" in record.response.reason
    assert not record.is_claimable(now=1e12)
    # A DynamoDB deadline of the wrong type (moto cannot evaluate the claim's condition on
    # one, so it is not in CORRUPT_FIELDS).
    item = {"pk": {"S": "k"}, "status": {"S": "completed"}, "fingerprint": {"S": "f"}}
    item |= {"owner": {"S": "o"}, "lock_expires_at": {"S": "soon"}, "expires_at": {"N": "2"}}
    from_item = item_to_record(TableLayout("t"), item)
    assert type(from_item.response) is UnreadableResponse
    assert "lock_expires_at" in from_item.response.reason
    readable = record_from_fields("k", b"completed", b"f", "o", b"1.5", "2", None, True, b"3")
    assert readable == Record("k", Status.COMPLETED, "f", "o", 1.5, 2.0, None, True, 3)


def test_a_record_with_a_corrupt_field_is_a_500_problem_and_never_runs_again(
    raw_harness: Harness,
) -> None:
    field, value = CORRUPT_FIELDS[raw_harness.store_kind][0]
    events = EventLog()
    client = raw_harness.serve(on_event=events)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    assert client.post("/orders", json={"n": 1}, headers=key).status_code == 201
    raw_store_of(raw_harness).set_field(key_hash_of(events), field, value)

    retry = client.post("/orders", json={"n": 1}, headers=key)

    assert_problem(retry, 500, "stored-response-unreadable")
    assert raw_harness.calls(POST_ORDERS) == 1
    unreadable = events.wait_for("unreadable")
    assert unreadable.error is not None and "corrupt" in unreadable.error


@pytest.mark.parametrize(("kind", "field", "value"), FIELD_CASES)
def test_a_function_whose_record_has_a_corrupt_field_raises_and_never_runs_again(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, field: str, value: Any
) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []
    for raw in open_raw_store(request, kind, tmp_path):

        @idempotent(store=raw.store, key="order_id", on_event=events.append)
        def charge(order_id: str) -> dict[str, str]:
            runs.append(order_id)
            return {"charged": order_id}

        order_id = uuid.uuid4().hex
        assert charge(order_id) == {"charged": order_id}
        completed = next(event for event in events if event.kind == "completed")
        raw.set_field(completed.key_hash, field, value)

        with pytest.raises(StoredResultUnreadableError, match="corrupt"):
            charge(order_id)

        assert runs == [order_id]
        assert [event.kind for event in events].count("unreadable") == 1
