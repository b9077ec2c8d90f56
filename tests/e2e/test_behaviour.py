"""End-to-end behaviour (the README's HTTP semantics), written once and run on every combination.

Each test runs against real servers on 127.0.0.1 (uvicorn + FastAPI, waitress + Flask)
through a real HTTP client, with the memory store, DynamoDB (moto's server mode), Redis and
PostgreSQL (real servers); this module's ``harness`` fixture supplies the combination.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyRule,
    scope_by_tenant_header,
)
from idempotency_middleware.policy.keys import QUOTE_IT
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult, Completion
from idempotency_middleware.stores.records import Record
from idempotency_middleware.testing import FakeClock
from tests.conftest import open_harness
from tests.support.apps import (
    FLASK_ERRORHANDLER_BODY,
    GET_ORDERS,
    PATCH_ORDERS,
    POST_BIG,
    POST_BLOCK,
    POST_BOOM,
    POST_FAIL,
    POST_ORDERS,
    POST_PAYMENTS,
    POST_SLOW,
    POST_STATUS,
    PUT_ORDER,
)
from tests.support.servers import ALL_COMBOS, DB_COMBOS, DYNAMODB_COMBOS, Combo, Harness

# Every combination of the shared fixture, and Redis and PostgreSQL behind both adapters.
COMBOS = (*ALL_COMBOS, *DB_COMBOS)
ASGI_COMBOS = tuple(combo for combo in COMBOS if combo.adapter == "asgi")
WSGI_COMBOS = tuple(combo for combo in COMBOS if combo.adapter == "wsgi")
# Stores that can be pointed at a server that is not there.
NETWORK_COMBOS = (*DYNAMODB_COMBOS, *DB_COMBOS)


@pytest.fixture(params=COMBOS, ids=lambda combo: combo.id)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """This module's combinations, in place of conftest's: its own and the database ones."""
    yield from open_harness(request, request.param)


HEADER = "Idempotency-Key"
ORDER = {"item": "book", "quantity": 2, "tags": ["a", "b"]}

# Headers the server adds to every response on its own; they differ between two responses.
SERVER_HEADERS = frozenset({"date", "server"})
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def combo_id(combo: Combo) -> str:
    return combo.id


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


def keyed(key: str) -> dict[str, str]:
    return {HEADER: key}


def replayed(response: httpx.Response) -> bool:
    marker: str | None = response.headers.get("idempotent-replayed")
    return marker == "true"


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """An RFC 9457 problem made by the middleware: the status, content type and members."""
    assert response.status_code == status, response.text
    media_type = response.headers.get("content-type", "").split(";", 1)[0].strip()
    assert media_type == "application/problem+json", response.headers
    body = response.json()
    assert isinstance(body, dict), body
    assert body.get("status") == status, body
    for member in ("type", "title", "detail"):
        assert isinstance(body.get(member), str), body
        assert body[member], body
    return body


def assert_retry_after(response: httpx.Response) -> None:
    """README "Retry-After": both the 409 (key in progress) and the 503 (store down) say 1."""
    assert response.headers.get_list("retry-after") == ["1"], response.headers


def end_to_end_headers(response: httpx.Response) -> list[tuple[str, str]]:
    """The response's headers minus those the server adds itself, sorted."""
    return sorted(
        (name.lower(), value)
        for name, value in response.headers.multi_items()
        if name.lower() not in SERVER_HEADERS
    )


@contextlib.contextmanager
def held_request(
    harness: Harness, url: str, key: str, body: Any, *, path: str = "/slow"
) -> Iterator[Future[httpx.Response]]:
    """A POST to ``path`` (/slow or /block) whose handler is running, blocked until the block
    exits.

    Yields the future of its response; on exit the gate opens and the handler finishes.
    """
    endpoint = f"POST {path}"
    gate = harness.state.arm_gate()
    entered_before = harness.calls(endpoint)
    client = harness.client(url)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(client.post, path, json=body, headers=keyed(key))
        try:
            if not harness.state.wait_for_calls(endpoint, entered_before + 1):
                answer = future.result(timeout=0) if future.done() else "no answer yet"
                raise AssertionError(
                    f"the first {path} request never reached its handler: {answer}"
                )
            yield future
        finally:
            gate.set()


# --- keys: absent, required, invalid --------------------------------------------------------


