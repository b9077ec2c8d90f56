"""Starting a Step Functions execution for the current request, so that the work runs once
even when the process that starts it dies.

``start_execution`` (``astart_execution`` with an async client) defers the request
(``defer_completion()``), puts the deferral token in the execution's input under
``idempotency_token``, and names the execution from the key: ``<key hash>-<n>``, ``n``
from 0. Step Functions refuses a second execution of a name it has seen, so:

- a ``StartExecution`` sent again (the SDK's retry after a lost answer) starts nothing:
  same name, same input, the running execution is answered;
- a retry that took the key over from a process that died after starting the execution,
  before its 202 was stored, finds that execution running under the name and adopts it:
  its response is stored for the running execution's token (``hand_deferral_to``), which
  then finishes the key, and no second execution starts;
- an execution of the name that ended (its work failed and released the key, or the key
  expired since) moves the name on to the next number: a new try of the work.

The calls are written once, as a generator of ``(operation, parameters)`` that a sync and
an async driver send (``stores.kit.drive`` / ``adrive``); a client's error is thrown back
in at its ``yield``.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from typing import Any, NamedTuple

from ..errors import IdempotencyError
from ..handler.context import current_attempt
from ..handler.deferred import DeferredToken, defer_completion, hand_deferral_to, parse_token
from ..stores.kit import adrive, drive

__all__ = [
    "MAX_EXECUTIONS",
    "TOKEN_FIELD",
    "ExecutionConflictError",
    "StartedExecution",
    "astart_execution",
    "execution_arn",
    "execution_name",
    "start_execution",
]

TOKEN_FIELD = "idempotency_token"
"""Where an execution's input carries its deferral token."""

MAX_EXECUTIONS = 100
"""Executions named from one key, ended ones included, before ``start_execution`` gives up
(Step Functions keeps an ended execution's name for 90 days)."""

_ALREADY_EXISTS = "ExecutionAlreadyExists"

Call = tuple[str, dict[str, Any]]


class StartedExecution(NamedTuple):
    """The execution that does the request's work: its ARN and name, the deferral token it
    finishes the key with (in its input), and whether it was ``adopted``: started by an
    earlier attempt on the key whose process died, and still running."""

    execution_arn: str
    name: str
    token: str
    adopted: bool


class ExecutionConflictError(IdempotencyError):
    """An execution named from this key is running other work (another input, a deferral
    of the key's earlier, expired life), or too many named from it have ended: none is
    started. Nothing was stored; the request ends as its handler makes it end."""


def execution_name(key_hash: str, number: int) -> str:
    """The name of the ``number``-th execution started for the key ``key_hash`` (64 hex
    characters): within Step Functions' 80 characters, and the same from any process."""
    return f"{key_hash}-{number}"


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN of ``state_machine_arn``'s execution ``name`` (a version's or an alias's
    executions are the state machine's); ``ValueError`` for an ARN of something else."""
    parts = state_machine_arn.split(":")
    if len(parts) < 7 or parts[0] != "arn" or parts[2] != "states" or parts[5] != "stateMachine":
        raise ValueError(f"not a Step Functions state machine ARN: {state_machine_arn!r}")
    return ":".join([*parts[:5], "execution", parts[6], name])


def start_execution(
    client: Any, state_machine_arn: str, input: Mapping[str, Any]
) -> StartedExecution:
    """Start the execution of ``state_machine_arn`` that does the current request's work,
    from its handler; ``client`` is a boto3 Step Functions client.

    Defers the request as ``defer_completion()`` does: the handler's response (typically a
    202) becomes the key's interim one, and the execution finishes the key with the token
    it finds in its input under ``"idempotency_token"``, beside the ``input`` given (a JSON
    object). The execution is named from the key, so that however the request is retried,
    one execution does its work: a retry after the process that started it died adopts it
    (``adopted``) instead of starting another. A name whose execution ended moves on to the
    next one (``-1``, ``-2`` ...): a new try of work that failed.

    Raises ``LookupError`` outside a covered request's handler (as ``defer_completion``),
    ``TypeError`` for an input that is not a JSON object, ``ValueError`` for one that
    carries ``"idempotency_token"`` already or a ``state_machine_arn`` that is not one,
    :class:`ExecutionConflictError` when an execution named from the key runs other work,
    and what the client raises for any other failure (the request then fails, and its key
    is released as for any exception).
    """
    flow = _starting(state_machine_arn, input)
    result: StartedExecution = drive(flow, lambda call: getattr(client, call[0])(**call[1]))
    return result


