"""``web.answers``: the one path from an attempt's ending to an HTTP door's answer.

Each ending reaches exactly one method of the door's ``Responder``; the answers the
middleware makes itself (replays, problems) arrive as a ``Reply`` ready to send.
"""

from __future__ import annotations

import orjson

from idempotency_middleware.engine import decisions, problems
from idempotency_middleware.engine.effects import Ran
from idempotency_middleware.engine.flow import RUN_UNPROTECTED, Ending
from idempotency_middleware.stores.records import StoredResponse
from idempotency_middleware.web.answers import Reply, answer, problem_reply, replay_reply

BASE_URL = "https://example.com/problems/"
CREATED = Ran(201, [(b"content-type", b"application/json")], b'{"id": 1}')
STORED = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')


class Recorder:
    """A door that records which answer it was asked to send."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def reply(self, reply: Reply) -> str:
        self.calls.append(("reply", reply))
        return "replied"

    def ran(self, ran: Ran) -> str:
        self.calls.append(("ran", ran))
        return "sent the captured response"

    def unprotected(self) -> str:
        self.calls.append(("unprotected", None))
        return "ran unprotected"

    def nothing(self) -> str:
        self.calls.append(("nothing", None))
        return "sent nothing"


def answered(ending: Ending, base_url: str | None = None) -> tuple[str, list[tuple[str, object]]]:
    door = Recorder()
    return answer(ending, door, base_url), door.calls


def test_the_handlers_own_response_goes_to_the_door_as_captured() -> None:
    assert answered(CREATED) == ("sent the captured response", [("ran", CREATED)])


def test_a_stored_response_is_replied_as_a_replay() -> None:
    sent, calls = answered(STORED)
    assert sent == "replied"
    [(method, reply)] = calls
    assert method == "reply"
    assert reply == Reply(201, STORED.replay_headers(), STORED.body)
    assert (b"idempotent-replayed", b"true") in reply.headers


def test_a_refusal_is_replied_as_its_problem() -> None:
    _, [(method, reply)] = answered(decisions.KEY_IN_PROGRESS)
    assert method == "reply"
    assert isinstance(reply, Reply)
    assert reply.status == 409
    assert (b"content-type", b"application/problem+json") in reply.headers
    assert (b"retry-after", b"1") in reply.headers
    assert orjson.loads(reply.body)["type"] == problems.PROBLEM_TYPE_BASE + "key-in-progress"


def test_a_refusals_problem_points_at_the_base_url() -> None:
    _, [(_, reply)] = answered(decisions.KEY_REUSED, BASE_URL)
    assert isinstance(reply, Reply)
    assert reply.status == 422
    assert orjson.loads(reply.body)["type"] == BASE_URL + "key-reused"
    assert (b"link", f'<{BASE_URL}key-reused>; rel="describedby"'.encode()) in reply.headers


def test_a_failed_store_with_on_store_error_run_runs_the_handler_unprotected() -> None:
    assert answered(RUN_UNPROTECTED) == ("ran unprotected", [("unprotected", None)])


def test_a_handler_that_answered_nothing_is_told_to_the_door() -> None:
    assert answered(None) == ("sent nothing", [("nothing", None)])


def test_a_problem_reply_carries_the_problems_body_and_its_length() -> None:
    problem = problems.body_too_large(10)
    reply = problem_reply(problem)
    assert reply.status == 413
    assert reply.body == problem.body()
    assert (b"content-length", str(len(reply.body)).encode()) in reply.headers
    assert (b"cache-control", b"no-store") in reply.headers


def test_a_replay_reply_gives_the_stored_body_its_own_length() -> None:
    stored = StoredResponse(200, [(b"content-length", b"999")], b"abc")
    reply = replay_reply(stored)
    assert reply.body == b"abc"
    assert (b"content-length", b"3") in reply.headers
    assert (b"content-length", b"999") not in reply.headers
