"""What a one-time action is: as callers see it (:class:`Action`) and as stores keep it
(:class:`ActionRecord`), with the checks on what callers pass. Pure.

Times are epoch seconds inside (the stores compare them in their conditions) and aware UTC
datetimes outside. An action's state is never stored: it follows from its times, so an
action expires or becomes active by the clock alone, with no write.
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import orjson

# How long a finished action (consumed, canceled or expired) is still answered for, after
# its expiry: a second click on a used magic link says "already used", not "not found".
DEFAULT_RETENTION_SECONDS = 7 * 86400.0

MAX_ACTION_ID_LENGTH = 255
MAX_PIN_LENGTH = 256
MAX_REASON_LENGTH = 1024
MAX_DATA_BYTES = 64 * 1024

# Random ids carry 192 bits (32 URL-safe characters); the minimum for a bearer secret is 128.
ACTION_ID_BYTES = 24

# Caller-chosen ids are RFC 3986 unreserved characters: safe in a URL path, a header, a log
# line and a DynamoDB key without escaping. Generated ids use a subset of them.
_ACTION_ID = re.compile(rf"[A-Za-z0-9._~-]{{1,{MAX_ACTION_ID_LENGTH}}}")


class ActionState(str, Enum):
    """Where an action is in its life. ``pending`` before its ``active_at``, then
    ``active`` until it is ``consumed``, ``canceled``, or ``expired`` at ``expires_at``."""

    PENDING = "pending"
    ACTIVE = "active"
    CONSUMED = "consumed"
    EXPIRED = "expired"
    CANCELED = "canceled"


@dataclass(frozen=True)
class Action:
    """A one-time action as it stood when it was read or written.

    Times are timezone-aware UTC datetimes. ``pin_attempts_left`` is ``None`` for an action
    without a PIN. ``data`` is the caller's JSON value, as given to ``create``.
    """

    action_id: str
    state: ActionState
    created_at: datetime
    active_at: datetime
    expires_at: datetime
    consumed_at: datetime | None
    consumed_reason: str | None
    canceled_at: datetime | None
    pin_attempts_left: int | None
    data: Any

    def to_dict(self) -> dict[str, Any]:
        """The action as a JSON object: times in ISO 8601 UTC (``...Z``), the state's value."""
        return {
            "action_id": self.action_id,
            "state": self.state.value,
            "created_at": iso(self.created_at),
            "active_at": iso(self.active_at),
            "expires_at": iso(self.expires_at),
            "consumed_at": iso(self.consumed_at),
            "consumed_reason": self.consumed_reason,
            "canceled_at": iso(self.canceled_at),
            "pin_attempts_left": self.pin_attempts_left,
            "data": self.data,
        }


