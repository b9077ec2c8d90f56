"""The one-time actions HTTP example (``examples/one_time_actions.py``) under a real uvicorn
server on 127.0.0.1, driven with httpx: every answer, refusals as problem+json.

In-process: the example's app served by uvicorn in a thread, its ``get_actions`` dependency
overridden (as FastAPI tests do) with actions on a MemoryStore and a FakeClock, so the test
crosses ``active_at`` and ``expires_at`` without sleeping. As a user runs it: ``uvicorn
examples.one_time_actions:app`` in its own process, unmodified, configured by the
environment, against moto (and DynamoDB Local, skipped unless scripts/dynamodb-local.sh runs
it), including a consume retried with the same Idempotency-Key.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples import one_time_actions as example
from idempotency_middleware import MemoryStore, OneTimeActions
from idempotency_middleware.testing import FakeClock
from tests.docs.test_idempotency_examples import example_env, serving  # noqa: F401
from tests.support.servers import serve_asgi

PROBLEM = "application/problem+json"


class Served:
    def __init__(self, client: httpx.Client, clock: FakeClock) -> None:
        self.client = client
        self.clock = clock

    def create(self, **body: Any) -> dict[str, Any]:
        response = self.client.post("/actions", json={"expires_in": 600, **body})
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    def consume(self, action_id: str, **body: Any) -> httpx.Response:
        return self.client.post(f"/actions/{action_id}/consume", json=body or None)


@pytest.fixture
def served() -> Iterator[Served]:
    clock = FakeClock(start=time.time())
    actions = OneTimeActions(MemoryStore(clock=clock))
    example.app.dependency_overrides[example.get_actions] = lambda: actions
    try:
        with serve_asgi(example.app) as url, httpx.Client(base_url=url, timeout=15) as client:
            yield Served(client, clock)
    finally:
        example.app.dependency_overrides.clear()


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    document: dict[str, Any] = response.json()
    assert document["type"] == f"urn:idempotency-middleware:problem:{slug}"
    assert document["status"] == status
    assert document["title"] and document["detail"]
    return document


def test_create_get_consume_then_already_used(served: Served) -> None:
    created = served.create(data={"user": 42})
    assert created["state"] == "active" and created["data"] == {"user": 42}
    assert served.client.get(f"/actions/{created['action_id']}").json() == created
    consumed = served.consume(created["action_id"], reason="login")
    assert consumed.status_code == 200, consumed.text
    assert consumed.json()["state"] == "consumed"
    assert consumed.json()["consumed_reason"] == "login"
    again = problem(served.consume(created["action_id"]), 409, "action-already-used")
    assert again["consumed_at"] == consumed.json()["consumed_at"]


def test_unknown_actions_are_404_problems(served: Served) -> None:
    problem(served.client.get("/actions/nope"), 404, "action-not-found")
    problem(served.consume("nope"), 404, "action-not-found")
    problem(served.client.post("/actions/nope/cancel"), 404, "action-not-found")


def test_a_taken_id_is_a_409_problem(served: Served) -> None:
    served.create(action_id="SUMMER-2026")
    taken = served.client.post("/actions", json={"expires_in": 60, "action_id": "SUMMER-2026"})
    problem(taken, 409, "action-exists")


def test_pins_wrong_then_locked(served: Served) -> None:
    created = served.create(pin="4321", max_pin_attempts=2)
    assert created["pin_attempts_left"] == 2
    wrong = problem(served.consume(created["action_id"], pin="0000"), 403, "invalid-pin")
    assert wrong["attempts_left"] == 1
    missing = problem(served.consume(created["action_id"]), 403, "invalid-pin")
    assert missing["attempts_left"] == 1
    last = problem(served.consume(created["action_id"], pin="1111"), 403, "invalid-pin")
    assert last["attempts_left"] == 0
    problem(served.consume(created["action_id"], pin="4321"), 423, "action-locked")


def test_the_right_pin_consumes(served: Served) -> None:
    created = served.create(pin="4321")
    assert served.consume(created["action_id"], pin="4321").json()["state"] == "consumed"


def test_pending_then_active_then_expired(served: Served) -> None:
    active_at = datetime.fromtimestamp(served.clock.now(), tz=timezone.utc) + timedelta(minutes=5)
    created = served.create(active_at=active_at.isoformat(), expires_in=600)
    assert created["state"] == "pending"
    early = problem(served.consume(created["action_id"]), 409, "action-not-active")
    assert early["active_at"] == created["active_at"]
    later = served.create(expires_in=60)
    served.clock.advance(300)
    assert served.client.get(f"/actions/{created['action_id']}").json()["state"] == "active"
    gone = problem(served.consume(later["action_id"]), 410, "action-expired")
    assert gone["expires_at"] == later["expires_at"]
    assert served.consume(created["action_id"]).status_code == 200


def test_cancel_then_consume_is_a_410_problem(served: Served) -> None:
    created = served.create()
    canceled = served.client.post(f"/actions/{created['action_id']}/cancel")
    assert canceled.status_code == 200 and canceled.json()["state"] == "canceled"
    refused = problem(served.consume(created["action_id"]), 410, "action-canceled")
    assert refused["canceled_at"] == canceled.json()["canceled_at"]
    consumed = served.create()
    served.consume(consumed["action_id"])
    problem(
        served.client.post(f"/actions/{consumed['action_id']}/cancel"), 409, "action-already-used"
    )


def test_malformed_requests_are_refused_before_the_actions(served: Served) -> None:
    for body in (
        {"expires_in": 0},
        {"expires_in": 60, "active_at": "2026-01-01T00:00:00"},  # no timezone
        {"expires_in": 60, "action_id": "has/slash"},
    ):
        assert served.client.post("/actions", json=body).status_code == 422


# -- as a user runs it ------------------------------------------------------------------------


@pytest.fixture(params=["dynamodb", "dynamodb-local"])
def endpoint(request: pytest.FixtureRequest) -> str:
    name = "moto_endpoint" if request.param == "dynamodb" else "dynamodb_local_endpoint"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def tables() -> dict[str, str]:
    return {"IDEMPOTENCY_TABLE": f"idem-actions-{uuid.uuid4().hex[:12]}"}


def test_the_example_runs_unmodified_and_a_retried_consume_is_replayed(
    example_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    with serving("one_time_actions", example_env, tmp_path / "uvicorn.log") as client:
        created = client.post("/actions", json={"expires_in": 600, "pin": "2468"})
        assert created.status_code == 201, created.text
        action_id = created.json()["action_id"]
        key = {"Idempotency-Key": str(uuid.uuid4())}
        path = f"/actions/{action_id}/consume"
        first = client.post(path, json={"pin": "2468"}, headers=key)
        retry = client.post(path, json={"pin": "2468"}, headers=key)
        other = client.post(path, json={"pin": "2468"})
        shown = client.get(f"/actions/{action_id}")
    assert first.status_code == 200, first.text
    assert first.json()["state"] == "consumed"
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert other.status_code == 409 and other.headers["content-type"] == PROBLEM
    assert shown.json()["consumed_at"] == first.json()["consumed_at"]
