"""``stored_statuses``: the statuses whose responses are kept and replayed; any other releases
the key so a retry runs the handler again. Through real servers: uvicorn + FastAPI and
waitress + Flask (memory and DynamoDB on moto), and Django under waitress."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    idempotent,
)
from tests.e2e.test_django import DjangoServers, build_handler
from tests.support.apps import POST_STATUS
from tests.support.servers import Harness


def keyed() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def runs_of(harness: Harness, client: Any, status: int) -> tuple[int, list[Any]]:
    """Send one request answering ``status`` and its retry: the handler's runs, the answers."""
    before = harness.calls(POST_STATUS)
    key = keyed()
    answers = [client.post(f"/status/{status}", headers=key) for _ in range(2)]
    for answer in answers:
        assert answer.status_code == status
    return harness.calls(POST_STATUS) - before, answers


def test_by_default_below_500_is_replayed_and_5xx_runs_again(harness: Harness) -> None:
    client = harness.serve()

    assert runs_of(harness, client, 404)[0] == 1
    assert runs_of(harness, client, 503)[0] == 2


def test_successes_only_releases_a_4xx_so_a_retry_runs_again(harness: Harness) -> None:
    client = harness.serve(stored_statuses=range(200, 300))

    runs, answers = runs_of(harness, client, 409)
    assert runs == 2
    assert "idempotent-replayed" not in answers[1].headers
    runs, answers = runs_of(harness, client, 201)
    assert runs == 1
    assert answers[1].headers["idempotent-replayed"] == "true"


def test_keeping_5xx_too_replays_a_500_as_stripe_does(harness: Harness) -> None:
    client = harness.serve(stored_statuses=range(100, 600))

    runs, answers = runs_of(harness, client, 500)

    assert runs == 1
    assert answers[1].headers["idempotent-replayed"] == "true"
    assert answers[1].content == answers[0].content


@pytest.mark.parametrize("bad", [[200, 600], [99], range(0, 200), [True], ["200"], "2xx", 200])
def test_a_status_outside_100_to_599_is_a_value_error_at_start_up(bad: Any) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="stored_statuses"):
        IdempotencyMiddleware(app, store=MemoryStore(), stored_statuses=bad)
    with pytest.raises(ValueError, match="stored_statuses"):
        IdempotencyWSGIMiddleware(lambda e, s: [], store=MemoryStore(), stored_statuses=bad)


def test_django_takes_stored_statuses_from_its_setting_and_checks_it() -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.core.handlers.wsgi import WSGIHandler

    # (Django's way of saying a setting is wrong, as for every other option.)
    with pytest.raises(ImproperlyConfigured, match="stored_statuses holds 700") as raised:
        build_handler(WSGIHandler, {"store": MemoryStore(), "stored_statuses": [700]})
    assert isinstance(raised.value.__cause__, ValueError)


@pytest.fixture
def django_servers() -> Iterator[DjangoServers]:
    with contextlib.ExitStack() as stack:
        yield DjangoServers(stack)


def test_django_releases_a_status_it_does_not_store(django_servers: DjangoServers) -> None:
    served = django_servers.start(stored_statuses=range(200, 300))
    key = keyed()

    released = [served.client.post("/fail?status=422", headers=key) for _ in range(2)]
    assert [answer.status_code for answer in released] == [422, 422]
    assert served.state.calls("POST /fail") == 2

    key = keyed()
    kept = [served.client.post("/fail?status=202", headers=key) for _ in range(2)]
    assert [answer.status_code for answer in kept] == [202, 202]
    assert kept[1].headers["idempotent-replayed"] == "true"
    assert served.state.calls("POST /fail") == 3


def test_functions_do_not_take_stored_statuses() -> None:
    with pytest.raises(TypeError):
        idempotent(store=MemoryStore(), key="k", stored_statuses=range(200, 300))  # type: ignore[call-arg]
