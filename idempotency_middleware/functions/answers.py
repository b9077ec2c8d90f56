"""How a callable door's attempt becomes its answer: the one ladder over the engine's endings.

``engine.flow.attempt`` ends in ``Ran`` (the call ran under its claim), a ``StoredResponse``
(a completed call's result, to give back), a ``Refusal`` (it does not run), or
``RUN_UNPROTECTED`` (the store failed on the claim and ``on_store_error="run"``). Every door
that wraps a callable turns that into an ``Answer`` here: ``Returned`` (a result, from this
run or given back) or ``Refused`` (why not, and the exception that says it). Each door then
keeps only its wording: the function door returns the result or raises the error; the
consumer door words either as a verdict for its broker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..engine import flow, refusals
from ..engine.decisions import Attempt
from ..engine.effects import Ran
from ..engine.refusals import Refusal, RefusalReason
from ..errors import StoredResultUnreadableError
from ..stores.records import StoredResponse
from .attempts import FunctionAttempts


@dataclass(frozen=True)
class Returned:
    """The call's result: ``replayed`` when a completed call's is given back (else it ran
    now, under its claim or unprotected)."""

    value: Any
    replayed: bool = False


@dataclass(frozen=True)
class Refused:
    """The call did not run and there is no result to give: ``reason`` (the engine's, or
    ``"unreadable"`` for a stored result that does not decode), the exception the function
    door raises for it, and the engine's ``refusal`` (``None`` for that undecodable result)."""

    reason: RefusalReason
    error: Exception
    refusal: Refusal | None = None


Answer = Returned | Refused


def answer(attempts: FunctionAttempts, attempt: Attempt | None, call: Callable[[], Any]) -> Answer:
    """Run ``call`` under ``attempt`` (``None``: a call without a key that may run
    unprotected) and say how it ended. What ``call`` raises propagates, its key released."""
    if attempt is None:
        return Returned(attempts.unprotected(call))
    ending, result = attempts.drive(attempt, call)
    if ending is flow.RUN_UNPROTECTED:
        return Returned(attempts.unprotected(call))
    return settle(attempts, attempt, ending, result)


async def aanswer(
    attempts: FunctionAttempts, attempt: Attempt | None, call: Callable[[], Awaitable[Any]]
) -> Answer:
    """``answer`` for a coroutine function."""
    if attempt is None:
        return Returned(await attempts.aunprotected(call))
    ending, result = await attempts.adrive(attempt, call)
    if ending is flow.RUN_UNPROTECTED:
        return Returned(await attempts.aunprotected(call))
    return settle(attempts, attempt, ending, result)


def settle(
    attempts: FunctionAttempts, attempt: Attempt, ending: flow.Ending, result: Any
) -> Answer:
    """The answer an attempt's ``ending`` gives; ``result`` is what the call returned, when
    it ran (``Ran``)."""
    if type(ending) is Ran:
        return Returned(result)
    if type(ending) is StoredResponse:
        try:
            return Returned(attempts.replayed(attempt, ending), replayed=True)
        except StoredResultUnreadableError as unreadable:
            return Refused("unreadable", unreadable)  # it will not run again under this key
    # (No ``None`` ending: that is an HTTP door's response that went out as it ran.)
    assert type(ending) is Refusal, ending
    return Refused(ending.reason, refusals.error_for(ending, attempts.name), ending)


__all__ = ["Answer", "Refused", "Returned", "aanswer", "answer", "settle"]
