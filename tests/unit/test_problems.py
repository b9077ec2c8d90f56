"""Every error response the middleware makes is RFC 9457 problem+json, and echoes nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_middleware.engine import decisions, problems, refusals
from idempotency_middleware.engine.problems import PROBLEM_TYPE_BASE, Problem
from idempotency_middleware.policy.keys import InvalidKey, parse_idempotency_key
from idempotency_middleware.policy.options import Options

PURE = settings(max_examples=200, deadline=None)

ALL_PROBLEMS: list[tuple[Problem, int, int | None]] = [
    (problems.invalid_key("The idempotency key is empty.", "Idempotency-Key"), 400, None),
    (problems.missing_key("Idempotency-Key"), 400, None),
    (problems.body_too_large(1024), 413, None),
    (problems.key_in_progress(1), 409, 1),
    (problems.fingerprint_mismatch(), 422, None),
    (problems.response_not_stored(600_000), 410, None),
    (problems.store_unavailable(2), 503, 2),
    (
        refusals.problem_for(decisions.STORE_UNAVAILABLE),
        503,
        decisions.STORE_UNAVAILABLE_RETRY_AFTER,
    ),
    (refusals.problem_for(decisions.KEY_IN_PROGRESS), 409, decisions.IN_PROGRESS_RETRY_AFTER),
    (refusals.problem_for(decisions.KEY_REUSED), 422, None),
    (refusals.problem_for(decisions.Refusal("not_stored", size=5)), 410, None),
]


def header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key.lower() == name]


@pytest.mark.parametrize(
    ("problem", "status", "retry_after"),
    ALL_PROBLEMS,
    ids=[f"{problem.status}-{problem.slug}" for problem, _, _ in ALL_PROBLEMS],
)
def test_problem_is_rfc_9457_json(problem: Problem, status: int, retry_after: int | None) -> None:
    body = problem.body()
    document = json.loads(body)
    assert set(document) == {"type", "title", "status", "detail"}
    assert document["status"] == problem.status == status
    assert document["type"] == problem.type
    assert document["type"].startswith("urn:") or document["type"].startswith("https://")
    assert isinstance(document["title"], str) and document["title"]
    assert isinstance(document["detail"], str) and document["detail"]


@pytest.mark.parametrize(
    ("problem", "status", "retry_after"),
    ALL_PROBLEMS,
    ids=[f"{problem.status}-{problem.slug}" for problem, _, _ in ALL_PROBLEMS],
)
def test_problem_headers(problem: Problem, status: int, retry_after: int | None) -> None:
    body = problem.body()
    headers = problem.headers(body)
    assert header(headers, b"content-type") == [b"application/problem+json"]
    assert header(headers, b"content-length") == [str(len(body)).encode()]
    expected_retry = [] if retry_after is None else [str(retry_after).encode()]
    assert header(headers, b"retry-after") == expected_retry


def test_problem_types_are_distinct() -> None:
    made_directly = ALL_PROBLEMS[:7]  # the rest are the same problems made from refusals
    types = {problem.type for problem, _, _ in made_directly}
    assert len(types) == len(made_directly)


def test_in_progress_is_not_the_same_answer_as_response_not_stored() -> None:
    # 409 invites a retry; a completed key whose response was too large must not.
    assert problems.response_not_stored(10).status not in (409, 200, 201, 202, 204)


def test_response_not_stored_says_how_large_the_response_was() -> None:
    assert "600000" in json.loads(problems.response_not_stored(600_000).body())["detail"]


SENTINEL = b"Zq7Xw"

invalid_headers: list[list[bytes]] = [
    [SENTINEL + b" value"],
    [SENTINEL + b",other"],
    [b'"' + SENTINEL],
    [SENTINEL + b"\xff"],
    [SENTINEL * 60],
    [SENTINEL, SENTINEL + b"2"],
    [b'"' + SENTINEL + b'" junk'],
    [b'"' + SENTINEL + b'\\x"'],
    [b'"' + SENTINEL + b'";p=1'],
    [b'"' + SENTINEL + b'", "' + SENTINEL + b'"'],
]


@pytest.mark.parametrize("values", invalid_headers)
def test_invalid_key_problem_does_not_echo_the_key(values: list[bytes]) -> None:
    options = Options.build()
    policy = options.policy_for("POST", "/orders")
    assert policy is not None
    answer = decisions.admit(options, policy, "/orders", values)
    assert isinstance(answer, Problem)
    assert answer.status == 400
    body = answer.body()
    assert SENTINEL not in body
    assert all(SENTINEL not in value for _, value in answer.headers(body))


@PURE
@given(st.binary(max_size=40), st.binary(max_size=40))
def test_no_refused_key_is_ever_echoed(prefix: bytes, suffix: bytes) -> None:
    raw = prefix + SENTINEL + suffix
    try:
        parse_idempotency_key([raw])
    except InvalidKey as error:
        problem = problems.invalid_key(error.detail, "Idempotency-Key")
        assert SENTINEL not in problem.body()
        assert SENTINEL.decode() not in error.detail


def test_configured_header_name_appears_in_the_title() -> None:
    problem = problems.missing_key("X-Request-Key")
    assert "X-Request-Key" in problem.title


# --- problem_base_url ---------------------------------------------------------------------

BASE = "https://api.example.com/problems/"


@pytest.mark.parametrize(
    ("problem", "status", "retry_after"),
    ALL_PROBLEMS,
    ids=[f"{problem.status}-{problem.slug}" for problem, _, _ in ALL_PROBLEMS],
)
def test_a_base_url_makes_the_type_a_url_and_links_400_and_422(
    problem: Problem, status: int, retry_after: int | None
) -> None:
    body = problem.body(base_url=BASE)
    headers = problem.headers(body, base_url=BASE)

    assert json.loads(body) == {**json.loads(problem.body()), "type": BASE + problem.slug}
    assert json.loads(body) == problem.document(base_url=BASE)
    expected_link = [b"<" + (BASE + problem.slug).encode() + b'>; rel="describedby"']
    assert header(headers, b"link") == (expected_link if status in (400, 422) else [])
    assert header(headers, b"content-length") == [str(len(body)).encode()]


def test_without_a_base_url_nothing_links() -> None:
    problem = problems.missing_key("Idempotency-Key")
    assert problem.type_for(None) == problem.type == PROBLEM_TYPE_BASE + "missing-key"
    assert header(problem.headers(problem.body()), b"link") == []
