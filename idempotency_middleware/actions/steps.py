"""The store steps of one-time actions, and what each one means.

A step is one conditional write (or one read) on one action. :func:`apply` is the meaning
of every step's condition and effect, written once: MemoryStore and SQLiteStore evaluate it
under their lock; the DynamoDB backend states the same conditions as
``ConditionExpression``s. A step answers :class:`Written`: the record after a write that
happened, or the record as it was when the condition failed (``ALL_OLD``), from which the
flows decide why (or, finding their own nonce in it, that the write was theirs: a step
the store client sent again after losing its answer).
"""

from __future__ import annotations

from typing import NamedTuple

from .model import ActionRecord


class Insert(NamedTuple):
    """Put ``record`` when its id is free (absent, or past the old action's retention);
    ``record.created_by`` is the create's nonce."""

    record: ActionRecord
    now: float

    @property
    def action_id(self) -> str:
        return self.record.action_id


class Consume(NamedTuple):
    """Consume an open, active action whose PIN hash is ``pin_hash`` (``None``: an action
    without a PIN) with attempts left, marking it ``consumed_by`` the consume's ``nonce``."""

    action_id: str
    now: float
    pin_hash: str | None
    reason: str | None
    nonce: str | None = None


class SpendAttempt(NamedTuple):
    """Take one PIN attempt from an open action that has attempts left."""

    action_id: str
    now: float


class Cancel(NamedTuple):
    """Cancel an open action (pending or active)."""

    action_id: str
    now: float


class Read(NamedTuple):
    """Read the action (a strongly consistent read)."""

    action_id: str


Step = Insert | Consume | SpendAttempt | Cancel | Read


class Written(NamedTuple):
    """A step's answer: ``ok`` and the record after the write, or not ``ok`` and the record
    as the failed condition found it (``None``: absent). A read is always ``ok``."""

    ok: bool
    record: ActionRecord | None


def apply(step: Step, before: ActionRecord | None) -> Written:
    """What ``step`` does to ``before``: every step's condition and effect."""
    if isinstance(step, Read):
        return Written(True, before)
    if isinstance(step, Insert):
        if before is None or before.is_gone(step.now):
            return Written(True, step.record)
        return Written(False, before)
    if before is None or not before.is_open(step.now):
        return Written(False, before)
    if isinstance(step, Cancel):
        return Written(True, before.canceled(step.now))
    if isinstance(step, SpendAttempt):
        if before.attempts_left is not None and before.attempts_left > 0:
            return Written(True, before.with_attempt_spent())
        return Written(False, before)
    if before.active_at > step.now:
        return Written(False, before)
    if step.pin_hash is None:
        pin_ok = before.pin_hash is None
    else:
        pin_ok = (
            before.pin_hash == step.pin_hash
            and before.attempts_left is not None
            and before.attempts_left > 0
        )
    if not pin_ok:
        return Written(False, before)
    return Written(True, before.consumed(step.now, step.reason, step.nonce))