def test_covered_request_without_key_runs_every_time_and_stores_nothing(harness: Harness) -> None:
    client = harness.serve()

    first = client.post("/orders", json=ORDER)
    second = client.post("/orders", json=ORDER)

    assert (first.status_code, second.status_code) == (201, 201)
    assert (first.json()["call"], second.json()["call"]) == (1, 2)
    assert not replayed(first)
    assert not replayed(second)
    assert harness.calls(POST_ORDERS) == 2
    assert harness.stored_records() == 0


def test_required_key_missing_is_400_problem_and_handler_not_run(harness: Harness) -> None:
    client = harness.serve(required=True)

    response = client.post("/orders", json=ORDER)

    assert_problem(response, 400)
    assert harness.calls(POST_ORDERS) == 0


INVALID_KEYS: dict[str, str | bytes] = {
    "empty": "",
    "empty quoted string": '""',
    "256 characters": "k" * 256,
    "256 characters quoted": '"' + "k" * 256 + '"',
    "space inside": "ab cd",
    "non-ASCII byte": b"ab\xe9cd",
    "tab inside": b"ab\tcd",
    "unterminated quoted string": '"abc',
    "invalid escape in quoted string": '"a\\x"',
    "text after quoted string": '"abc"def',
    "bare with double quote": 'ab"cd',
    "bare with backslash": "ab\\cd",
}


def test_invalid_keys_are_400_problem_and_handler_not_run(harness: Harness) -> None:
    client = harness.serve()
    wrong: dict[str, str] = {}

    for case, value in INVALID_KEYS.items():
        response = client.post("/orders", json=ORDER, headers=[(HEADER.encode(), _raw(value))])
        try:
            assert_problem(response, 400)
        except AssertionError as error:
            wrong[case] = f"{response.status_code} {response.text[:120]!r} ({error})"

    assert wrong == {}
    assert harness.calls(POST_ORDERS) == 0


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("ascii")


def test_key_of_255_characters_is_accepted(harness: Harness) -> None:
    client = harness.serve()
    key = "k" * 254 + uuid.uuid4().hex[:1]

    first = client.post("/orders", json=ORDER, headers=keyed(key))
    second = client.post("/orders", json=ORDER, headers=keyed(key))

    assert first.status_code == 201
    assert replayed(second)
    assert harness.calls(POST_ORDERS) == 1


def test_key_header_sent_twice_is_400(harness: Harness) -> None:
    # Two header lines: ASGI servers keep them apart, WSGI servers fold them with a comma.
    client = harness.serve()
    key = new_key()

    response = client.post("/orders", json=ORDER, headers=[(HEADER, key), (HEADER, key)])

    assert_problem(response, 400)
    assert harness.calls(POST_ORDERS) == 0


def test_key_header_folded_with_a_comma_is_400(harness: Harness) -> None:
    # What a server or proxy makes of a header sent twice: one line, values joined by ", ".
    client = harness.serve()
    wrong: dict[str, int] = {}

    for value in ("abc, def", '"abc", "def"', '"abc",def', "abc,abc"):
        response = client.post("/orders", json=ORDER, headers={HEADER: value})
        try:
            assert_problem(response, 400)
        except AssertionError:
            wrong[value] = response.status_code

    assert wrong == {}
    assert harness.calls(POST_ORDERS) == 0