def iso(moment: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 UTC to the microsecond, ``Z``-suffixed."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def utc(epoch_seconds: float) -> datetime:
    """Epoch seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc)


def _utc_or_none(epoch_seconds: float | None) -> datetime | None:
    return None if epoch_seconds is None else utc(epoch_seconds)


@dataclass(frozen=True)
class ActionRecord:
    """An action as a store keeps it. ``data`` is JSON text; ``pin_hash`` the PIN's
    salted scrypt hash (:func:`hash_pin`), never the PIN. ``purge_at`` is when the store
    may forget it (its expiry plus the retention). ``created_by`` and ``consumed_by`` are
    the random nonces of the create and the consume that wrote them (``None``: not yet, or
    written by an earlier version): a step the store client retried after its answer was
    lost finds its own nonce and knows the write was its own."""

    action_id: str
    created_at: float
    active_at: float
    expires_at: float
    purge_at: float
    data: str = "null"
    pin_hash: str | None = None
    attempts_left: int | None = None
    consumed_at: float | None = None
    consumed_reason: str | None = None
    canceled_at: float | None = None
    created_by: str | None = None
    consumed_by: str | None = None

    def state(self, now: float) -> ActionState:
        # Consumed and canceled are final and outlive the expiry: a used link keeps saying
        # it was used.
        if self.canceled_at is not None:
            return ActionState.CANCELED
        if self.consumed_at is not None:
            return ActionState.CONSUMED
        if now >= self.expires_at:
            return ActionState.EXPIRED
        if now < self.active_at:
            return ActionState.PENDING
        return ActionState.ACTIVE

    def is_gone(self, now: float) -> bool:
        """Past its retention: answered as absent, even before a sweeper removes it."""
        return now >= self.purge_at

    def is_open(self, now: float) -> bool:
        """Neither consumed, canceled nor expired (pending or active)."""
        return self.consumed_at is None and self.canceled_at is None and now < self.expires_at

    def consumed(self, now: float, reason: str | None, nonce: str | None = None) -> ActionRecord:
        return replace(self, consumed_at=now, consumed_reason=reason, consumed_by=nonce)

    def canceled(self, now: float) -> ActionRecord:
        return replace(self, canceled_at=now)

    def with_attempt_spent(self) -> ActionRecord:
        assert self.attempts_left is not None
        return replace(self, attempts_left=self.attempts_left - 1)

    def to_action(self, now: float) -> Action:
        return Action(
            action_id=self.action_id,
            state=self.state(now),
            created_at=utc(self.created_at),
            active_at=utc(self.active_at),
            expires_at=utc(self.expires_at),
            consumed_at=_utc_or_none(self.consumed_at),
            consumed_reason=self.consumed_reason,
            canceled_at=_utc_or_none(self.canceled_at),
            pin_attempts_left=self.attempts_left,
            data=orjson.loads(self.data),
        )


# The record's fields in order: the column names of the SQL backends' tables, and the order
# of their rows.
RECORD_FIELDS = tuple(field.name for field in fields(ActionRecord))
# Fields added after the first table layout: a table that lacks them gains them.
ADDED_FIELDS = ("created_by", "consumed_by")


# -- what callers pass ----------------------------------------------------------------------


# A create's or a consume's nonce: 64 random bits, as 16 hex characters.
NONCE_BYTES = 8


def new_nonce() -> str:
    """A random nonce marking one create or consume (``created_by``, ``consumed_by``)."""
    return secrets.token_hex(NONCE_BYTES)


def new_action_id() -> str:
    """A random, URL-safe id of :data:`ACTION_ID_BYTES` bytes, never starting with ``-``
    (which a command line would take for an option; that drops under 0.03 bits)."""
    while True:
        action_id = secrets.token_urlsafe(ACTION_ID_BYTES)
        if not action_id.startswith("-"):
            return action_id


def is_action_id(value: object) -> bool:
    """Whether ``value`` can be an action's id (a malformed one is never found)."""
    return isinstance(value, str) and _ACTION_ID.fullmatch(value) is not None


def check_action_id(value: object) -> str:
    """A caller-chosen id, checked: ``TypeError`` or ``ValueError`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"action_id must be a str, got {type(value).__name__}")
    if not is_action_id(value):
        raise ValueError(
            f"action_id must be 1 to {MAX_ACTION_ID_LENGTH} letters, digits or '._~-' characters"
        )
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_expires_in(value: object) -> float:
    """``expires_in`` as seconds: a positive, finite number."""
    if not _is_number(value):
        raise TypeError(f"expires_in must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)  # type: ignore[arg-type]
    if not 0 < seconds < math.inf:
        raise ValueError(f"expires_in must be a positive, finite number of seconds, got {value!r}")
    return seconds


def check_active_at(value: object) -> float | None:
    """``active_at`` (an aware datetime, or ``None``) as epoch seconds."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"active_at must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("active_at must be timezone-aware (datetime.now(timezone.utc), say)")
    return value.timestamp()


def check_pin(value: object) -> str | None:
    """A PIN: ``None`` or a string of 1 to :data:`MAX_PIN_LENGTH` characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"pin must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_PIN_LENGTH:
        raise ValueError(f"pin must be 1 to {MAX_PIN_LENGTH} characters")
    return value


def check_max_pin_attempts(value: object) -> int:
    """``max_pin_attempts``: an int, at least 1."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_pin_attempts must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"max_pin_attempts must be at least 1, got {value}")
    return value


def check_reason(value: object) -> str | None:
    """A consume's reason: ``None`` or at most :data:`MAX_REASON_LENGTH` characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"reason must be a str, got {type(value).__name__}")
    if len(value) > MAX_REASON_LENGTH:
        raise ValueError(f"reason must be at most {MAX_REASON_LENGTH} characters")
    return value


def encode_data(value: object) -> str:
    """``data`` as JSON text; ``TypeError`` naming it when it is not JSON, ``ValueError``
    when it is over :data:`MAX_DATA_BYTES`."""
    try:
        encoded = orjson.dumps(value)
    except TypeError as error:
        raise TypeError(f"data must be a JSON value: {error}") from error
    if len(encoded) > MAX_DATA_BYTES:
        raise ValueError(f"data must be at most {MAX_DATA_BYTES} bytes of JSON")
    return encoded.decode()
