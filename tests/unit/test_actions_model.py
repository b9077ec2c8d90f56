"""The pure parts of one-time actions: what ``create`` accepts, the errors' statuses and
problem documents, PIN hashing, and which stores are supported. No store is involved
beyond a MemoryStore."""

from __future__ import annotations

import math
import pickle
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest

import idempotency_middleware
from idempotency_middleware import (
    Action,
    ActionAlreadyUsedError,
    ActionCanceledError,
    ActionError,
    ActionExistsError,
    ActionExpiredError,
    ActionLockedError,
    ActionNotActiveError,
    ActionNotFoundError,
    ActionState,
    IdempotencyError,
    InvalidPinError,
    MemoryStore,
    OneTimeActions,
)
from idempotency_middleware.actions import backends
from idempotency_middleware.actions.memory import MemoryActions
from idempotency_middleware.actions.model import MAX_DATA_BYTES, MAX_REASON_LENGTH
from idempotency_middleware.actions.pins import hash_pin, pin_matches, pin_salt
from idempotency_middleware.testing import FakeClock

WHEN = datetime(2026, 11, 25, 10, 15, 0, 123456, tzinfo=timezone.utc)
WHEN_TEXT = "2026-11-25T10:15:00.123456Z"


@pytest.fixture
def actions() -> OneTimeActions:
    return OneTimeActions(MemoryStore(clock=FakeClock()))


def test_every_public_name_is_exported() -> None:
    for name in (
        "OneTimeActions",
        "Action",
        "ActionState",
        "ActionError",
        "ActionNotFoundError",
        "ActionAlreadyUsedError",
        "ActionNotActiveError",
        "ActionExpiredError",
        "ActionCanceledError",
        "InvalidPinError",
        "ActionLockedError",
        "ActionExistsError",
    ):
        assert name in idempotency_middleware.__all__
        assert getattr(idempotency_middleware, name).__doc__


def test_states_are_str_enum_values() -> None:
    assert [state.value for state in ActionState] == [
        "pending",
        "active",
        "consumed",
        "expired",
        "canceled",
    ]
    assert orjson.dumps({"state": ActionState.CONSUMED}) == b'{"state":"consumed"}'
    assert isinstance(ActionState.ACTIVE, str)


# -- errors ----------------------------------------------------------------------------------

ERRORS: list[tuple[ActionError, int, str, dict[str, Any]]] = [
    (ActionNotFoundError("m", action_id="a"), 404, "action-not-found", {}),
    (ActionExistsError("m", action_id="a"), 409, "action-exists", {}),
    (
        ActionAlreadyUsedError("m", action_id="a", consumed_at=WHEN),
        409,
        "action-already-used",
        {"consumed_at": WHEN_TEXT},
    ),
    (
        ActionNotActiveError("m", action_id="a", active_at=WHEN),
        409,
        "action-not-active",
        {"active_at": WHEN_TEXT},
    ),
    (
        ActionExpiredError("m", action_id="a", expires_at=WHEN),
        410,
        "action-expired",
        {"expires_at": WHEN_TEXT},
    ),
    (
        ActionCanceledError("m", action_id="a", canceled_at=WHEN),
        410,
        "action-canceled",
        {"canceled_at": WHEN_TEXT},
    ),
    (
        InvalidPinError("m", action_id="a", attempts_left=2),
        403,
        "invalid-pin",
        {"attempts_left": 2},
    ),
    (ActionLockedError("m", action_id="a"), 423, "action-locked", {}),
]


@pytest.mark.parametrize(("error", "status", "slug", "extensions"), ERRORS)
def test_each_error_has_its_status_and_an_rfc9457_problem(
    error: ActionError, status: int, slug: str, extensions: dict[str, Any]
) -> None:
    assert isinstance(error, IdempotencyError)
    assert error.status == status
    problem = error.problem()
    assert problem == {
        "type": f"urn:idempotency-middleware:problem:{slug}",
        "title": type(error).title,
        "status": status,
        "detail": problem["detail"],
        **extensions,
    }
    assert list(problem)[:4] == ["type", "title", "status", "detail"]
    assert str(problem["detail"]).endswith(".")
    orjson.dumps(problem)  # JSON as it is
    based = error.problem(base_url="https://api.example.com/problems/")
    assert based["type"] == f"https://api.example.com/problems/{slug}"


@pytest.mark.parametrize(("error", "status", "slug", "extensions"), ERRORS)
def test_errors_survive_pickling_with_their_fields(
    error: ActionError, status: int, slug: str, extensions: dict[str, Any]
) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)
    assert copy.problem() == error.problem()


def test_an_invalid_pin_for_an_action_without_one_says_so_and_has_no_attempts() -> None:
    problem = InvalidPinError("m", action_id="a", attempts_left=None).problem()
    assert "attempts_left" not in problem
    assert "has no PIN" in str(problem["detail"])


