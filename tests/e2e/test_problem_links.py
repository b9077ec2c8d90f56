"""``problem_base_url``: every problem's ``type`` is the base plus its slug, and the 400 and
422 problems link to it (``Link: <...>; rel="describedby"``), on both middlewares through
real servers (uvicorn + FastAPI, waitress + Flask). Unset, types stay URNs and no Link."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from idempotency_middleware.engine.problems import PROBLEM_TYPE_BASE
from tests.support.apps import POST_SLOW
from tests.support.servers import DYNAMODB_COMBOS, Combo, Harness

BASE = "https://api.example.com/problems/"
MAX_BODY_BYTES = 100


def combo_id(combo: Combo) -> str:
    return combo.id


def new_key() -> str:
    return f'"{uuid.uuid4()}"'


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


@contextlib.contextmanager
def held_slow_request(harness: Harness, url: str, key: str) -> Iterator[Future[httpx.Response]]:
    """A POST /slow with ``key`` whose handler is running until the block exits."""
    gate = harness.state.arm_gate()
    client = harness.client(url)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(client.post, "/slow", json={"n": 1}, headers=keyed(key))
        try:
            assert harness.state.wait_for_calls(POST_SLOW, 1), "the first /slow never ran"
            yield future
        finally:
            gate.set()


def every_problem(harness: Harness, **options: Any) -> dict[str, httpx.Response]:
    """One response of each problem but 503, by slug, from a server with ``options``."""
    url = harness.start(required=True, max_body_bytes=MAX_BODY_BYTES, **options)
    client = harness.client(url)
    answers = {
        "missing-key": client.post("/orders", json={}),
        "invalid-key": client.post("/orders", json={}, headers=keyed("a b")),
        "body-too-large": client.post("/orders", content=b"x" * 200, headers=keyed(new_key())),
    }
    key = new_key()
    client.post("/orders", json={"n": 1}, headers=keyed(key))
    answers["key-reused"] = client.post("/orders", json={"n": 2}, headers=keyed(key))
    big = f"/big?n={harness.too_large_response_bytes}"
    big_key = new_key()
    client.post(big, headers=keyed(big_key))
    answers["response-not-stored"] = client.post(big, headers=keyed(big_key))
    slow_key = new_key()
    with held_slow_request(harness, url, slow_key):
        answers["key-in-progress"] = client.post("/slow", json={"n": 1}, headers=keyed(slow_key))
    return answers


STATUSES = {
    "missing-key": 400,
    "invalid-key": 400,
    "body-too-large": 413,
    "key-reused": 422,
    "response-not-stored": 410,
    "key-in-progress": 409,
}


def test_every_problem_type_is_the_base_url_plus_its_slug(harness: Harness) -> None:
    answers = every_problem(harness, problem_base_url=BASE)

    for slug, response in answers.items():
        assert response.status_code == STATUSES[slug], (slug, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["type"] == BASE + slug
        links = response.headers.get_list("link")
        if STATUSES[slug] in (400, 422):
            assert links == [f'<{BASE}{slug}>; rel="describedby"'], slug
        else:
            assert links == [], slug
        assert int(response.headers["content-length"]) == len(response.content)


def test_without_a_base_url_types_are_urns_and_nothing_links(harness: Harness) -> None:
    answers = every_problem(harness)

    for slug, response in answers.items():
        assert response.status_code == STATUSES[slug], (slug, response.text)
        assert response.json()["type"] == PROBLEM_TYPE_BASE + slug
        assert "link" not in response.headers


@pytest.mark.parametrize("harness", DYNAMODB_COMBOS, indirect=True, ids=combo_id)
@pytest.mark.parametrize("base", [BASE, None])
def test_the_store_unavailable_problem_follows_the_base_url(
    harness: Harness, base: str | None
) -> None:
    client = harness.serve(unreachable_store=True, problem_base_url=base)

    response = client.post("/orders", json={}, headers=keyed(new_key()))

    assert response.status_code == 503
    slug = "store-unavailable"
    assert response.json()["type"] == (PROBLEM_TYPE_BASE if base is None else base) + slug
    assert response.headers["retry-after"] == "1"
    assert "link" not in response.headers


def test_a_fragment_base_url_points_into_one_page(harness: Harness) -> None:
    # base + slug, as given: a page with one anchor per problem works too.
    client = harness.serve(required=True, problem_base_url="https://docs.example.com/errors#")

    response = client.post("/orders", json={})

    assert response.json()["type"] == "https://docs.example.com/errors#missing-key"
    assert (
        response.headers["link"]
        == '<https://docs.example.com/errors#missing-key>; rel="describedby"'
    )
