"""``core``: the pure decisions both adapters drive, one step at a time."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from idempotency_middleware import (
    HeaderView,
    IdempotencyRule,
    RequestView,
)
from idempotency_middleware.engine import decisions, refusals
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.engine.problems import Problem
from idempotency_middleware.policy.options import DEFAULT_STORED_STATUSES, Options
from idempotency_middleware.stores.records import Record, Status, StoredResponse

NOW = 1_700_000_000.5


def admit(
    options: Options, method: str, path: str, key_lines: list[bytes]
) -> decisions.Admitted | Problem | None:
    """What an adapter does: uncovered requests pass; covered ones go to ``decisions.admit``."""
    policy = options.policy_for(method, path)
    return None if policy is None else decisions.admit(options, policy, path, key_lines)


def admitted(options: Options, path: str = "/orders", key: bytes = b"k-1") -> decisions.Admitted:
    answer = admit(options, "POST", path, [key])
    assert isinstance(answer, decisions.Admitted)
    return answer


def view_for(path: str, *headers: tuple[str, str]) -> Callable[[str], RequestView]:
    return lambda route: RequestView("POST", path, route, "", HeaderView(headers))


def attempt_for(
    options: Options,
    path: str = "/orders",
    *,
    key: bytes = b"k-1",
    body: bytes = b'{"a": 1}',
    query: bytes = b"",
    headers: tuple[tuple[str, str], ...] = (),
) -> decisions.Attempt:
    return decisions.begin_attempt(
        admitted(options, path, key),
        method="POST",
        path=path,
        query_string=query,
        content_type="application/json",
        body=body,
        request_view=view_for(path, *headers),
        now=NOW,
        owner=new_owner(),
    )


# --- admit ------------------------------------------------------------------------------


def test_uncovered_method_passes_through_even_with_a_bad_key() -> None:
    assert admit(Options.build(), "GET", "/orders", [b"bad key"]) is None


def test_covered_request_without_a_key_passes_through() -> None:
    assert admit(Options.build(), "POST", "/orders", []) is None


def test_covered_request_without_a_required_key_is_400() -> None:
    answer = admit(Options.build(required=True), "POST", "/orders", [])
    assert isinstance(answer, Problem)
    assert answer.status == 400
    assert answer.slug == "missing-key"


def test_required_on_a_rule_only_applies_to_its_routes() -> None:
    options = Options.build(rules=[IdempotencyRule("/payments", required=True)])
    assert isinstance(admit(options, "POST", "/payments", []), Problem)
    assert admit(options, "POST", "/orders", []) is None


@pytest.mark.parametrize(
    "values", [[b""], [b"a b"], [b"a", b"b"], [b"a, b"], [b'"a'], [b"k" * 256]]
)
def test_invalid_key_is_400(values: list[bytes]) -> None:
    answer = admit(Options.build(), "POST", "/orders", values)
    assert isinstance(answer, Problem)
    assert answer.status == 400
    assert answer.slug == "invalid-key"


def test_invalid_key_on_a_disabled_route_passes_through() -> None:
    options = Options.build(rules=[IdempotencyRule("/health", enabled=False)])
    assert admit(options, "POST", "/health", [b"bad key"]) is None


def test_valid_key_is_admitted_with_its_policy() -> None:
    options = Options.build(rules=[IdempotencyRule("/orders/{order_id}", ttl_seconds=5)])
    answer = admit(options, "POST", "/orders/9", [b'"k-\\"1"'])
    assert isinstance(answer, decisions.Admitted)
    assert answer.key == 'k-"1'
    assert answer.policy.route == "/orders/{order_id}"
    assert answer.policy.ttl_seconds == 5


# --- check_declared_length --------------------------------------------------------------


def test_no_declared_length_is_fine() -> None:
    assert decisions.check_declared_length(Options.build(max_body_bytes=10), None) is None


def test_declared_length_at_the_limit_is_fine() -> None:
    assert decisions.check_declared_length(Options.build(max_body_bytes=10), "10") is None
    assert decisions.check_declared_length(Options.build(max_body_bytes=10), "0") is None


def test_declared_length_over_the_limit_is_413() -> None:
    answer = decisions.check_declared_length(Options.build(max_body_bytes=10), "11")
    assert isinstance(answer, Problem)
    assert answer.status == 413


def test_malformed_declared_length_is_left_to_the_server() -> None:
    assert decisions.check_declared_length(Options.build(max_body_bytes=10), "ten") is None


# --- begin_attempt ---------------------------------------------------------------------


def test_claim_carries_the_policy_lock_timeout_and_now() -> None:
    claim = attempt_for(Options.build(lock_timeout_seconds=7.5)).claim
    assert claim.now == NOW
    assert claim.lock_timeout_seconds == 7.5
    assert claim.lock_expires_at == NOW + 7.5


def test_each_claim_gets_a_fresh_owner_token() -> None:
    options = Options.build()
    owners = {attempt_for(options).claim.owner for _ in range(50)}
    assert len(owners) == 50
    assert all(len(owner) >= 16 for owner in owners)


def test_same_key_on_two_routes_is_two_keys() -> None:
    options = Options.build()
    assert (
        attempt_for(options, "/orders").claim.key_hash
        != attempt_for(options, "/payments").claim.key_hash
    )


def test_same_key_on_one_template_is_one_key_with_two_fingerprints() -> None:
    options = Options.build(rules=[IdempotencyRule("/orders/{order_id}/refunds")])
    first = attempt_for(options, "/orders/1/refunds").claim
    second = attempt_for(options, "/orders/2/refunds").claim
    assert first.key_hash == second.key_hash
    assert first.fingerprint != second.fingerprint


def test_different_client_keys_are_different_keys() -> None:
    options = Options.build()
    assert (
        attempt_for(options, key=b"a").claim.key_hash
        != attempt_for(options, key=b"b").claim.key_hash
    )


def test_storage_key_does_not_contain_the_client_key() -> None:
    claim = attempt_for(Options.build(), key=b"my-very-own-key").claim
    assert "my-very-own-key" not in claim.key_hash


def tenant_scope(request: RequestView) -> str:
    return request.headers.get("x-tenant", "")


def test_scope_namespaces_the_key() -> None:
    options = Options.build(scope=tenant_scope)
    acme = attempt_for(options, headers=(("X-Tenant", "acme"),)).claim
    globex = attempt_for(options, headers=(("X-Tenant", "globex"),)).claim
    assert acme.key_hash != globex.key_hash
    assert acme.fingerprint == globex.fingerprint
    assert acme.key_hash == attempt_for(options, headers=(("x-tenant", "acme"),)).claim.key_hash


def test_rule_scope_replaces_the_middleware_scope() -> None:
    options = Options.build(
        scope=tenant_scope,
        rules=[IdempotencyRule("/public", scope=lambda request: "everyone")],
    )
    acme = attempt_for(options, "/public", headers=(("X-Tenant", "acme"),)).claim
    globex = attempt_for(options, "/public", headers=(("X-Tenant", "globex"),)).claim
    assert acme.key_hash == globex.key_hash


def test_request_view_is_only_built_when_a_scope_needs_it() -> None:
    def no_view(route: str) -> RequestView:
        raise AssertionError("the request view was built without a scope")

    attempt = decisions.begin_attempt(
        admitted(Options.build()),
        method="POST",
        path="/orders",
        query_string=b"",
        content_type=None,
        body=b"",
        request_view=no_view,
        now=NOW,
        owner=new_owner(),
    )
    assert attempt.claim.key_hash


def test_fingerprint_covers_query_and_body() -> None:
    options = Options.build()
    base = attempt_for(options).claim
    assert base.fingerprint != attempt_for(options, body=b'{"a": 2}').claim.fingerprint
    assert base.fingerprint != attempt_for(options, query=b"x=1").claim.fingerprint
    assert base.fingerprint == attempt_for(options, body=b'{ "a" : 1 }').claim.fingerprint


# --- answer_held ------------------------------------------------------------------------


RESPONSE = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')


def held(
    status: Status,
    *,
    fingerprint: str = "fp",
    response: StoredResponse | None = None,
    too_large: bool = False,
    size: int = 0,
) -> Record:
    return Record(
        key_hash="k",
        status=status,
        fingerprint=fingerprint,
        owner="other",
        lock_expires_at=NOW + 60,
        expires_at=NOW + 3600,
        response=response,
        response_not_stored=too_large,
        response_size=size,
    )


@pytest.mark.parametrize(
    "record",
    [held(Status.IN_PROGRESS), held(Status.COMPLETED, response=RESPONSE)],
    ids=["in-progress", "completed"],
)
def test_different_fingerprint_is_422(record: Record) -> None:
    answer = decisions.answer_held(record, "another-fp")
    assert isinstance(answer, decisions.Refusal)
    assert answer.reason == "reused" and answer.status == 422


def test_different_fingerprint_on_a_too_large_response_is_422() -> None:
    record = held(Status.COMPLETED, too_large=True, size=10)
    answer = decisions.answer_held(record, "another-fp")
    assert isinstance(answer, decisions.Refusal)
    assert answer.reason == "reused" and answer.status == 422


def test_same_fingerprint_in_progress_is_409_with_retry_after() -> None:
    answer = decisions.answer_held(held(Status.IN_PROGRESS), "fp")
    assert isinstance(answer, decisions.Refusal)
    assert answer.reason == "in_progress" and answer.status == 409
    assert answer.retry_after is not None and answer.retry_after > 0
    problem = refusals.problem_for(answer)
    assert problem.status == 409
    assert (b"retry-after", str(answer.retry_after).encode()) in problem.headers(problem.body())


def test_same_fingerprint_completed_is_replayed() -> None:
    assert decisions.answer_held(held(Status.COMPLETED, response=RESPONSE), "fp") == RESPONSE


def test_completed_without_a_kept_response_is_410() -> None:
    record = held(Status.COMPLETED, too_large=True, size=600_000)
    answer = decisions.answer_held(record, "fp")
    assert isinstance(answer, decisions.Refusal)
    assert answer.reason == "not_stored" and answer.size == 600_000
    problem = refusals.problem_for(answer)
    assert problem.status == 410 and problem.retry_after is None
    assert "600000" in problem.detail


# --- the statuses kept by default, and completion_for ------------------------------------


@pytest.mark.parametrize("status", [200, 201, 204, 301, 400, 404, 409, 422, 499])
def test_responses_below_500_are_kept(status: int) -> None:
    assert status in DEFAULT_STORED_STATUSES


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_5xx_responses_are_not_kept(status: int) -> None:
    assert status not in DEFAULT_STORED_STATUSES


def test_completion_keeps_end_to_end_headers_only() -> None:
    attempt = attempt_for(Options.build(ttl_seconds=100))
    completion = decisions.completion_for(
        attempt,
        201,
        [
            (b"content-type", b"application/json"),
            (b"set-cookie", b"session=1"),
            (b"content-length", b"9"),
            (b"connection", b"close"),
        ],
        b'{"id": 1}',
        NOW + 1,
    )
    assert completion.key_hash == attempt.claim.key_hash
    assert completion.owner == attempt.claim.owner
    assert completion.expires_at == NOW + 101
    # Content-Length stays in place (header order); its value is recomputed on replay.
    assert completion.response == StoredResponse(
        201, [(b"content-type", b"application/json"), (b"content-length", b"9")], b'{"id": 1}'
    )


def test_attempt_carries_method_policy_and_key_hash() -> None:
    options = Options.build(rules=[IdempotencyRule("/orders/{order_id}", ttl_seconds=9)])
    attempt = attempt_for(options, "/orders/3")
    assert attempt.method == "POST"
    assert attempt.policy.route == "/orders/{order_id}"
    assert attempt.policy.ttl_seconds == 9
    assert attempt.key_hash == attempt.claim.key_hash


def test_streamed_completion_keeps_only_its_size() -> None:
    attempt = attempt_for(Options.build())
    completion = decisions.completion_for(
        attempt, 200, [(b"content-type", b"text/event-stream")], b"", NOW, streamed_size=1234
    )
    assert completion.streamed
    assert completion.body_size == 1234


def test_claim_is_renewed_several_times_per_lock_timeout() -> None:
    policy = admitted(Options.build(lock_timeout_seconds=30)).policy
    assert 0 < policy.renewal_interval <= 30 / 2


def test_finish_backoff_is_full_jitter_under_a_doubling_cap() -> None:
    for attempt_number in range(1, decisions.FINISH_ATTEMPTS + 1):
        cap = 0.05 * 2 ** (attempt_number - 1)
        delays = [decisions.finish_delay(attempt_number, random.random()) for _ in range(200)]
        assert all(0 <= delay <= cap for delay in delays)
        assert len(set(delays)) > 100  # jittered, not a fixed delay
        assert max(delays) > cap / 2


def test_finish_backoff_is_short_enough_to_answer_the_client() -> None:
    # The worst case of every retry's cap: the client waits at most this long for its answer.
    worst = sum(0.05 * 2 ** (number - 1) for number in range(1, decisions.FINISH_ATTEMPTS))
    assert worst < 2.0
