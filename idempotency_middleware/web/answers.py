"""One path from an attempt's ending to the HTTP answer, for the ASGI, WSGI and Django doors.

The engine ends an attempt with a stored response to replay, a refusal, the handler's own
response, a request to run without a claim, or nothing (``engine.flow.Ending``). ``answer``
turns each into one call of the door's ``Responder``: the answers the middleware makes
itself (replays, problems) reach the door as a ``Reply`` already made, so a door keeps only
how it sends bytes (ASGI messages, a WSGI iterable, a Django ``HttpResponse``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypeVar

from ..engine.effects import Ran
from ..engine.flow import RUN_UNPROTECTED, Ending
from ..engine.problems import Problem
from ..engine.refusals import Refusal, problem_for
from ..stores.records import Headers, StoredResponse

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Reply(NamedTuple):
    """An answer the middleware makes itself, ready to send: a replay or a problem."""

    status: int
    headers: Headers
    body: bytes


def problem_reply(problem: Problem, base_url: str | None = None) -> Reply:
    """``problem`` as ``application/problem+json``; ``base_url``: the ``problem_base_url``
    option."""
    body = problem.body(base_url=base_url)
    return Reply(problem.status, problem.headers(body, base_url=base_url), body)


def replay_reply(stored: StoredResponse) -> Reply:
    """A stored response sent again, marked as a replay (``Idempotent-Replayed: true``)."""
    return Reply(stored.status, stored.replay_headers(), stored.body)


class Responder(Protocol[T_co]):
    """How one door sends each kind of answer; ``T_co`` is what sending is in that door (an
    awaitable for ASGI, the WSGI iterable, Django's response)."""

    def reply(self, reply: Reply) -> T_co:
        """Send an answer the middleware made (a replay, a problem)."""
        ...

    def ran(self, ran: Ran) -> T_co:
        """Send the handler's response, as the door captured it (nothing more when it went
        out live)."""
        ...

    def unprotected(self) -> T_co:
        """Run the handler with no claim (the store failed and ``on_store_error="run"``),
        its answer sent as it comes."""
        ...

    def nothing(self) -> T_co:
        """The handler answered nothing."""
        ...


def answer(ending: Ending, responder: Responder[T], base_url: str | None = None) -> T:
    """Answer an attempt's ``ending`` through the door's ``responder``; ``base_url`` is the
    ``problem_base_url`` option (for a refusal's problem)."""
    # (The handler's own response first: the usual ending of a new key.)
    if type(ending) is Ran:
        return responder.ran(ending)
    if type(ending) is StoredResponse:
        return responder.reply(replay_reply(ending))
    if type(ending) is Refusal:
        return responder.reply(problem_reply(problem_for(ending), base_url))
    if ending is RUN_UNPROTECTED:
        return responder.unprotected()
    return responder.nothing()


__all__ = ["Reply", "Responder", "answer", "problem_reply", "replay_reply"]