def test_error_messages_never_carry_the_action_id(actions: OneTimeActions) -> None:
    secret = "magic-link-secret-id"
    actions.create(expires_in=60, action_id=secret, pin="1234", max_pin_attempts=1)
    failures: list[ActionError] = []
    calls: list[Callable[[], object]] = [
        lambda: actions.create(expires_in=60, action_id=secret),
        lambda: actions.consume(secret, pin="0000"),
        lambda: actions.consume(secret, pin="1234"),
        lambda: actions.consume("missing-secret-id"),
    ]
    for call in calls:
        with pytest.raises(ActionError) as raised:
            call()
        failures.append(raised.value)
    assert [type(failure) for failure in failures] == [
        ActionExistsError,
        InvalidPinError,
        ActionLockedError,
        ActionNotFoundError,
    ]
    for failure in failures:
        assert "secret" not in str(failure) and "secret" not in repr(failure.problem())


# -- what create accepts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"expires_in": "60"}, TypeError, "expires_in"),
        ({"expires_in": True}, TypeError, "expires_in"),
        ({"expires_in": 0}, ValueError, "expires_in"),
        ({"expires_in": -1}, ValueError, "expires_in"),
        ({"expires_in": math.inf}, ValueError, "expires_in"),
        ({"expires_in": math.nan}, ValueError, "expires_in"),
        ({"expires_in": 60, "active_at": "2026-01-01"}, TypeError, "active_at"),
        ({"expires_in": 60, "active_at": datetime(2026, 1, 1)}, ValueError, "timezone-aware"),
        ({"expires_in": 60, "active_at": "later"}, TypeError, "active_at"),
        ({"expires_in": 60, "pin": 1234}, TypeError, "pin"),
        ({"expires_in": 60, "pin": ""}, ValueError, "pin"),
        ({"expires_in": 60, "pin": "1" * 257}, ValueError, "pin"),
        ({"expires_in": 60, "max_pin_attempts": 0}, ValueError, "max_pin_attempts"),
        ({"expires_in": 60, "max_pin_attempts": 2.0}, TypeError, "max_pin_attempts"),
        ({"expires_in": 60, "max_pin_attempts": True}, TypeError, "max_pin_attempts"),
        ({"expires_in": 60, "data": {1, 2}}, TypeError, "data must be a JSON value"),
        ({"expires_in": 60, "data": "x" * MAX_DATA_BYTES}, ValueError, "data must be at most"),
        ({"expires_in": 60, "action_id": 7}, TypeError, "action_id"),
        ({"expires_in": 60, "action_id": ""}, ValueError, "action_id"),
        ({"expires_in": 60, "action_id": "a/b"}, ValueError, "action_id"),
        ({"expires_in": 60, "action_id": "x" * 256}, ValueError, "action_id"),
    ],
)
def test_create_checks_its_arguments_before_writing(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    store = MemoryStore()
    actions = OneTimeActions(store)
    with pytest.raises(error, match=message):
        actions.create(**options)
    assert len(MemoryActions(store)) == 0


def test_active_at_at_or_after_the_expiry_is_refused(actions: OneTimeActions) -> None:
    now = datetime.fromtimestamp(FakeClock().now(), tz=timezone.utc)
    with pytest.raises(ValueError, match="active_at must be before"):
        actions.create(expires_in=60, active_at=now + timedelta(seconds=60))
    actions.create(expires_in=60, active_at=now + timedelta(seconds=59))


def test_the_longest_id_and_data_are_accepted(actions: OneTimeActions) -> None:
    action = actions.create(expires_in=60, action_id="x" * 255, data="x" * (MAX_DATA_BYTES - 2))
    assert len(action.data) == MAX_DATA_BYTES - 2


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"reason": "r" * (MAX_REASON_LENGTH + 1)}, ValueError),
        ({"reason": 5}, TypeError),
        ({"pin": 1234}, TypeError),
    ],
)
def test_consume_checks_its_arguments_before_writing(
    actions: OneTimeActions, options: dict[str, Any], error: type[Exception]
) -> None:
    action = actions.create(expires_in=60)
    with pytest.raises(error):
        actions.consume(action.action_id, **options)
    assert actions.get(action.action_id) == action
    assert actions.consume(action.action_id, reason="r" * MAX_REASON_LENGTH).consumed_reason


@pytest.mark.parametrize("retention", [-1, math.inf, "7d", True])
def test_retention_must_be_a_non_negative_finite_number(retention: Any) -> None:
    with pytest.raises(ValueError, match="retention_seconds"):
        OneTimeActions(MemoryStore(), retention_seconds=retention)


def test_with_no_retention_an_action_is_forgotten_at_its_expiry() -> None:
    clock = FakeClock()
    actions = OneTimeActions(MemoryStore(clock=clock), retention_seconds=0)
    action = actions.create(expires_in=60)
    clock.advance(60)
    assert actions.get(action.action_id) is None


def test_forgotten_actions_are_dropped_from_memory_on_a_later_create() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    actions = OneTimeActions(store, retention_seconds=10)
    for _ in range(3):
        actions.create(expires_in=60)
    assert len(MemoryActions(store)) == 3
    clock.advance(70)
    actions.create(expires_in=60)
    assert len(MemoryActions(store)) == 1


# -- stores ----------------------------------------------------------------------------------


