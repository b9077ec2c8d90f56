"""One-time actions on every store kind: every state, every transition, every error, and
what each operation costs on the wire (DynamoDB kinds counted by a proxy, Redis by the
server's command statistics, PostgreSQL by libpq's protocol trace).

Kinds (``tests/support/action_stores.py``): MemoryStore and SQLiteStore through their sync and async
methods, both DynamoDB stores on moto, and both on DynamoDB Local (skipped unless
``scripts/dynamodb-local.sh`` runs them), RedisStore and PostgresStore through their sync and
async methods on real servers. Time is the store's ``FakeClock``.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from idempotency_middleware import (
    Action,
    ActionAlreadyUsedError,
    ActionCanceledError,
    ActionExistsError,
    ActionExpiredError,
    ActionLockedError,
    ActionNotActiveError,
    ActionNotFoundError,
    ActionState,
    InvalidPinError,
    OneTimeActions,
    SQLiteStore,
    StoreUnavailableError,
)
from idempotency_middleware.actions import flows
from idempotency_middleware.actions.model import DEFAULT_RETENTION_SECONDS
from idempotency_middleware.actions.pins import hash_pin
from idempotency_middleware.actions.steps import Consume, Insert, Step, Written
from tests.support.action_stores import (
    ActionsUnderTest,
    open_actions,
    unreachable_store,
)
from tests.support.store_kinds import DYNAMODB_KINDS, STORE_KINDS

T = TypeVar("T")

TTL = 600.0
PIN = "493817"


@pytest.fixture(params=STORE_KINDS)
def kind(request: pytest.FixtureRequest) -> Iterator[ActionsUnderTest]:
    yield from open_actions(request, request.param)


def fresh_id(prefix: str) -> str:
    """A caller-chosen id no other test uses (DynamoDB tables live for the whole run)."""
    return prefix + uuid.uuid4().hex


def at(clock_now: float) -> datetime:
    return datetime.fromtimestamp(round(clock_now, 6), tz=timezone.utc)


def costs(kind: ActionsUnderTest, expected: list[str]) -> None:
    """Exactly ``expected`` (DynamoDB operations) reached the wire since the last check: on
    Redis one script call (``EVALSHA``) each, on PostgreSQL one statement each."""
    calls = kind.calls()
    if calls is not None:
        assert calls == kind.costs(expected)


# -- create and get -------------------------------------------------------------------------


def test_create_returns_an_active_action_with_a_random_url_safe_id(kind: ActionsUnderTest) -> None:
    now = kind.clock.now()
    kind.calls()
    action = kind.create(expires_in=TTL, data={"user": 42, "scopes": ["a", "b"], "ok": True})
    costs(kind, ["PutItem"])
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", action.action_id)  # 24 random bytes: 192 bits
    assert action.state is ActionState.ACTIVE
    assert action.created_at == action.active_at == at(now)
    assert action.created_at.tzinfo is timezone.utc
    assert action.expires_at == at(now) + timedelta(seconds=TTL)
    assert (action.consumed_at, action.consumed_reason, action.canceled_at) == (None, None, None)
    assert action.pin_attempts_left is None
    assert action.data == {"user": 42, "scopes": ["a", "b"], "ok": True}
    assert kind.get(action.action_id) == action
    costs(kind, ["GetItem"])


def test_two_creates_get_two_different_ids(kind: ActionsUnderTest) -> None:
    first, second = kind.create(expires_in=TTL), kind.create(expires_in=TTL)
    assert first.action_id != second.action_id
    assert first.data is None


def test_create_with_an_id_that_is_taken_raises_action_exists_and_changes_nothing(
    kind: ActionsUnderTest,
) -> None:
    action_id = fresh_id("coupon-SUMMER.2026~")
    action = kind.create(expires_in=TTL, action_id=action_id, data=1)
    kind.calls()
    with pytest.raises(ActionExistsError) as raised:
        kind.create(expires_in=TTL * 2, action_id=action_id, data=2)
    costs(kind, ["PutItem"])
    assert raised.value.status == 409
    assert kind.get(action_id) == action


def test_an_id_is_free_again_once_its_action_is_past_its_retention(
    kind: ActionsUnderTest,
) -> None:
    action_id = fresh_id("reuse-")
    kind.create(expires_in=TTL, action_id=action_id)
    kind.clock.advance(TTL + DEFAULT_RETENTION_SECONDS - 1)
    with pytest.raises(ActionExistsError):
        kind.create(expires_in=TTL, action_id=action_id)
    assert kind.get(action_id) is not None
    kind.clock.advance(1)
    assert kind.get(action_id) is None  # forgotten, even if no sweeper removed it yet
    with pytest.raises(ActionNotFoundError):
        kind.consume(action_id)
    renewed = kind.create(expires_in=TTL, action_id=action_id, data="second")
    assert kind.get(action_id) == renewed


def test_get_of_an_unknown_id_is_none(kind: ActionsUnderTest) -> None:
    kind.calls()
    assert kind.get("never-created") is None
    costs(kind, ["GetItem"])


# -- consume ---------------------------------------------------------------------------------


def test_consume_costs_one_write_and_returns_the_consumed_action(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL, data={"order": 7})
    kind.clock.advance(3)
    kind.calls()
    consumed = kind.consume(action.action_id, reason="clicked the link")
    costs(kind, ["UpdateItem"])
    assert consumed.state is ActionState.CONSUMED
    assert consumed.consumed_at == at(kind.clock.now())
    assert consumed.consumed_reason == "clicked the link"
    assert consumed.data == {"order": 7}
    assert (consumed.created_at, consumed.expires_at) == (action.created_at, action.expires_at)
    assert kind.get(action.action_id) == consumed


def test_a_second_consume_raises_already_used_from_the_same_single_write(
    kind: ActionsUnderTest,
) -> None:
    action = kind.create(expires_in=TTL)
    first = kind.consume(action.action_id)
    kind.clock.advance(5)
    kind.calls()
    with pytest.raises(ActionAlreadyUsedError) as raised:
        kind.consume(action.action_id)
    costs(kind, ["UpdateItem"])  # the reason came back with the failed write: no read
    error = raised.value
    assert error.status == 409
    assert error.consumed_at == first.consumed_at
    assert first.consumed_at is not None
    assert error.problem()["consumed_at"] == first.consumed_at.isoformat().replace("+00:00", "Z")
    assert error.action is not None and error.action.state is ActionState.CONSUMED


def test_a_consumed_action_stays_consumed_after_its_expiry(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    kind.consume(action.action_id)
    kind.clock.advance(TTL + 1)
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.CONSUMED
    with pytest.raises(ActionAlreadyUsedError):
        kind.consume(action.action_id)


def test_consume_without_reason_keeps_none(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    assert kind.consume(action.action_id).consumed_reason is None


def test_consume_of_an_unknown_id_raises_not_found_in_one_write(kind: ActionsUnderTest) -> None:
    kind.calls()
    with pytest.raises(ActionNotFoundError) as raised:
        kind.consume("no-such-action")
    costs(kind, ["UpdateItem"])
    assert raised.value.status == 404
    assert kind.get("no-such-action") is None  # the failed update created nothing


def test_a_malformed_id_is_not_found_without_calling_the_store(kind: ActionsUnderTest) -> None:
    kind.calls()
    for malformed in ("", "a/b", "has space", "é", "x" * 256):
        with pytest.raises(ActionNotFoundError):
            kind.consume(malformed)
        with pytest.raises(ActionNotFoundError):
            kind.cancel(malformed)
        assert kind.get(malformed) is None
    costs(kind, [])


# -- activation and expiry, crossed with the clock ----------------------------------------------


def test_a_pending_action_cannot_be_consumed_until_active_at(kind: ActionsUnderTest) -> None:
    active_at = at(kind.clock.now()) + timedelta(seconds=60)
    action = kind.create(expires_in=TTL, active_at=active_at)
    assert action.state is ActionState.PENDING
    assert action.active_at == active_at
    kind.clock.advance(59.999)
    kind.calls()
    with pytest.raises(ActionNotActiveError) as raised:
        kind.consume(action.action_id)
    costs(kind, ["UpdateItem"])
    assert raised.value.status == 409
    assert raised.value.active_at == active_at
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.PENDING
    kind.clock.advance(0.001)
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.ACTIVE
    assert kind.consume(action.action_id).state is ActionState.CONSUMED


def test_active_at_in_another_timezone_or_the_past_is_honoured(kind: ActionsUnderTest) -> None:
    paris = timezone(timedelta(hours=1))
    past = (at(kind.clock.now()) - timedelta(hours=1)).astimezone(paris)
    action = kind.create(expires_in=TTL, active_at=past)
    assert action.state is ActionState.ACTIVE
    assert action.active_at == past and action.active_at.tzinfo is timezone.utc


def test_an_action_expires_at_expires_at(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    kind.clock.advance(TTL - 0.001)
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.ACTIVE
    kind.clock.advance(0.001)
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.EXPIRED
    kind.calls()
    with pytest.raises(ActionExpiredError) as raised:
        kind.consume(action.action_id)
    costs(kind, ["UpdateItem"])
    assert raised.value.status == 410
    assert raised.value.expires_at == action.expires_at


def test_a_pending_action_that_expires_is_expired(kind: ActionsUnderTest) -> None:
    active_at = at(kind.clock.now()) + timedelta(seconds=100)
    action = kind.create(expires_in=200, active_at=active_at)
    kind.clock.advance(200)
    with pytest.raises(ActionExpiredError):
        kind.consume(action.action_id)
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.EXPIRED


# -- cancel ---------------------------------------------------------------------------------


def test_cancel_of_an_active_action_costs_one_write_and_consume_then_raises_canceled(
    kind: ActionsUnderTest,
) -> None:
    action = kind.create(expires_in=TTL)
    kind.clock.advance(1)
    kind.calls()
    canceled = kind.cancel(action.action_id)
    costs(kind, ["UpdateItem"])
    assert canceled.state is ActionState.CANCELED
    assert canceled.canceled_at == at(kind.clock.now())
    kind.clock.advance(1)
    with pytest.raises(ActionCanceledError) as raised:
        kind.consume(action.action_id)
    costs(kind, ["UpdateItem"])
    assert raised.value.status == 410
    assert raised.value.canceled_at == canceled.canceled_at
    assert kind.get(action.action_id) == canceled


def test_cancel_is_idempotent_and_keeps_the_first_cancel_time(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    canceled = kind.cancel(action.action_id)
    kind.clock.advance(10)
    kind.calls()
    assert kind.cancel(action.action_id) == canceled
    costs(kind, ["UpdateItem"])


def test_a_pending_action_can_be_canceled(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL, active_at=at(kind.clock.now()) + timedelta(seconds=30))
    assert kind.cancel(action.action_id).state is ActionState.CANCELED
    kind.clock.advance(31)
    with pytest.raises(ActionCanceledError):
        kind.consume(action.action_id)


def test_a_consumed_action_cannot_be_canceled(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    consumed = kind.consume(action.action_id)
    with pytest.raises(ActionAlreadyUsedError):
        kind.cancel(action.action_id)
    assert kind.get(action.action_id) == consumed


def test_an_expired_action_cannot_be_canceled(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    kind.clock.advance(TTL)
    with pytest.raises(ActionExpiredError):
        kind.cancel(action.action_id)
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.EXPIRED and got.canceled_at is None


def test_cancel_of_an_unknown_id_raises_not_found(kind: ActionsUnderTest) -> None:
    with pytest.raises(ActionNotFoundError):
        kind.cancel("never-created")
    assert kind.get("never-created") is None


# -- PINs -----------------------------------------------------------------------------------


def test_the_right_pin_consumes_in_one_write(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=3)
    assert action.pin_attempts_left == 3
    kind.calls()
    consumed = kind.consume(action.action_id, pin=PIN)
    costs(kind, ["UpdateItem"])
    assert consumed.state is ActionState.CONSUMED
    assert consumed.pin_attempts_left == 3


def test_a_wrong_pin_costs_one_more_write_and_spends_one_attempt(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=3)
    kind.calls()
    with pytest.raises(InvalidPinError) as raised:
        kind.consume(action.action_id, pin="000000")
    costs(kind, ["UpdateItem", "UpdateItem"])
    assert raised.value.status == 403
    assert raised.value.attempts_left == 2
    assert raised.value.problem()["attempts_left"] == 2
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.ACTIVE and got.pin_attempts_left == 2
    assert kind.consume(action.action_id, pin=PIN).state is ActionState.CONSUMED


def test_a_missing_pin_is_refused_without_spending_an_attempt(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=2)
    kind.calls()
    for _ in range(3):
        with pytest.raises(InvalidPinError) as raised:
            kind.consume(action.action_id)
        assert raised.value.attempts_left == 2
    costs(kind, ["UpdateItem"] * 3)
    assert kind.consume(action.action_id, pin=PIN).state is ActionState.CONSUMED


def test_a_pin_given_for_an_action_without_one_is_refused(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL)
    kind.calls()
    with pytest.raises(InvalidPinError) as raised:
        kind.consume(action.action_id, pin=PIN)
    costs(kind, ["UpdateItem"])
    assert raised.value.attempts_left is None
    assert "attempts_left" not in raised.value.problem()
    assert "no PIN" in str(raised.value.problem()["detail"])
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.ACTIVE
    assert kind.consume(action.action_id).state is ActionState.CONSUMED


def test_pin_attempts_run_out_then_the_action_is_locked_even_for_the_right_pin(
    kind: ActionsUnderTest,
) -> None:
    action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=2)
    left = []
    for guess in ("111111", "222222"):
        with pytest.raises(InvalidPinError) as raised:
            kind.consume(action.action_id, pin=guess)
        left.append(raised.value.attempts_left)
    assert left == [1, 0]
    kind.calls()
    guesses: tuple[str | None, ...] = (PIN, "333333", None)
    for late_guess in guesses:
        with pytest.raises(ActionLockedError) as locked:
            kind.consume(action.action_id, pin=late_guess)
        assert locked.value.status == 423
    costs(kind, ["UpdateItem"] * 3)  # a locked action spends nothing more
    got = kind.get(action.action_id)
    assert got is not None and got.state is ActionState.ACTIVE and got.pin_attempts_left == 0
    assert kind.cancel(action.action_id).state is ActionState.CANCELED


def test_state_errors_come_before_pin_errors(kind: ActionsUnderTest) -> None:
    action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=1)
    kind.consume(action.action_id, pin=PIN)
    with pytest.raises(ActionAlreadyUsedError):
        kind.consume(action.action_id, pin="000000")
    got = kind.get(action.action_id)
    assert got is not None and got.pin_attempts_left == 1  # no attempt spent on a used action


def test_the_pin_is_stored_as_a_salted_scrypt_hash_never_in_clear(kind: ActionsUnderTest) -> None:
    first = kind.create(expires_in=TTL, pin=PIN)
    second = kind.create(expires_in=TTL, pin=PIN)
    raw_first, raw_second = kind.raw(first.action_id), kind.raw(second.action_id)
    assert PIN not in raw_first and PIN not in raw_second
    hashes = [
        re.search(r"scrypt\$16384\$8\$1\$[A-Za-z0-9+/=]{44}", raw)
        for raw in (raw_first, raw_second)
    ]
    assert hashes[0] is not None and hashes[1] is not None
    assert hashes[0].group() != hashes[1].group()  # a salt per action
    assert hashes[0].group() == hash_pin(first.action_id, PIN)


def test_a_pin_hashed_at_other_costs_still_consumes(
    kind: ActionsUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An action whose PIN an older (or newer) version hashed with other scrypt costs.
    with monkeypatch.context() as patched:
        patched.setattr(flows, "hash_pin", lambda action_id, pin: hash_pin(action_id, pin, n=1024))
        action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=2)
    assert "scrypt$1024$" in kind.raw(action.action_id)
    with pytest.raises(InvalidPinError) as raised:
        kind.consume(action.action_id, pin="000000")
    assert raised.value.attempts_left == 1
    kind.calls()
    consumed = kind.consume(action.action_id, pin=PIN, reason="old hash")
    costs(kind, ["UpdateItem", "UpdateItem"])
    assert (consumed.state, consumed.consumed_reason) == (ActionState.CONSUMED, "old hash")


# -- a write sent again after its answer was lost ------------------------------------------------


def run_with_retried_writes(kind: ActionsUnderTest, flow: flows.StepFlow[T]) -> T:
    """Run ``flow`` on the kind's backend as a store client that lost the answer of each
    write and sent the same write again (redis-py on a dropped connection, botocore on a 5xx
    or a connection error): every create or consume step reaches the store twice, with the
    same nonce, and the flow sees only the second answer."""
    sync, asynchronous = kind.actions._sync, kind.actions._async

    def write(step: Step) -> Written:
        if kind.loop is None:
            assert sync is not None
            return sync.write(step)
        assert asynchronous is not None
        return kind.run(asynchronous.awrite(step))

    sent: Written | None = None
    while True:
        try:
            step = next(flow) if sent is None else flow.send(sent)
        except StopIteration as done:
            return cast(T, done.value)
        if isinstance(step, Insert | Consume):
            write(step)  # its answer is lost
        sent = write(step)


def create_flow(kind: ActionsUnderTest, **options: Any) -> flows.StepFlow[Action]:
    options = {"active_at": None, "pin": None, "max_pin_attempts": 5, "data": None, **options}
    return flows.create(
        round(kind.clock.now(), 6), DEFAULT_RETENTION_SECONDS, expires_in=TTL, **options
    )


def consume_flow(kind: ActionsUnderTest, action_id: str, **options: Any) -> flows.StepFlow[Action]:
    options = {"pin": None, "reason": None, **options}
    return flows.consume(action_id, round(kind.clock.now(), 6), **options)


def test_a_consume_retried_after_its_answer_was_lost_recognizes_its_own_write(
    kind: ActionsUnderTest,
) -> None:
    action = kind.create(expires_in=TTL, data={"order": 7})
    kind.clock.advance(1)
    kind.calls()
    consumed = run_with_retried_writes(kind, consume_flow(kind, action.action_id, reason="r"))
    costs(kind, ["UpdateItem", "UpdateItem"])  # the write and its retry: no read after
    assert consumed.state is ActionState.CONSUMED
    assert consumed.consumed_at == at(kind.clock.now())
    assert consumed.consumed_reason == "r"
    assert consumed.data == {"order": 7}
    assert kind.get(action.action_id) == consumed
    # Another consume (another nonce) is still refused: the action was used once.
    with pytest.raises(ActionAlreadyUsedError):
        kind.consume(action.action_id)
    with pytest.raises(ActionAlreadyUsedError):
        run_with_retried_writes(kind, consume_flow(kind, action.action_id))
    assert kind.get(action.action_id) == consumed


def test_a_consume_with_a_pin_retried_after_its_answer_was_lost_recognizes_its_own_write(
    kind: ActionsUnderTest,
) -> None:
    action = kind.create(expires_in=TTL, pin=PIN, max_pin_attempts=3)
    consumed = run_with_retried_writes(kind, consume_flow(kind, action.action_id, pin=PIN))
    assert consumed.state is ActionState.CONSUMED
    assert consumed.pin_attempts_left == 3
    assert kind.get(action.action_id) == consumed
    with pytest.raises(ActionAlreadyUsedError):
        kind.consume(action.action_id, pin=PIN)


def test_a_create_retried_after_its_answer_was_lost_recognizes_its_own_write(
    kind: ActionsUnderTest,
) -> None:
    action_id = fresh_id("retried-create-")
    kind.calls()
    created = run_with_retried_writes(kind, create_flow(kind, action_id=action_id, data=[1]))
    costs(kind, ["PutItem", "PutItem"])  # the write and its retry: no read after
    assert created.action_id == action_id
    assert created.state is ActionState.ACTIVE
    assert created.data == [1]
    assert kind.get(action_id) == created
    # Another create of that id (another nonce) still finds it taken, and changes nothing.
    with pytest.raises(ActionExistsError):
        kind.create(expires_in=TTL, action_id=action_id, data=[2])
    with pytest.raises(ActionExistsError):
        run_with_retried_writes(kind, create_flow(kind, action_id=action_id, data=[3]))
    assert kind.get(action_id) == created
    assert kind.consume(action_id).state is ActionState.CONSUMED


def test_a_retried_create_answers_its_action_as_stored_when_it_changed_in_between(
    kind: ActionsUnderTest,
) -> None:
    action_id = fresh_id("retried-create-late-")
    flow = create_flow(kind, action_id=action_id)
    step = next(flow)
    assert isinstance(step, Insert)
    sync, asynchronous = kind.actions._sync, kind.actions._async
    if kind.loop is None:
        assert sync is not None
        sync.write(step)  # its answer is lost
    else:
        assert asynchronous is not None
        kind.run(asynchronous.awrite(step))
    consumed = kind.consume(action_id)  # another caller, before the retry arrives
    if kind.loop is None:
        assert sync is not None
        again = sync.write(step)
    else:
        assert asynchronous is not None
        again = kind.run(asynchronous.awrite(step))
    assert not again.ok
    with pytest.raises(StopIteration) as done:
        flow.send(again)
    assert done.value.value == consumed


def test_an_sqlite_actions_table_of_an_earlier_version_gains_the_nonce_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite3"
    connection = sqlite3.connect(path)
    connection.execute(  # the layout before created_by and consumed_by
        "CREATE TABLE idempotency_records_actions ("
        "action_id TEXT PRIMARY KEY NOT NULL, created_at REAL NOT NULL, "
        "active_at REAL NOT NULL, expires_at REAL NOT NULL, purge_at REAL NOT NULL, "
        "data TEXT NOT NULL, pin_hash TEXT, attempts_left INTEGER, consumed_at REAL, "
        "consumed_reason TEXT, canceled_at REAL)"
    )
    connection.execute(
        "INSERT INTO idempotency_records_actions (action_id, created_at, active_at, "
        "expires_at, purge_at, data) VALUES ('old-one', 1.0, 1.0, 4e9, 5e9, '7')"
    )
    connection.commit()
    connection.close()
    store = SQLiteStore(path)
    try:
        actions = OneTimeActions(store)
        assert actions.consume("old-one").data == 7  # a row written before: no nonces
        action = actions.create(expires_in=TTL)
        assert actions.consume(action.action_id).state is ActionState.CONSUMED
    finally:
        store.close()
    connection = sqlite3.connect(path)
    try:
        columns = [
            row[1] for row in connection.execute("PRAGMA table_info(idempotency_records_actions)")
        ]
    finally:
        connection.close()
    assert columns[-2:] == ["created_by", "consumed_by"]


# -- data, store failures, flavours ----------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        None,
        0,
        "",
        [],
        {},
        False,
        "text",
        3.5,
        [1, "two", None, {"three": [3]}],
        {"nested": {"a": 1}},
    ],
)
def test_data_comes_back_as_the_json_value_given(kind: ActionsUnderTest, data: Any) -> None:
    action = kind.create(expires_in=TTL, data=data)
    got = kind.get(action.action_id)
    assert got is not None and got.data == data and type(got.data) is type(data)
    assert kind.consume(action.action_id).data == data


@pytest.fixture(params=[kind for kind in STORE_KINDS if not kind.startswith("memory")])
def io_kind(request: pytest.FixtureRequest) -> Iterator[ActionsUnderTest]:
    """The kinds whose store does I/O (a MemoryStore cannot fail)."""
    yield from open_actions(request, request.param)


@pytest.fixture(params=DYNAMODB_KINDS)
def dynamodb_kind(request: pytest.FixtureRequest) -> Iterator[ActionsUnderTest]:
    """The kinds whose store has one flavour only."""
    yield from open_actions(request, request.param)


def test_an_unreachable_store_raises_store_unavailable(
    io_kind: ActionsUnderTest, tmp_path: Path
) -> None:
    store = unreachable_store(io_kind.kind, tmp_path)
    actions = OneTimeActions(store)
    is_async = io_kind.loop is not None
    calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
        (actions.acreate if is_async else actions.create, (), {"expires_in": TTL}),
        (actions.aconsume if is_async else actions.consume, ("some-id",), {}),
        (actions.acancel if is_async else actions.cancel, ("some-id",), {}),
        (actions.aget if is_async else actions.get, ("some-id",), {}),
    ]
    try:
        for call, arguments, options in calls:
            with pytest.raises(StoreUnavailableError) as raised:
                result = call(*arguments, **options)
                if is_async:
                    io_kind.run(result)
            assert raised.value.cause in ("unreachable", "cannot_open")
    finally:
        if is_async:
            io_kind.run(store.aclose())
        else:
            store.close()


def test_a_store_with_one_flavour_refuses_the_other_without_calling_it(
    dynamodb_kind: ActionsUnderTest,
) -> None:
    actions = dynamodb_kind.actions
    dynamodb_kind.calls()
    if dynamodb_kind.loop is None:
        refused = [
            actions.acreate(expires_in=TTL),
            actions.aconsume("x"),
            actions.acancel("x"),
            actions.aget("x"),
        ]
        for coroutine in refused:
            with pytest.raises(TypeError, match="DynamoDBStore is a sync store"):
                asyncio.run(coroutine)
    else:
        calls: list[Callable[[], Any]] = [
            lambda: actions.create(expires_in=TTL),
            lambda: actions.consume("x"),
            lambda: actions.cancel("x"),
            lambda: actions.get("x"),
        ]
        for call in calls:
            with pytest.raises(TypeError, match="AsyncDynamoDBStore is an async store"):
                call()
    costs(dynamodb_kind, [])


def test_actions_share_the_store_and_its_table_with_idempotency_records(
    kind: ActionsUnderTest,
) -> None:
    action = kind.create(expires_in=TTL)
    other = OneTimeActions(kind.store)
    got = (
        other.get(action.action_id) if kind.loop is None else kind.run(other.aget(action.action_id))
    )
    assert isinstance(got, Action) and got == action
