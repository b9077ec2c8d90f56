"""The end of a Step Functions execution that did not finish its deferred key: the body of
a Lambda function behind an EventBridge rule on "Step Functions Execution Status Change".

A workflow that fails inside its states can release its key itself (the example state
machine's ``Catch``); one that times out or is aborted runs none of its states again, and
one that fails outside a ``Catch`` neither. Their status change event carries the
execution's input, and in it the deferral token: releasing the key with it (or completing
the key with a failure response) lets a retry run again (or answers it) instead of
replaying the 202 until the key expires. The token fences it: a key taken over, released,
completed or expired since is left alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from ..handler.deferred import parse_token
from ..stores.protocol import SyncDeferrals
from .executions import TOKEN_FIELD

__all__ = [
    "EVENT_SOURCE",
    "STATUS_CHANGE",
    "UNFINISHED",
    "StatusChangeOutcome",
    "handle_execution_status_change",
]

EVENT_SOURCE = "aws.states"
STATUS_CHANGE = "Step Functions Execution Status Change"
UNFINISHED = frozenset({"FAILED", "TIMED_OUT", "ABORTED"})
"""The statuses of an execution that ended without finishing its key."""

StatusChangeOutcome = Literal["released", "completed", "ignored", "stale"]


def handle_execution_status_change(
    event: Mapping[str, Any],
    *,
    store: SyncDeferrals,
    failure: tuple[int, Any, bytes] | None = None,
    stepfunctions: Any = None,
) -> StatusChangeOutcome:
    """Finish the deferred key of an execution that ended ``FAILED``, ``TIMED_OUT`` or
    ``ABORTED``: ``event`` is the "Step Functions Execution Status Change" event as
    EventBridge delivers it to a Lambda function, ``store`` the sync store the key is in.

    The key is released (``"released"``: a retry runs the handler again, and starts a new
    execution), or, with ``failure=(status, headers, body)`` (headers as ``(bytes, bytes)``
    pairs), completed with that response (``"completed"``: retries get it). Fenced by the
    token's owner: a key that its token no longer applies to (released, completed, taken
    over, expired), and so a repeated event, is left as it is (``"stale"``). Another status,
    or an input without ``"idempotency_token"``, is ``"ignored"``.

    ``stepfunctions``, a boto3 Step Functions client, reads the input of an execution whose
    event leaves it out (over EventBridge's size limit). Raises ``ValueError`` for an event
    of another kind, a malformed token, or an input left out without ``stepfunctions``;
    ``TypeError`` for a store without deferral operations or a malformed ``failure``.
    """
    if not isinstance(store, SyncDeferrals):
        raise TypeError(
            "store must be a sync store with release_deferred and complete_deferred, got "
            f"{type(store).__name__}"
        )
    if failure is not None and not (isinstance(failure, tuple) and len(failure) == 3):
        raise TypeError("failure must be a (status, headers, body) tuple")
    detail = _detail(event)
    if detail.get("status") not in UNFINISHED:
        return "ignored"
    token = _token_in(_input_of(detail, stepfunctions))
    if token is None:
        return "ignored"
    if failure is None:
        return "released" if store.release_deferred(token) else "stale"
    status, headers, body = failure
    return "completed" if store.complete_deferred(token, status, headers, body) else "stale"


def _detail(event: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(event, Mapping) or (
        event.get("source"),
        event.get("detail-type"),
    ) != (EVENT_SOURCE, STATUS_CHANGE):
        raise ValueError(f"not a {STATUS_CHANGE!r} event from {EVENT_SOURCE!r}")
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        raise ValueError(f"the {STATUS_CHANGE!r} event has no detail")
    return detail


def _input_of(detail: Mapping[str, Any], stepfunctions: Any) -> object:
    """The execution's input as the event has it, or as the execution has it when the event
    left it out."""
    if (detail.get("inputDetails") or {}).get("included", True) is not False:
        return detail.get("input")
    if stepfunctions is None:
        raise ValueError(
            "the event leaves out the execution's input (too large for an event): pass "
            "stepfunctions=, a Step Functions client, to read it"
        )
    described = stepfunctions.describe_execution(executionArn=detail["executionArn"])
    return described.get("input")


def _token_in(text: object) -> str | None:
    """The input's deferral token (checked: ``ValueError`` when malformed), if it has one."""
    if not isinstance(text, str):
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None  # (Step Functions inputs are JSON: not one of this package's executions)
    if not isinstance(document, dict) or TOKEN_FIELD not in document:
        return None
    token = document[TOKEN_FIELD]
    parse_token(token)
    return str(token)