class NotAStore:
    pass


def test_an_unsupported_store_is_a_type_error_naming_the_supported_ones() -> None:
    with pytest.raises(TypeError) as raised:
        OneTimeActions(NotAStore())
    message = str(raised.value)
    supported = ("MemoryStore", "SQLiteStore", "DynamoDBStore", "AsyncDynamoDBStore")
    for name in (*supported, "RedisStore", "PostgresStore", "NotAStore"):
        assert name in message


def test_a_backend_offers_the_flavours_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    # A store with only an async backend (as a future one may be) gets no sync flavour.
    class AsyncOnly:
        def __init__(self, store: object) -> None:
            pass

        async def awrite(self, step: object) -> object:
            raise AssertionError

    import types

    module = types.ModuleType("fake")
    module.AsyncOnly = AsyncOnly  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, f"{backends.__package__}.fake", module)
    monkeypatch.setattr(backends, "_BACKENDS", ((NotAStore, "fake", "AsyncOnly"),))
    sync, asynchronous = backends.backend_for(NotAStore())
    assert sync is None and isinstance(asynchronous, AsyncOnly)


def test_one_time_actions_repr_names_the_store() -> None:
    assert repr(OneTimeActions(MemoryStore())) == "OneTimeActions(MemoryStore)"


# -- PINs and the action's JSON ------------------------------------------------------------------


def test_pin_hashes_are_salted_per_action_and_verify_in_constant_time() -> None:
    first, second = hash_pin("action-1", "1234"), hash_pin("action-2", "1234")
    assert first != second and pin_salt("action-1") != pin_salt("action-2")
    assert first.startswith("scrypt$16384$8$1$") and "1234" not in first
    assert pin_matches(first, "action-1", "1234")
    assert not pin_matches(first, "action-1", "1235")
    assert not pin_matches(first, "action-2", "1234")


@pytest.mark.parametrize(
    "stored", ["", "scrypt$x$8$1$abc", "argon2$1$2$3$abc", "scrypt$16384$8$abc", "plain"]
)
def test_a_stored_hash_that_cannot_be_read_matches_no_pin(stored: str) -> None:
    assert not pin_matches(stored, "action-1", "1234")


def test_an_action_as_json() -> None:
    action = Action(
        action_id="a",
        state=ActionState.CONSUMED,
        created_at=WHEN,
        active_at=WHEN,
        expires_at=WHEN + timedelta(seconds=60),
        consumed_at=WHEN.astimezone(timezone(timedelta(hours=2))),
        consumed_reason="why",
        canceled_at=None,
        pin_attempts_left=3,
        data={"k": [1]},
    )
    assert action.to_dict() == {
        "action_id": "a",
        "state": "consumed",
        "created_at": WHEN_TEXT,
        "active_at": WHEN_TEXT,
        "expires_at": "2026-11-25T10:16:00.123456Z",
        "consumed_at": WHEN_TEXT,
        "consumed_reason": "why",
        "canceled_at": None,
        "pin_attempts_left": 3,
        "data": {"k": [1]},
    }


async def test_async_methods_hash_pins_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotency_middleware.actions import flows

    threads: list[str] = []

    def recording_hash(action_id: str, pin: str) -> str:
        threads.append(threading.current_thread().name)
        return hash_pin(action_id, pin)

    monkeypatch.setattr(flows, "hash_pin", recording_hash)
    actions = OneTimeActions(MemoryStore())
    action = await actions.acreate(expires_in=60, pin="1234")
    with pytest.raises(InvalidPinError):
        await actions.aconsume(action.action_id, pin="0000")
    assert (await actions.aconsume(action.action_id, pin="1234")).state is ActionState.CONSUMED
    assert len(threads) == 3
    assert threading.current_thread().name not in threads


def test_generated_ids_never_start_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # A command line would take "-abc" for an option.
    drawn = iter(["-first", "_second"])
    monkeypatch.setattr("secrets.token_urlsafe", lambda size: next(drawn))
    assert OneTimeActions(MemoryStore()).create(expires_in=60).action_id == "_second"


# -- the consume flow, step by step --------------------------------------------------------------


def test_a_consume_retried_under_the_stored_hash_reports_what_beat_it() -> None:
    # The right PIN under other scrypt costs: the flow consumes again with the stored hash;
    # when another consumer got there in between, it says so.
    from idempotency_middleware.actions import flows, steps
    from idempotency_middleware.actions.model import ActionRecord

    old_hash = hash_pin("a1", "1234", n=1024)
    record = ActionRecord("a1", 100.0, 100.0, 700.0, 1000.0, pin_hash=old_hash, attempts_left=3)
    flow = flows.consume("a1", 200.0, pin="1234", reason=None)
    first = next(flow)
    assert isinstance(first, steps.Consume) and first.pin_hash != old_hash
    second = flow.send(steps.Written(False, record))
    assert second == steps.Consume("a1", 200.0, old_hash, None, first.nonce)  # one nonce
    with pytest.raises(ActionAlreadyUsedError):
        flow.send(steps.Written(False, record.consumed(150.0, "other")))
