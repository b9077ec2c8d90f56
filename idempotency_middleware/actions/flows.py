"""The one-time action operations as flows of store steps (``steps.py``), with no I/O
(the httpx ``auth_flow`` idea): each flow yields the conditional writes it needs, receives
what the store answered, and decides from the record the store returned (the item as it
was when a write's condition failed) why it failed. A store backend only carries out steps.

Store clients send a write again when its answer was lost (redis-py on a dropped connection,
botocore on a 5xx or a connection error), and the retry then finds the first one's effect:
each create and each consume writes a random nonce (``created_by``, ``consumed_by``) in its
own conditional write, and a refused write whose record carries the flow's own nonce was the
flow's own write: it succeeded.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

from .errors import (
    ActionAlreadyUsedError,
    ActionCanceledError,
    ActionExistsError,
    ActionExpiredError,
    ActionLockedError,
    ActionNotActiveError,
    ActionNotFoundError,
    InvalidPinError,
)
from .model import (
    Action,
    ActionRecord,
    check_action_id,
    check_active_at,
    check_expires_in,
    check_max_pin_attempts,
    check_pin,
    check_reason,
    encode_data,
    is_action_id,
    new_action_id,
    new_nonce,
    utc,
)
from .pins import hash_pin, pin_matches, same_costs
from .steps import Cancel, Consume, Insert, Read, SpendAttempt, Step, Written

T = TypeVar("T")

StepFlow = Generator[Step, Written, T]
"""A flow yields steps, receives what each answered, and returns its result."""


# -- the operations -------------------------------------------------------------------------


def create(
    now: float,
    retention_seconds: float,
    *,
    expires_in: object,
    active_at: object,
    pin: object,
    max_pin_attempts: object,
    data: object,
    action_id: object,
) -> StepFlow[Action]:
    """Create an action: one conditional put. Every argument is checked before it."""
    chosen = new_action_id() if action_id is None else check_action_id(action_id)
    seconds = check_expires_in(expires_in)
    activation = check_active_at(active_at)
    checked_pin = check_pin(pin)
    attempts = check_max_pin_attempts(max_pin_attempts)
    encoded = encode_data(data)
    # Whole microseconds, as every store keeps them and datetimes hold them.
    expires_at = round(now + seconds, 6)
    active_from = now if activation is None else round(activation, 6)
    if active_from >= expires_at:
        raise ValueError("active_at must be before the action expires (now + expires_in)")
    record = ActionRecord(
        action_id=chosen,
        created_at=now,
        active_at=active_from,
        expires_at=expires_at,
        purge_at=round(expires_at + retention_seconds, 6),
        data=encoded,
        pin_hash=None if checked_pin is None else hash_pin(chosen, checked_pin),
        attempts_left=None if checked_pin is None else attempts,
        created_by=new_nonce(),
    )
    written = yield Insert(record, now)
    if not written.ok:
        if _created_by_us(written.record, record):
            # Our own put, sent again by the client after its answer was lost.
            return _found(written).to_action(now)
        raise ActionExistsError("an action with this id already exists", action_id=chosen)
    return record.to_action(now)


def consume(action_id: str, now: float, *, pin: object, reason: object) -> StepFlow[Action]:
    """Consume an action: one conditional write; a wrong PIN, one more to spend an attempt."""
    checked_pin, checked_reason = check_pin(pin), check_reason(reason)
    if not is_action_id(action_id):
        raise _not_found(action_id)
    pin_hash = None if checked_pin is None else hash_pin(action_id, checked_pin)
    nonce = new_nonce()
    written = yield Consume(action_id, now, pin_hash, checked_reason, nonce)
    if written.ok or _consumed_by(written.record, nonce):
        # (Refused but consumed with our nonce: our own write, sent again by the client
        # after its answer was lost.)
        return _found(written).to_action(now)
    record = _refuse_closed(action_id, written.record, now)
    if (
        checked_pin is not None
        and record.pin_hash is not None
        and pin_hash is not None
        and not same_costs(record.pin_hash, pin_hash)
        and _has_attempts(record)
        and pin_matches(record.pin_hash, action_id, checked_pin)
    ):
        # The right PIN, hashed at other costs (set by another version): consume again,
        # with the hash as stored.
        written = yield Consume(action_id, now, record.pin_hash, checked_reason, nonce)
        if written.ok or _consumed_by(written.record, nonce):
            return _found(written).to_action(now)
        record = _refuse_closed(action_id, written.record, now)
    _refuse_pin(action_id, record, checked_pin, now)
    spent = yield SpendAttempt(action_id, now)
    if spent.ok:
        left = _found(spent)
        raise InvalidPinError(
            f"wrong PIN (attempts left: {left.attempts_left})",
            action_id=action_id,
            action=left.to_action(now),
            attempts_left=left.attempts_left,
        )
    # Others spent the last attempts, or consumed or canceled it, in between.
    record = _refuse_closed(action_id, spent.record, now)
    raise _locked(action_id, record, now)


def cancel(action_id: str, now: float) -> StepFlow[Action]:
    """Cancel a pending or active action; canceling a canceled one returns it as it is."""
    if not is_action_id(action_id):
        raise _not_found(action_id)
    written = yield Cancel(action_id, now)
    if written.ok:
        return _found(written).to_action(now)
    record = written.record
    if record is not None and record.canceled_at is not None and not record.is_gone(now):
        return record.to_action(now)
    _refuse_closed(action_id, record, now)
    raise AssertionError("a cancel refused on an open action")  # pragma: no cover


def get(action_id: str, now: float) -> StepFlow[Action | None]:
    """The action, or ``None`` (never created, malformed id, or past its retention)."""
    if not is_action_id(action_id):
        return None
    written = yield Read(action_id)
    record = written.record
    if record is None or record.is_gone(now):
        return None
    return record.to_action(now)


# -- deciding why a write failed --------------------------------------------------------------


def _found(written: Written) -> ActionRecord:
    assert written.record is not None, "a write that succeeded returns its record"
    return written.record


def _created_by_us(found: ActionRecord | None, ours: ActionRecord) -> bool:
    """Whether the record a refused put found is the one it put itself."""
    return found is not None and ours.created_by is not None and found.created_by == ours.created_by


def _consumed_by(found: ActionRecord | None, nonce: str) -> bool:
    """Whether the record a refused consume found was consumed by the consume of ``nonce``."""
    return found is not None and found.consumed_at is not None and found.consumed_by == nonce


def _has_attempts(record: ActionRecord) -> bool:
    return record.attempts_left is not None and record.attempts_left > 0


def _not_found(action_id: str) -> ActionNotFoundError:
    return ActionNotFoundError("no action has this id", action_id=action_id)


def _refuse_closed(action_id: str, record: ActionRecord | None, now: float) -> ActionRecord:
    """Raise the error of an action that is absent, canceled, consumed, expired or still
    pending; return it otherwise (its PIN is then the only reason left)."""
    if record is None or record.is_gone(now):
        raise _not_found(action_id)
    action = record.to_action(now)
    if record.canceled_at is not None:
        raise ActionCanceledError(
            f"the action was canceled at {utc(record.canceled_at).isoformat()}",
            action_id=action_id,
            action=action,
            canceled_at=utc(record.canceled_at),
        )
    if record.consumed_at is not None:
        raise ActionAlreadyUsedError(
            f"the action was already consumed at {utc(record.consumed_at).isoformat()}",
            action_id=action_id,
            action=action,
            consumed_at=utc(record.consumed_at),
        )
    if now >= record.expires_at:
        raise ActionExpiredError(
            f"the action expired at {utc(record.expires_at).isoformat()}",
            action_id=action_id,
            action=action,
            expires_at=utc(record.expires_at),
        )
    if now < record.active_at:
        raise ActionNotActiveError(
            f"the action is not active before {utc(record.active_at).isoformat()}",
            action_id=action_id,
            action=action,
            active_at=utc(record.active_at),
        )
    return record


def _locked(action_id: str, record: ActionRecord, now: float) -> ActionLockedError:
    return ActionLockedError(
        "every PIN attempt was used up", action_id=action_id, action=record.to_action(now)
    )


def _refuse_pin(action_id: str, record: ActionRecord, pin: str | None, now: float) -> None:
    """Raise unless the PIN given is a wrong guess that must spend an attempt."""
    if record.pin_hash is None:
        raise InvalidPinError(
            "a PIN was given for an action without one",
            action_id=action_id,
            action=record.to_action(now),
            attempts_left=None,
        )
    if not _has_attempts(record):
        raise _locked(action_id, record, now)
    if pin is None:
        raise InvalidPinError(
            "the action needs its PIN",
            action_id=action_id,
            action=record.to_action(now),
            attempts_left=record.attempts_left,
        )
