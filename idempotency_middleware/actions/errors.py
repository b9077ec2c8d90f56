"""Why a one-time action was refused: one exception per reason, each with its HTTP status
and its RFC 9457 problem (``error.problem()``), so an API answers with
``JSONResponse(error.problem(), status_code=error.status,
media_type="application/problem+json")``.

Messages and problems never carry the action's id: an id is often a bearer secret (a magic
link), and error messages end up in logs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from ..engine.problems import Problem
from ..errors import IdempotencyError
from .model import Action, iso


class ActionError(IdempotencyError):
    """Base of the one-time action errors. ``status`` is the HTTP status to answer with,
    ``action_id`` the id asked for, ``action`` the action as the refused write found it
    (``None`` when there is none)."""

    status: ClassVar[int] = 400
    slug: ClassVar[str] = "action-error"
    title: ClassVar[str] = "The action was refused"
    detail: ClassVar[str] = "The action was refused."

    def __init__(self, message: str, *, action_id: str, action: Action | None = None) -> None:
        super().__init__(message)
        self.action_id = action_id
        self.action = action

    def extensions(self) -> tuple[tuple[str, str | int], ...]:
        """RFC 9457 extension members of this problem, after the standard ones."""
        return ()

    def problem_detail(self) -> str:
        """The problem's ``detail``: a fixed sentence (nothing the client sent)."""
        return self.detail

    def problem(self, *, base_url: str | None = None) -> dict[str, str | int]:
        """The RFC 9457 problem document: ``type`` (a URN, or ``base_url + slug``),
        ``title``, ``status``, ``detail`` and this error's extension members."""
        return Problem(
            self.status, self.slug, self.title, self.problem_detail(), extensions=self.extensions()
        ).document(base_url=base_url)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments: the default pickling would call cls(message) and fail.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[ActionError], args: tuple[Any, ...], state: dict[str, Any]) -> ActionError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


def _when(name: str, moment: datetime | None) -> tuple[tuple[str, str | int], ...]:
    text = iso(moment)
    return () if text is None else ((name, text),)


class ActionNotFoundError(ActionError):
    """No action has this id (never created, malformed, or forgotten after its retention)."""

    status = 404
    slug = "action-not-found"
    title = "Action not found"
    detail = "No action has this id: it does not exist, or it ended long enough ago to be removed."


class ActionExistsError(ActionError):
    """``create`` with an ``action_id`` that another action already has."""

    status = 409
    slug = "action-exists"
    title = "Action already exists"
    detail = "An action with this id already exists. Choose another id, or omit it."


class ActionAlreadyUsedError(ActionError):
    """The action was consumed already, at ``consumed_at``: by another caller, or by an
    earlier try of this one."""

    status = 409
    slug = "action-already-used"
    title = "Action already used"
    detail = "This action was already consumed; it can be consumed only once."

    def __init__(
        self, message: str, *, action_id: str, action: Action | None = None, consumed_at: datetime
    ) -> None:
        super().__init__(message, action_id=action_id, action=action)
        self.consumed_at = consumed_at

    def extensions(self) -> tuple[tuple[str, str | int], ...]:
        return _when("consumed_at", self.consumed_at)


class ActionNotActiveError(ActionError):
    """The action is pending: it cannot be consumed before ``active_at``."""

    status = 409
    slug = "action-not-active"
    title = "Action not active yet"
    detail = "This action cannot be consumed before the time given in active_at."

    def __init__(
        self, message: str, *, action_id: str, action: Action | None = None, active_at: datetime
    ) -> None:
        super().__init__(message, action_id=action_id, action=action)
        self.active_at = active_at

    def extensions(self) -> tuple[tuple[str, str | int], ...]:
        return _when("active_at", self.active_at)


class ActionExpiredError(ActionError):
    """The action expired at ``expires_at`` without being consumed."""

    status = 410
    slug = "action-expired"
    title = "Action expired"
    detail = "This action expired before it was consumed."

    def __init__(
        self, message: str, *, action_id: str, action: Action | None = None, expires_at: datetime
    ) -> None:
        super().__init__(message, action_id=action_id, action=action)
        self.expires_at = expires_at

    def extensions(self) -> tuple[tuple[str, str | int], ...]:
        return _when("expires_at", self.expires_at)


class ActionCanceledError(ActionError):
    """The action was canceled at ``canceled_at``."""

    status = 410
    slug = "action-canceled"
    title = "Action canceled"
    detail = "This action was canceled; it can no longer be consumed."

    def __init__(
        self, message: str, *, action_id: str, action: Action | None = None, canceled_at: datetime
    ) -> None:
        super().__init__(message, action_id=action_id, action=action)
        self.canceled_at = canceled_at

    def extensions(self) -> tuple[tuple[str, str | int], ...]:
        return _when("canceled_at", self.canceled_at)


class InvalidPinError(ActionError):
    """The PIN was wrong (one attempt spent), missing for an action that has one (no
    attempt spent), or given for an action that has none. ``attempts_left`` is what
    remains (``None`` for an action without a PIN); at 0 the action is locked."""

    status = 403
    slug = "invalid-pin"
    title = "Invalid PIN"
    detail = "The PIN is wrong or missing; attempts_left says how many tries remain."
    unexpected_detail = "This action has no PIN, but a PIN was given: nothing was consumed."

    def __init__(
        self,
        message: str,
        *,
        action_id: str,
        action: Action | None = None,
        attempts_left: int | None,
    ) -> None:
        super().__init__(message, action_id=action_id, action=action)
        self.attempts_left = attempts_left

    def extensions(self) -> tuple[tuple[str, str | int], ...]:
        if self.attempts_left is None:
            return ()
        return (("attempts_left", self.attempts_left),)

    def problem_detail(self) -> str:
        return self.detail if self.attempts_left is not None else self.unexpected_detail


class ActionLockedError(ActionError):
    """Every PIN attempt was used up: the action can no longer be consumed (it can still be
    canceled, and it expires as usual)."""

    status = 423
    slug = "action-locked"
    title = "Action locked"
    detail = "Too many wrong PINs were tried: this action can no longer be consumed."


__all__ = [
    "ActionAlreadyUsedError",
    "ActionCanceledError",
    "ActionError",
    "ActionExistsError",
    "ActionExpiredError",
    "ActionLockedError",
    "ActionNotActiveError",
    "ActionNotFoundError",
    "InvalidPinError",
]
