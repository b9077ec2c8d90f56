"""One-time actions: a side effect that can happen exactly once (a magic link, a coupon, a
ticket, an approval, a licence activation), with expiry, activation time, cancellation and
an optional PIN with limited attempts.

    actions = OneTimeActions(store)
    action = actions.create(expires_in=900, data={"user": 42})
    actions.consume(action.action_id)      # the consumed Action, once; then ActionAlreadyUsedError

Layout: ``model.py`` (what an action is), ``pins.py`` (PIN hashing), ``errors.py`` (why
one is refused), ``steps.py`` (the conditional writes a store carries out, and what they
mean), ``flows.py`` (the operations as steps, and why a step failed; no I/O),
``service.py`` (``OneTimeActions``), ``backends.py`` (which backend serves which store), one
module per backend (``memory.py``, ``sqlite.py``, ``dynamodb.py``, ``redis.py``,
``postgres.py``) and ``cli.py`` (the
command line's ``action`` commands).
"""

from __future__ import annotations

from .errors import (
    ActionAlreadyUsedError,
    ActionCanceledError,
    ActionError,
    ActionExistsError,
    ActionExpiredError,
    ActionLockedError,
    ActionNotActiveError,
    ActionNotFoundError,
    InvalidPinError,
)
from .model import Action, ActionState
from .service import OneTimeActions

__all__ = [
    "Action",
    "ActionAlreadyUsedError",
    "ActionCanceledError",
    "ActionError",
    "ActionExistsError",
    "ActionExpiredError",
    "ActionLockedError",
    "ActionNotActiveError",
    "ActionNotFoundError",
    "ActionState",
    "InvalidPinError",
    "OneTimeActions",
]