async def astart_execution(
    client: Any,
    state_machine_arn: str,
    input: Mapping[str, Any],
) -> StartedExecution:
    """:func:`start_execution` with an async client (aioboto3's), from an async handler."""
    flow = _starting(state_machine_arn, input)
    result: StartedExecution = await adrive(flow, lambda call: getattr(client, call[0])(**call[1]))
    return result


def _starting(
    state_machine_arn: str, input: Mapping[str, Any]
) -> Generator[Call, Any, StartedExecution]:
    """The calls that start (or adopt) the request's execution."""
    work = _work(input)
    execution_arn(state_machine_arn, "")  # (checked before anything is deferred)
    token = defer_completion()
    own = parse_token(token)
    claimed_at = current_attempt("start_execution()").claim.now
    payload = json.dumps({**work, TOKEN_FIELD: token}, separators=(",", ":"), ensure_ascii=False)
    for number in range(MAX_EXECUTIONS):
        name = execution_name(own.key_hash, number)
        start = {"stateMachineArn": state_machine_arn, "name": name, "input": payload}
        try:
            started = yield ("start_execution", start)
        except Exception as error:
            if _error_code(error) != _ALREADY_EXISTS:
                raise
        else:
            return StartedExecution(str(started["executionArn"]), name, token, adopted=False)
        arn = execution_arn(state_machine_arn, name)
        described = yield ("describe_execution", {"executionArn": arn})
        theirs, their_token, their_work = _deferral_in(described.get("input"))
        if theirs is not None and theirs.owner == own.owner:
            # Started by this very request, whose handler calls again (it may have ended).
            if their_work != work:
                raise ExecutionConflictError(
                    f"this request started execution {name} already, with another input"
                )
            return StartedExecution(arn, name, token, adopted=False)
        if described.get("status") != "RUNNING":
            continue  # an earlier try that ended
        if theirs is None or theirs.key_hash != own.key_hash or their_work != work:
            raise ExecutionConflictError(
                f"execution {name} is running with another input than this request's"
            )
        if theirs.expires_at <= claimed_at:
            raise ExecutionConflictError(
                f"execution {name} is still running the work of this key's earlier, "
                "expired deferral"
            )
        hand_deferral_to(their_token)
        return StartedExecution(arn, name, their_token, adopted=True)
    raise ExecutionConflictError(
        f"{MAX_EXECUTIONS} executions named from this key have ended; none is started"
    )


def _work(input: Mapping[str, Any]) -> dict[str, Any]:
    """``input`` as the execution will read it (a JSON object), without a token."""
    if not isinstance(input, Mapping):
        raise TypeError(f"the execution's input must be a mapping, got {type(input).__name__}")
    if TOKEN_FIELD in input:
        raise ValueError(f"the execution's input must not carry {TOKEN_FIELD!r}: it is added")
    try:
        work: dict[str, Any] = json.loads(json.dumps(dict(input)))
    except (TypeError, ValueError) as error:
        raise TypeError(f"the execution's input is not JSON: {error}") from None
    return work


def _deferral_in(
    text: object,
) -> tuple[DeferredToken | None, str, dict[str, Any] | None]:
    """The deferral token in an execution's input (parsed, and as written) and the rest of
    the input; ``None`` and ``""`` where it has none."""
    document = json.loads(text) if isinstance(text, str) else None  # (always JSON)
    if not isinstance(document, dict):
        return None, "", None
    token = document.pop(TOKEN_FIELD, None)
    try:
        return parse_token(token), str(token), document
    except ValueError:
        return None, "", document


def _error_code(error: BaseException) -> object:
    """The AWS error code of a botocore ``ClientError`` (read without importing botocore)."""
    response = getattr(error, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None