def test_quoted_and_bare_forms_of_a_key_are_the_same_key(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    bare = client.post("/orders", json=ORDER, headers={HEADER: key})
    quoted = client.post("/orders", json=ORDER, headers={HEADER: f'"{key}"'})

    assert bare.status_code == 201
    assert replayed(quoted)
    assert quoted.content == bare.content
    assert harness.calls(POST_ORDERS) == 1


def test_a_quoted_key_with_spaces_and_escapes_is_one_key_and_its_bare_form_is_told_to_quote(
    harness: Harness,
) -> None:
    # The IETF draft's key is an sf-string: a space is one of its characters, and `"` and `\`
    # are escaped. A bare key cannot hold them, and its 400 gives the quoted form.
    client = harness.serve()
    key = f'order {uuid.uuid4().hex[:8]} \\"for\\" a\\\\b'  # on the wire: \" and \\

    first = client.post("/orders", json=ORDER, headers={HEADER: f'"{key}"'})
    retry = client.post("/orders", json=ORDER, headers={HEADER: f'"{key}"'})
    bare = client.post("/orders", json=ORDER, headers={HEADER: "order 42"})
    spaced = client.post("/orders", json=ORDER, headers={HEADER: f'" {key}"'})

    assert first.status_code == 201, first.text
    assert replayed(retry)
    assert retry.content == first.content
    assert assert_problem(bare, 400)["detail"] == QUOTE_IT
    assert '"abc def"' in QUOTE_IT
    assert spaced.status_code == 201 and not replayed(spaced)  # a leading space is kept
    assert harness.calls(POST_ORDERS) == 2


# --- new key and replay ----------------------------------------------------------------------


def test_new_key_gets_the_handlers_response_unchanged(harness: Harness) -> None:
    client = harness.serve()
    plain = client.post("/orders", json=ORDER)  # no key: the app's own response

    response = client.post("/orders", json=ORDER, headers=keyed(new_key()))

    assert response.status_code == 201
    assert response.json() == {"endpoint": POST_ORDERS, "call": 2, "received": ORDER}
    assert response.headers["x-order"] == "order-2"
    assert response.headers["set-cookie"] == "session=s2; Path=/"
    assert response.headers["content-type"] == plain.headers["content-type"]
    assert int(response.headers["content-length"]) == len(response.content)
    assert "idempotent-replayed" not in response.headers
    assert sorted(name for name, _ in end_to_end_headers(response)) == sorted(
        name for name, _ in end_to_end_headers(plain)
    )


def test_replay_has_the_stored_status_and_identical_body_bytes(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    first = client.post("/orders", json=ORDER, headers=keyed(key))
    second = client.post("/orders", json=ORDER, headers=keyed(key))

    assert second.status_code == first.status_code == 201
    assert second.content == first.content
    assert replayed(second)


def test_replay_does_not_run_the_handler(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    for _ in range(3):
        client.post("/orders", json=ORDER, headers=keyed(key))

    assert harness.calls(POST_ORDERS) == 1


def test_replay_keeps_end_to_end_headers_and_adds_idempotent_replayed(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    first = client.post("/orders", json=ORDER, headers=keyed(key))
    second = client.post("/orders", json=ORDER, headers=keyed(key))

    expected = sorted(
        [
            *(header for header in end_to_end_headers(first) if header[0] != "set-cookie"),
            ("idempotent-replayed", "true"),
        ]
    )
    assert end_to_end_headers(second) == expected
    assert second.headers["x-order"] == "order-1"


def test_replay_omits_set_cookie_and_hop_by_hop_headers(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    first = client.post("/orders", json=ORDER, headers=keyed(key))
    second = client.post("/orders", json=ORDER, headers=keyed(key))

    assert "set-cookie" in first.headers
    assert "set-cookie" not in second.headers
    assert not HOP_BY_HOP & {name.lower() for name in second.headers}


def test_replay_carries_a_correct_content_length(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    client.post("/orders", json=ORDER, headers=keyed(key))
    second = client.post("/orders", json=ORDER, headers=keyed(key))

    assert replayed(second)
    assert second.headers.get_list("content-length") == [str(len(second.content))]


# --- fingerprint -----------------------------------------------------------------------------


def test_same_key_with_a_different_body_after_completion_is_422(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    client.post("/orders", json=ORDER, headers=keyed(key))
    response = client.post("/orders", json={**ORDER, "quantity": 3}, headers=keyed(key))

    assert_problem(response, 422)
    assert harness.calls(POST_ORDERS) == 1


def test_same_key_with_a_different_body_while_in_progress_is_422(harness: Harness) -> None:
    url = harness.start()
    client = harness.client(url)
    key = new_key()

    with held_request(harness, url, key, {"n": 1}) as first:
        response = client.post("/slow", json={"n": 2}, headers=keyed(key))
        assert_problem(response, 422)
    assert first.result().status_code == 201
    assert harness.calls(POST_SLOW) == 1


def test_same_key_with_a_different_method_on_the_same_route_is_an_independent_key(
    harness: Harness,
) -> None:
    # The rules issue namespaces keys by method + route template + scope: PATCH /orders with
    # the key of a completed POST /orders is a key of its own (README, "Method in the
    # namespace"), and each is replayed on its own method.
    client = harness.serve()
    key = new_key()

    posted = client.post("/orders", json=ORDER, headers=keyed(key))
    patched = client.patch("/orders", json=ORDER, headers=keyed(key))
    patched_again = client.patch("/orders", json=ORDER, headers=keyed(key))

    assert posted.status_code == patched.status_code == 201
    assert "idempotent-replayed" not in patched.headers
    assert patched_again.headers["idempotent-replayed"] == "true"
    assert patched_again.content == patched.content
    assert harness.calls(POST_ORDERS) == 1
    assert harness.calls(PATCH_ORDERS) == 1


def test_json_key_order_and_whitespace_differences_replay(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()
    json_headers = {HEADER: key, "Content-Type": "application/json"}

    first = client.post(
        "/orders", content=b'{"a":1,"b":[1,2],"c":{"x":"y","z":null}}', headers=json_headers
    )
    second = client.post(
        "/orders",
        content=b'{ "c" : { "z" : null , "x" : "y" },\n  "b" : [ 1 , 2 ], "a" : 1 }',
        headers=json_headers,
    )

    assert first.status_code == 201
    assert replayed(second), second.text
    assert harness.calls(POST_ORDERS) == 1


def test_json_values_of_a_different_type_are_a_different_request(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    client.post("/orders", json={"amount": 1}, headers=keyed(key))
    response = client.post("/orders", json={"amount": "1"}, headers=keyed(key))

    assert_problem(response, 422)
    assert harness.calls(POST_ORDERS) == 1


def test_query_parameter_order_differences_replay(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    first = client.post("/orders?a=1&b=2&a=3", json=ORDER, headers=keyed(key))
    second = client.post("/orders?b=2&a=1&a=3", json=ORDER, headers=keyed(key))

    assert first.status_code == 201
    assert replayed(second), second.text
    assert harness.calls(POST_ORDERS) == 1


def test_query_parameter_values_are_part_of_the_request(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    client.post("/orders?a=1", json=ORDER, headers=keyed(key))
    response = client.post("/orders?a=2", json=ORDER, headers=keyed(key))

    assert_problem(response, 422)
    assert harness.calls(POST_ORDERS) == 1


def test_form_pair_order_differences_replay(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()
    form_headers = {HEADER: key, "Content-Type": "application/x-www-form-urlencoded"}

    first = client.post("/orders", content=b"a=1&b=2", headers=form_headers)
    second = client.post("/orders", content=b"b=2&a=1", headers=form_headers)

    assert first.status_code == 201
    assert replayed(second), second.text
    assert harness.calls(POST_ORDERS) == 1


# --- key namespaces --------------------------------------------------------------------------


def test_same_key_on_two_routes_is_two_independent_keys(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    order = client.post("/orders", json=ORDER, headers=keyed(key))
    payment = client.post("/payments", json=ORDER, headers=keyed(key))
    payment_again = client.post("/payments", json=ORDER, headers=keyed(key))

    assert (order.status_code, payment.status_code) == (201, 201)
    assert not replayed(payment)
    assert payment.json()["endpoint"] == POST_PAYMENTS
    assert replayed(payment_again)
    assert payment_again.content == payment.content
    assert (harness.calls(POST_ORDERS), harness.calls(POST_PAYMENTS)) == (1, 1)


def test_scope_keeps_clients_keys_apart(harness: Harness) -> None:
    client = harness.serve(scope=scope_by_tenant_header("X-Tenant-Id"))
    key = new_key()

    tenant_a = client.post("/orders", json=ORDER, headers={HEADER: key, "X-Tenant-Id": "a"})
    tenant_b = client.post("/orders", json=ORDER, headers={HEADER: key, "X-Tenant-Id": "b"})
    tenant_a_again = client.post("/orders", json=ORDER, headers={HEADER: key, "X-Tenant-Id": "a"})

    assert not replayed(tenant_b)
    assert (tenant_a.json()["call"], tenant_b.json()["call"]) == (1, 2)
    assert replayed(tenant_a_again)
    assert tenant_a_again.content == tenant_a.content


def test_custom_header_name_carries_the_key(harness: Harness) -> None:
    client = harness.serve(header_name="X-Request-Key")
    key = new_key()

    first = client.post("/orders", json=ORDER, headers={"X-Request-Key": key})
    second = client.post("/orders", json=ORDER, headers={"X-Request-Key": key})
    default_header = client.post("/orders", json=ORDER, headers={HEADER: key})

    assert first.status_code == 201
    assert replayed(second)
    assert not replayed(default_header)  # not the configured header: passes through
    assert harness.calls(POST_ORDERS) == 2


def test_methods_option_chooses_the_covered_methods(harness: Harness) -> None:
    client = harness.serve(methods=["PUT"])
    key = new_key()

    put_first = client.put("/orders/7", json=ORDER, headers=keyed(key))
    put_again = client.put("/orders/7", json=ORDER, headers=keyed(key))
    post_first = client.post("/orders", json=ORDER, headers=keyed(key))
    post_again = client.post("/orders", json=ORDER, headers=keyed(key))

    assert put_first.status_code == 200
    assert replayed(put_again)
    assert not replayed(post_again)
    assert (post_first.json()["call"], post_again.json()["call"]) == (1, 2)
    assert harness.calls(PUT_ORDER) == 1


def test_rule_covers_put_on_a_route_template(harness: Harness) -> None:
    client = harness.serve(rules=[IdempotencyRule("/orders/{order_id}", methods=["PUT"])])
    key = new_key()

    first = client.put("/orders/7", json=ORDER, headers=keyed(key))
    second = client.put("/orders/7", json=ORDER, headers=keyed(key))

    assert first.status_code == 200
    assert replayed(second)
    assert harness.calls(PUT_ORDER) == 1


# --- in progress, failures, stored statuses --------------------------------------------------


def test_same_key_while_in_progress_is_409_with_retry_after(harness: Harness) -> None:
    url = harness.start()
    client = harness.client(url)
    key = new_key()

    with held_request(harness, url, key, {"n": 1}) as first:
        response = client.post("/slow", json={"n": 1}, headers=keyed(key))
        assert_problem(response, 409)
        assert_retry_after(response)
    assert first.result().status_code == 201
    assert harness.calls(POST_SLOW) == 1


def test_5xx_response_releases_the_key_and_a_retry_runs_again(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    first = client.post("/fail", json=ORDER, headers=keyed(key))
    retry = client.post("/fail", json=ORDER, headers=keyed(key))

    assert (first.status_code, retry.status_code) == (500, 500)
    assert not replayed(retry)
    assert retry.json()["call"] == 2
    assert harness.calls(POST_FAIL) == 2
    assert harness.stored_records() == 0


def test_raised_exception_releases_the_key_and_a_retry_runs_again(harness: Harness) -> None:
    client = harness.serve()
    key = new_key()

    first = client.post("/boom", json=ORDER, headers=keyed(key))
    retry = client.post("/boom", json=ORDER, headers=keyed(key))

    assert (first.status_code, retry.status_code) == (500, 500)
    assert not replayed(retry)
    assert harness.calls(POST_BOOM) == 2
    assert harness.stored_records() == 0


def test_4xx_responses_are_stored_and_replayed(harness: Harness) -> None:
    client = harness.serve()

    for status in (400, 404, 422):
        key = new_key()
        first = client.post(f"/status/{status}", json=ORDER, headers=keyed(key))
        second = client.post(f"/status/{status}", json=ORDER, headers=keyed(key))

        assert first.status_code == second.status_code == status
        assert not replayed(first)
        assert replayed(second), status
        assert second.content == first.content
    assert harness.calls(POST_STATUS) == 3


# --- deadlines -------------------------------------------------------------------------------
# Every server of a test reads one FakeClock (started at the real time, so no store takes
# its records for long expired): a test crosses a lock or a TTL by advancing it. The lease
# renewers still tick on real time (every third of a lock), and renew what is due by the
# fake clock.

LOCK_TIMEOUT_SECONDS = 0.3
RENEWAL_INTERVAL_SECONDS = LOCK_TIMEOUT_SECONDS / 3
PAST_DEADLINE_SECONDS = LOCK_TIMEOUT_SECONDS + 0.1
# These servers share one clock: no margin for clock skew, so a lock crossed is stale at
# once (the margin has its own tests, tests/e2e/test_clock_skew.py).
NO_SKEW = 0.0


def shared_clock() -> FakeClock:
    return FakeClock(time.time())


def test_dead_owners_stale_claim_is_taken_over_by_the_next_request(harness: Harness) -> None:
    # The owner cannot renew its lease (as if it had died), so its claim goes stale.
    clock = shared_clock()
    url = harness.start(
        lock_timeout_seconds=LOCK_TIMEOUT_SECONDS,
        renewals_cut_off=True,
        clock_skew_seconds=NO_SKEW,
        clock=clock,
    )
    client = harness.client(url)
    key = new_key()

    with held_request(harness, url, key, {"n": 1}):
        clock.advance(PAST_DEADLINE_SECONDS)
        takeover = client.post("/slow", json={"n": 1}, headers=keyed(key))

        assert takeover.status_code == 201, takeover.text
        assert not replayed(takeover)
        assert takeover.json()["call"] == 2
        assert harness.calls(POST_SLOW) == 2


def test_taken_over_owner_answers_its_client_but_cannot_store_its_response(
    harness: Harness,
) -> None:
    clock = shared_clock()
    url = harness.start(
        lock_timeout_seconds=LOCK_TIMEOUT_SECONDS,
        renewals_cut_off=True,
        clock_skew_seconds=NO_SKEW,
        clock=clock,
    )
    client = harness.client(url)
    key = new_key()

    with held_request(harness, url, key, {"n": 1}) as first:
        clock.advance(PAST_DEADLINE_SECONDS)
        takeover = client.post("/slow", json={"n": 1}, headers=keyed(key))
    late = first.result()  # the first owner finishes after the takeover
    replay = client.post("/slow", json={"n": 1}, headers=keyed(key))

    assert takeover.status_code == 201, takeover.text
    assert late.status_code == 201
    assert not replayed(late)
    assert late.json()["call"] == 1
    assert replayed(replay), replay.text
    assert replay.content == takeover.content
    assert replay.json()["call"] == 2
    assert harness.calls(POST_SLOW) == 2


def test_slow_owner_that_renews_its_lease_keeps_the_key(harness: Harness) -> None:
    clock = shared_clock()
    url = harness.start(
        lock_timeout_seconds=LOCK_TIMEOUT_SECONDS,
        clock_skew_seconds=NO_SKEW,
        count_renewals=True,
        clock=clock,
    )
    client = harness.client(url)
    key = new_key()

    with held_request(harness, url, key, {"n": 1}) as first:
        # A renewal falls due; wait (real time) until the renewer has made it.
        clock.advance(RENEWAL_INTERVAL_SECONDS * 1.5)
        assert harness.renewals.wait_for(1), "the owner's lease was never renewed"
        # Past the lock the claim was granted, short of the renewed one.
        clock.advance(PAST_DEADLINE_SECONDS - RENEWAL_INTERVAL_SECONDS * 1.5)
        duplicate = client.post("/slow", json={"n": 1}, headers=keyed(key))
    original = first.result()
    replay = client.post("/slow", json={"n": 1}, headers=keyed(key))

    assert_problem(duplicate, 409)
    assert_retry_after(duplicate)
    assert original.status_code == 201
    assert replayed(replay)
    assert replay.content == original.content
    assert harness.calls(POST_SLOW) == 1


@pytest.mark.parametrize("harness", ASGI_COMBOS, indirect=True, ids=combo_id)
def test_owner_whose_event_loop_is_blocked_is_taken_over(harness: Harness) -> None:
    # Two instances of one deployment share the store; the owner's handler blocks its loop,
    # so its lease renewal cannot run and the other instance takes the key over.
    clock = shared_clock()
    owner_url = harness.start(lock_timeout_seconds=LOCK_TIMEOUT_SECONDS, clock=clock)
    other = harness.client(
        harness.start(
            lock_timeout_seconds=LOCK_TIMEOUT_SECONDS, clock_skew_seconds=NO_SKEW, clock=clock
        )
    )
    key = new_key()

    with held_request(harness, owner_url, key, {"n": 1}, path="/block") as first:
        clock.advance(PAST_DEADLINE_SECONDS)
        # Real time for the owner's renewer to tick twice, had its loop been free: it would
        # then have renewed the lease (due by the clock) and kept the key.
        time.sleep(RENEWAL_INTERVAL_SECONDS * 2)
        takeover = other.post("/block", json={"n": 1}, headers=keyed(key))
    late = first.result()
    replay = other.post("/block", json={"n": 1}, headers=keyed(key))

    assert takeover.status_code == 201, takeover.text
    assert takeover.json()["call"] == 2
    assert late.status_code == 201
    assert late.json()["call"] == 1
    assert replayed(replay), replay.text
    assert replay.content == takeover.content
    assert harness.calls(POST_BLOCK) == 2


def test_completed_record_past_its_ttl_is_treated_as_new(harness: Harness) -> None:
    clock = shared_clock()
    client = harness.serve(ttl_seconds=60, clock=clock)
    key = new_key()

    client.post("/orders", json=ORDER, headers=keyed(key))
    clock.advance(61)
    assert harness.stored_records() == 1  # expired, but nothing has swept it yet
    again = client.post("/orders", json=ORDER, headers=keyed(key))

    assert again.status_code == 201
    assert not replayed(again)
    assert again.json()["call"] == 2
    assert harness.calls(POST_ORDERS) == 2


# --- store unavailable -----------------------------------------------------------------------


@pytest.mark.parametrize("harness", NETWORK_COMBOS, indirect=True, ids=combo_id)
def test_unreachable_store_answers_503_with_retry_after_without_running_the_handler(
    harness: Harness,
) -> None:
    client = harness.serve(unreachable_store=True)

    started = time.monotonic()
    response = client.post("/orders", json=ORDER, headers=keyed(new_key()))
    elapsed = time.monotonic() - started

    assert_problem(response, 503)
    assert_retry_after(response)
    assert harness.calls(POST_ORDERS) == 0
    assert elapsed < 5.0


# --- sizes -----------------------------------------------------------------------------------

MAX_BODY_BYTES = 1000


def test_body_over_max_body_bytes_is_413_and_handler_not_run(harness: Harness) -> None:
    client = harness.serve(max_body_bytes=MAX_BODY_BYTES)

    response = client.post("/orders", content=b"x" * (MAX_BODY_BYTES + 1), headers=keyed(new_key()))

    assert_problem(response, 413)
    assert harness.calls(POST_ORDERS) == 0


def test_chunked_body_over_max_body_bytes_is_413_and_handler_not_run(harness: Harness) -> None:
    client = harness.serve(max_body_bytes=MAX_BODY_BYTES)

    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b"x" * 500

    request = client.build_request("POST", "/orders", content=chunks(), headers=keyed(new_key()))
    assert request.headers.get("transfer-encoding") == "chunked"
    response = client.send(request)

    assert_problem(response, 413)
    assert harness.calls(POST_ORDERS) == 0


def test_body_of_exactly_max_body_bytes_is_accepted(harness: Harness) -> None:
    client = harness.serve(max_body_bytes=MAX_BODY_BYTES)

    response = client.post("/orders", content=b"x" * MAX_BODY_BYTES, headers=keyed(new_key()))

    assert response.status_code == 201
    assert harness.calls(POST_ORDERS) == 1


def test_chunked_body_under_the_limit_is_fingerprinted_and_replayed(harness: Harness) -> None:
    client = harness.serve(max_body_bytes=MAX_BODY_BYTES)
    key = new_key()

    def chunks(text: bytes) -> Iterator[bytes]:
        yield from (text[:3], text[3:])

    first = client.post("/orders", content=chunks(b"hello world"), headers=keyed(key))
    second = client.post("/orders", content=chunks(b"hello world"), headers=keyed(key))
    other = client.post("/orders", content=chunks(b"hello there"), headers=keyed(key))

    assert first.status_code == 201
    assert first.json()["received"] == "hello world"
    assert replayed(second)
    assert_problem(other, 422)
    assert harness.calls(POST_ORDERS) == 1


def test_response_too_large_to_keep_runs_once_and_a_retry_gets_a_410_problem(
    harness: Harness,
) -> None:
    client = harness.serve()
    key = new_key()
    size = harness.too_large_response_bytes

    first = client.post(f"/big?n={size}", headers=keyed(key))
    retry = client.post(f"/big?n={size}", headers=keyed(key))

    assert first.status_code == 201
    assert len(first.content) == size
    assert_problem(retry, 410)
    assert harness.calls(POST_BIG) == 1


# --- uncovered methods -----------------------------------------------------------------------


def test_uncovered_methods_pass_through_even_with_a_key(harness: Harness) -> None:
    client = harness.serve()

    for method, path, endpoint in (("GET", "/orders", GET_ORDERS), ("PUT", "/orders/7", PUT_ORDER)):
        key = new_key()
        body = None if method == "GET" else b'{"a": 1}'
        first = client.request(method, path, content=body, headers=keyed(key))
        second = client.request(method, path, content=body, headers=keyed(key))

        assert first.status_code == second.status_code == 200
        assert not replayed(second)
        assert (first.json()["call"], second.json()["call"]) == (1, 2), method
        assert harness.calls(endpoint) == 2
    assert harness.stored_records() == 0


# --- problem responses -----------------------------------------------------------------------


def test_every_problem_response_is_problem_json(harness: Harness) -> None:
    url = harness.start(required=True, max_body_bytes=MAX_BODY_BYTES)
    client = harness.client(url)
    key = new_key()
    client.post("/orders", json=ORDER, headers=keyed(key))
    problems: dict[int, httpx.Response] = {}

    problems[400] = client.post("/orders", json=ORDER)
    problems[413] = client.post("/orders", content=b"x" * 2000, headers=keyed(new_key()))
    problems[422] = client.post("/orders", json={"other": True}, headers=keyed(key))
    slow_key = new_key()
    with held_request(harness, url, slow_key, {"n": 1}):
        problems[409] = client.post("/slow", json={"n": 1}, headers=keyed(slow_key))

    for status, response in problems.items():
        body = assert_problem(response, status)
        assert set(body) >= {"type", "title", "status", "detail"}


# --- Flask specifics -------------------------------------------------------------------------


@pytest.mark.parametrize("harness", WSGI_COMBOS, indirect=True, ids=combo_id)
def test_flask_errorhandler_500_response_releases_the_key(harness: Harness) -> None:
    client = harness.serve(flask_propagate_exceptions=False)
    key = new_key()

    first = client.post("/boom", json=ORDER, headers=keyed(key))
    retry = client.post("/boom", json=ORDER, headers=keyed(key))

    assert first.status_code == retry.status_code == 500
    assert first.json() == retry.json() == FLASK_ERRORHANDLER_BODY  # errorhandler(500) answered
    assert not replayed(retry)
    assert harness.calls(POST_BOOM) == 2


@pytest.mark.parametrize("harness", WSGI_COMBOS, indirect=True, ids=combo_id)
def test_flask_unhandled_exception_releases_the_key(harness: Harness) -> None:
    client = harness.serve(flask_propagate_exceptions=True)
    key = new_key()

    first = client.post("/boom", json=ORDER, headers=keyed(key))
    retry = client.post("/boom", json=ORDER, headers=keyed(key))

    assert first.status_code == retry.status_code == 500
    assert "errorhandler" not in retry.text  # the exception left Flask: the server answered
    assert not replayed(retry)
    assert harness.calls(POST_BOOM) == 2


# --- non-HTTP ASGI scopes --------------------------------------------------------------------


class UntouchableStore:
    """An async store that fails the test if the middleware touches it."""

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        raise AssertionError("the store was touched")

    async def acomplete(self, completion: Completion) -> bool:
        raise AssertionError("the store was touched")

    async def arelease(self, key: str, owner: str) -> bool:
        raise AssertionError("the store was touched")

    async def arenew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        raise AssertionError("the store was touched")

    async def aget(self, key: str) -> Record | None:
        raise AssertionError("the store was touched")


Message = MutableMapping[str, Any]


@pytest.mark.parametrize("scope_type", ["websocket", "lifespan"])
async def test_non_http_scopes_pass_straight_through(scope_type: str) -> None:
    calls: list[tuple[MutableMapping[str, Any], object, object]] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        calls.append((scope, receive, send))
        await send({"type": "app.sent", "message": await receive()})

    async def receive() -> Message:
        return {"type": f"{scope_type}.connect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = IdempotencyMiddleware(app, store=UntouchableStore(), required=True)
    scope: MutableMapping[str, Any] = {
        "type": scope_type,
        "path": "/orders",
        "method": "POST",
        "headers": [(b"idempotency-key", b'"not valid')],
    }

    await middleware(scope, receive, send)

    assert len(calls) == 1
    assert calls[0][0] is scope
    assert calls[0][1] is receive
    assert calls[0][2] is send
    assert sent == [{"type": "app.sent", "message": {"type": f"{scope_type}.connect"}}]
