"""``encryption=Encryption(keys=..., current=...)``: responses and results are sealed with
AES-256-GCM once, before any store, and opened on a replay.

The raw records of every store kind (the SQLite file and its WAL, the Redis hash, the
PostgreSQL row, the DynamoDB item on moto and its S3 overflow object) hold no plaintext of
a distinctive body; rotation keeps older records readable while their key is listed; a
record that does not open (unknown key id, tampered with, moved to another key) is answered
as unreadable and never run again; plaintext records written before encryption was turned
on still replay. Doors: ASGI (uvicorn), WSGI (waitress), Django, ``idempotent`` and
``IdempotentConsumer``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import (
    Encryption,
    IdempotencyEvent,
    IdempotentConsumer,
    MemoryStore,
    SQLiteStore,
    StoredResultUnreadableError,
    idempotent,
)
from idempotency_middleware.stores.records import FORMAT_SEALED, SealedResponse
from tests.conftest import open_harness
from tests.e2e.test_adapter_paths import EventLog, assert_problem
from tests.e2e.test_django import DjangoServers
from tests.support.apps import POST_ORDERS
from tests.support.raw_records import RAW_KINDS, RawStore, open_raw_store, raw_store_of
from tests.support.servers import Combo, Harness
from tests.unit.test_missing_extras import run_python

KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))
OLD = Encryption(keys={"2026-10": KEY_A}, current="2026-10")
ROTATED = Encryption(keys={"2026-10": KEY_A, "2026-11": KEY_B}, current="2026-11")
ONLY_NEW = Encryption(keys={"2026-11": KEY_B}, current="2026-11")

DOOR_COMBOS = [Combo(adapter, store) for adapter in ("asgi", "wsgi") for store in RAW_KINDS]


def secret() -> str:
    """A distinctive value, as a card fragment or an address would be."""
    return f"card-4242-{uuid.uuid4().hex}"


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


# --- construction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "current", "error", "match"),
    [
        ({"k": b"x" * 31}, "k", ValueError, "31 bytes; AES-256 needs exactly 32"),
        ({"k": b"x" * 64}, "k", ValueError, "64 bytes"),
        ({"k": "x" * 32}, "k", TypeError, "must be bytes"),
        ({"k": KEY_A}, "other", ValueError, "current='other' must name one of the keys"),
        ({}, "k", ValueError, "needs keys"),
        ({"": KEY_A}, "", TypeError, "non-empty str"),
        ({"a\nb": KEY_A}, "a\nb", ValueError, "printable"),
    ],
)
def test_bad_keys_are_refused_at_construction(
    keys: dict[str, Any], current: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Encryption(keys=keys, current=current)


def test_its_repr_names_the_key_ids_never_the_keys() -> None:
    assert repr(ROTATED) == "Encryption(keys=['2026-10', '2026-11'], current='2026-11')"
    assert KEY_A.hex() not in repr(ROTATED) and repr(KEY_A) not in repr(ROTATED)


def test_a_door_refuses_anything_but_an_encryption() -> None:
    with pytest.raises(TypeError, match="encryption must be an Encryption"):
        idempotent(store=MemoryStore(), key="k", encryption={"k": KEY_A})  # type: ignore[arg-type]


def test_without_cryptography_it_names_the_extra() -> None:
    result = run_python(
        """
        from idempotency_middleware import Encryption
        try:
            Encryption(keys={"k": bytes(32)}, current="k")
        except ImportError as error:
            print(type(error).__name__, error.name)
            print(error)
        """,
        ("cryptography",),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ModuleNotFoundError cryptography",
        "Encryption needs cryptography, which is not installed: "
        'pip install "idempotency-middleware[encryption]"',
    ]


# --- HTTP doors on every store: no plaintext, replayed as it was -----------------------------


def test_http_responses_are_stored_sealed_and_replayed_byte_for_byte(
    raw_harness: Harness,
) -> None:
    events = EventLog()
    client = raw_harness.serve(encryption=ROTATED, on_event=events)
    value = secret()
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = client.post("/orders", json={"card": value}, headers=key)
    assert first.status_code == 201 and value in first.text

    raw = raw_store_of(raw_harness).raw(events.wait_for("completed").key_hash)
    replay = client.post("/orders", json={"card": value}, headers=key)

    assert value.encode() not in raw
    assert b"2026-11" in raw  # the key id beside the ciphertext
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == first.content
    assert replay.headers["content-type"] == first.headers["content-type"]
    assert raw_harness.calls(POST_ORDERS) == 1


def test_django_stores_sealed_and_replays(django_servers: DjangoServers, tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "django.sqlite3")
    served = django_servers.start(store=store, encryption=ROTATED)
    key = str(uuid.uuid4())
    first = served.post_order(key)
    raw = RawStore("sqlite", store, store.path).raw(served.events.wait_for("completed").key_hash)

    replay = served.post_order(key)

    assert b'"book"' in first.content and b'"book"' not in raw
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == first.content
    assert served.state.calls("POST /orders/{order_id}") == 1
    store.close()


# --- functions and consumers on every store, the S3 overflow included ------------------------


def test_results_are_stored_sealed_on_every_store_and_in_s3(raw_store: RawStore) -> None:
    events: list[IdempotencyEvent] = []
    runs: list[str] = []

    @idempotent(store=raw_store.store, key="order_id", encryption=ROTATED, on_event=events.append)
    def charge(order_id: str, padding: int = 0) -> dict[str, str]:
        runs.append(order_id)
        # Over DynamoDB's item limit when padded, incompressible: it goes to S3.
        return {"card": order_id, "padding": os.urandom(padding).hex()}

    for padding in (0, 400 * 1024):
        value = secret()
        result = charge(value, padding)
        key_hash = [event for event in events if event.kind == "completed"][-1].key_hash
        raw = raw_store.raw(key_hash)
        assert value.encode() not in raw
        if padding:
            assert result["padding"][:64].encode() not in raw
            if raw_store.kind == "dynamodb":
                assert b"response_ref" in raw  # the S3 object was read too
        assert charge(value, padding) == result
    assert len(runs) == 2


def test_a_consumer_stores_its_results_sealed(raw_store: RawStore) -> None:
    events: list[IdempotencyEvent] = []
    consumer = IdempotentConsumer(
        lambda message: {"echo": message},
        store=raw_store.store,
        key=str,
        name=f"sealed-{uuid.uuid4().hex}",
        encryption=ROTATED,
        on_event=events.append,
    )
    value = secret()
    assert consumer.process(value).action == "ack"
    raw = raw_store.raw(next(event for event in events if event.kind == "completed").key_hash)

    again = consumer.process(value)

    assert value.encode() not in raw
    assert again.replayed and again.result == {"echo": value}


def test_memory_store_keeps_the_sealed_envelope_only() -> None:
    store = MemoryStore()
    value = secret()

    @idempotent(store=store, key="key", encryption=OLD)
    def work(key: str) -> str:
        return value

    work("k-1")

    (record,) = store._records.values()
    assert type(record.response) is SealedResponse
    assert value not in repr(record) and value.encode() not in record.response.body


# --- rotation, tampering, plaintext from before ----------------------------------------------


def sealed_charge(store: Any, encryption: Encryption | None, runs: list[str], **kw: Any) -> Any:
    @idempotent(store=store, key="order_id", name="charge", encryption=encryption, **kw)
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    return charge


def test_rotation_keeps_records_of_an_older_listed_key_replaying(raw_store: RawStore) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []
    before = sealed_charge(raw_store.store, OLD, runs, on_event=events.append)
    assert before("o-1") == "charged o-1"
    old_hash = events[-1].key_hash

    after = sealed_charge(raw_store.store, ROTATED, runs, on_event=events.append)

    assert after("o-1") == "charged o-1"  # sealed under 2026-10, still listed
    assert after("o-2") == "charged o-2"  # sealed under the new current key
    assert b"2026-10" in raw_store.raw(old_hash)
    assert b"2026-11" in raw_store.raw(events[-1].key_hash)
    assert runs == ["o-1", "o-2"]


def test_a_record_under_a_key_no_longer_listed_is_unreadable_never_rerun(
    raw_store: RawStore,
) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []
    sealed_charge(raw_store.store, OLD, runs)("o-1")

    dropped = sealed_charge(raw_store.store, ONLY_NEW, runs, on_event=events.append)

    with pytest.raises(StoredResultUnreadableError, match="key id '2026-10'"):
        dropped("o-1")
    assert runs == ["o-1"]
    assert [event.kind for event in events] == ["unreadable"]


def test_a_tampered_record_is_unreadable_never_rerun(raw_store: RawStore) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []
    charge = sealed_charge(raw_store.store, ROTATED, runs, on_event=events.append)
    charge("o-1")
    key_hash = events[-1].key_hash
    blob = bytearray(encoded_sealed(raw_store, key_hash))
    blob[-1] ^= 1  # one bit of the tag
    raw_store.corrupt(key_hash, bytes(blob))

    with pytest.raises(StoredResultUnreadableError, match="does not authenticate"):
        charge("o-1")
    assert runs == ["o-1"]


def test_a_sealed_record_moved_to_another_key_does_not_open(raw_store: RawStore) -> None:
    runs: list[str] = []
    events: list[IdempotencyEvent] = []
    charge = sealed_charge(raw_store.store, ROTATED, runs, on_event=events.append)
    charge("o-1")
    first = events[-1].key_hash
    charge("o-2")
    second = events[-1].key_hash
    raw_store.corrupt(second, encoded_sealed(raw_store, first))

    with pytest.raises(StoredResultUnreadableError):
        charge("o-2")
    assert runs == ["o-1", "o-2"]


def encoded_sealed(raw_store: RawStore, key_hash: str) -> bytes:
    """The stored (encoded) sealed response of ``key_hash``, as the store reads it back."""
    record = raw_store.store.get(key_hash)
    assert type(record.response) is SealedResponse
    return bytes([FORMAT_SEALED]) + record.response.body


def test_plaintext_records_from_before_encryption_still_replay(raw_store: RawStore) -> None:
    runs: list[str] = []
    sealed_charge(raw_store.store, None, runs)("o-1")

    assert sealed_charge(raw_store.store, ROTATED, runs)("o-1") == "charged o-1"
    assert runs == ["o-1"]


def test_a_sealed_record_read_without_encryption_is_unreadable(raw_harness: Harness) -> None:
    events = EventLog()
    key = {"Idempotency-Key": str(uuid.uuid4())}
    sealed = raw_harness.serve(encryption=OLD)
    assert sealed.post("/orders", json={"n": 1}, headers=key).status_code == 201

    plain = raw_harness.serve(on_event=events)
    retry = plain.post("/orders", json={"n": 1}, headers=key)

    assert_problem(retry, 500, "stored-response-unreadable")
    assert raw_harness.calls(POST_ORDERS) == 1
    assert "no encryption=" in (events.wait_for("unreadable").error or "")


# --- pickle ------------------------------------------------------------------------------


def test_a_pickle_serializer_warns_once_at_decoration() -> None:
    with pytest.warns(UserWarning, match="pickle") as caught:
        decorate = idempotent(store=MemoryStore(), key="k", serializer=(pickle.dumps, pickle.loads))
    assert len(caught) == 1
    assert caught[0].filename == __file__

    @decorate
    def work(k: str) -> set[int]:
        return {1}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert work("a") == {1} and work("a") == {1}


def shout(message: str) -> str:
    return message.upper()


def test_a_consumer_with_a_pickle_serializer_warns_too() -> None:
    with pytest.warns(UserWarning, match="pickle"):
        IdempotentConsumer(
            shout, store=MemoryStore(), key=str, serializer=(pickle.dumps, pickle.loads)
        )


def test_with_encryption_a_pickle_serializer_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idempotent(
            store=MemoryStore(), key="k", serializer=(pickle.dumps, pickle.loads), encryption=OLD
        )
        IdempotentConsumer(
            shout,
            store=MemoryStore(),
            key=str,
            serializer=(pickle.dumps, pickle.loads),
            encryption=OLD,
        )


# --- the command line -------------------------------------------------------------------------


def test_show_says_a_record_is_encrypted_or_unreadable_instead_of_printing_bytes() -> None:
    from idempotency_middleware.cli.records import record_as_json
    from idempotency_middleware.stores.records import UnreadableResponse

    store = MemoryStore()
    value = secret()
    sealed_charge(store, OLD, [])(value)
    (record,) = store._records.values()
    assert record.response is not None

    shown = record_as_json(record)
    unreadable = record_as_json(record._replace(response=UnreadableResponse.because("corrupt")))

    assert shown["response"] == {"encrypted": True, "size": len(record.response.body)}
    assert value not in repr(shown)
    assert unreadable["response"] == {"unreadable": "corrupt"}


def test_replays_from_the_replay_cache_are_opened_too() -> None:
    store = MemoryStore()
    runs: list[str] = []
    charge = sealed_charge(store, ROTATED, runs, replay_cache_size=8)

    results = [charge("o-1") for _ in range(3)]

    assert results == ["charged o-1"] * 3
    assert runs == ["o-1"]
    (record,) = store._records.values()
    assert type(record.response) is SealedResponse


PLANTED: list[str] = []


def plant(what: str) -> None:
    PLANTED.append(what)


class Planted:
    """What a writer of the store could plant in a pickled result: code run when unpickled."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (plant, ("ran",))


def test_with_a_pickle_serializer_and_encryption_a_plain_record_is_never_unpickled(
    raw_store: RawStore,
) -> None:
    runs: list[str] = []
    serializer = (pickle.dumps, pickle.loads)
    events: list[IdempotencyEvent] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = sealed_charge(raw_store.store, None, runs, serializer=serializer)
    plain("o-1")  # a plain record, as anyone who can write the store could write
    sealed = sealed_charge(
        raw_store.store, ROTATED, runs, serializer=serializer, on_event=events.append
    )
    planted = bytes([1]) + len(b"[200,[]]").to_bytes(4, "big") + b"[200,[]]"
    planted += pickle.dumps(Planted())
    sealed("o-2")
    assert sealed("o-2") == "charged o-2"  # its own encrypted records replay
    key_hash = events[-1].key_hash
    raw_store.corrupt(key_hash, planted)

    for order in ("o-1", "o-2"):
        with pytest.raises(StoredResultUnreadableError, match="not encrypted"):
            sealed(order)
    assert PLANTED == []
    assert runs == ["o-1", "o-2"]
    plain("o-2")  # the same record read by a door without encryption: the payload is live
    assert PLANTED == ["ran"]
    PLANTED.clear()
