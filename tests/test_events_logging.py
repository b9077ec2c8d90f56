"""The event reporter: a broken ``on_event`` hook costs its event, never the response."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from idempotency_middleware import IdempotencyEvent
from idempotency_middleware.events import Reporter


@dataclass(frozen=True)
class Attempt:
    method: str = "POST"
    route: str = "/orders"
    key_hash: str = "a1b2c3"


def test_a_hook_that_raises_is_logged_and_the_next_event_still_reaches_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    received: list[IdempotencyEvent] = []

    def hook(event: IdempotencyEvent) -> None:
        received.append(event)
        if len(received) == 1:
            raise RuntimeError("metrics backend down")

    reporter = Reporter(hook)
    with caplog.at_level(logging.ERROR, logger="idempotency_middleware"):
        reporter.report(Attempt(), "claimed")  # must not raise
        reporter.report(Attempt(), "completed", status=201)

    assert [event.kind for event in received] == ["claimed", "completed"]
    [failure] = [r for r in caplog.records if r.message == "on_event hook raised; event dropped"]
    assert failure.levelno == logging.ERROR
    assert failure.exc_info is not None
    assert isinstance(failure.exc_info[1], RuntimeError)


def test_events_are_logged_with_structured_fields_and_the_hashed_key_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reporter = Reporter(None)
    with caplog.at_level(logging.ERROR, logger="idempotency_middleware"):
        reporter.report(Attempt(), "claimed")  # DEBUG: below the level, not logged
        reporter.report(Attempt(), "store_error", operation="claim", error="Timeout()")
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.message == "idempotency store failed"
    assert record.__dict__["idempotency_event"] == "store_error"
    assert record.__dict__["idempotency_key_hash"] == "a1b2c3"
    assert record.__dict__["idempotency_route"] == "POST /orders"
    assert record.__dict__["idempotency_operation"] == "claim"
    assert record.__dict__["idempotency_error"] == "Timeout()"


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ValueError, match="on_event must be a callable"):
        Reporter(42)  # type: ignore[arg-type]
