"""The event reporter: a broken ``on_event`` hook costs its event, never the response."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass

import pytest

from idempotency_middleware import (
    IdempotencyEvent,
    IdempotentConsumer,
    KeyReusedError,
    MemoryStore,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.events import EventKind, Reporter


@dataclass(frozen=True)
class Policy:
    route: str | None = "/orders"


@dataclass(frozen=True)
class Attempt:
    policy: Policy = Policy()
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
    assert record.message == "idempotency store failed: claim: Timeout() (key a1b2c3; POST /orders)"
    assert record.__dict__["idempotency_event"] == "store_error"
    assert record.__dict__["idempotency_key_hash"] == "a1b2c3"
    assert record.__dict__["idempotency_route"] == "POST /orders"
    assert record.__dict__["idempotency_operation"] == "claim"
    assert record.__dict__["idempotency_error"] == "Timeout()"
    assert record.__dict__["idempotency_cause"] is None  # no store error was given


def test_a_store_failure_gives_the_event_and_the_log_line_its_cause_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    received: list[IdempotencyEvent] = []
    failure = StoreUnavailableError(
        "DynamoDB put_item failed: ...", cause="no_table", reason="no such table 'orders'"
    )
    reporter = Reporter(received.append)
    with caplog.at_level(logging.ERROR, logger="idempotency_middleware"):
        reporter.report(Attempt(), "store_error", operation="claim", failure=failure)
        reporter.report(Attempt(), "fail_open", operation="claim", failure=failure)
        reporter.report(
            Attempt(), "store_error", operation="complete", failure=failure, note="gave up"
        )

    assert [event.cause for event in received] == ["no_table"] * 3
    assert received[0].error == repr(failure)
    why = (
        "no such table 'orders'; the store is misconfigured, not retryable; "
        "fix: create it: store.create_table()"
    )
    assert [record.message for record in caplog.records] == [
        f"idempotency store failed: claim: {why} (key a1b2c3; POST /orders)",
        f"idempotency store failed on claim: {why}; handler run WITHOUT "
        "idempotency protection (key a1b2c3; POST /orders)",
        f"idempotency store failed: complete: {why}; gave up (key a1b2c3; POST /orders)",
    ]
    assert all(record.__dict__["idempotency_cause"] == "no_table" for record in caplog.records)


def test_a_store_error_without_a_cause_says_so(caplog: pytest.LogCaptureFixture) -> None:
    received: list[IdempotencyEvent] = []
    with caplog.at_level(logging.ERROR, logger="idempotency_middleware"):
        Reporter(received.append).report(Attempt(), "store_error")
        Reporter(None).report(Attempt(), "store_error", failure=StoreUnavailableError("down"))
    assert [record.message for record in caplog.records] == [
        "idempotency store failed: store call: no reason given (key a1b2c3; POST /orders)",
        "idempotency store failed: store call: down (key a1b2c3; POST /orders)",
    ]
    assert received[0].cause is None
    assert caplog.records[1].__dict__["idempotency_cause"] == "unknown"


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ValueError, match="on_event must be a callable"):
        Reporter(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "status"), [("conflict", 409), ("mismatch", 422), ("not_stored", 410)]
)
def test_an_http_doors_refusal_is_logged_with_the_status_it_answered(
    caplog: pytest.LogCaptureFixture, kind: EventKind, status: int
) -> None:
    with caplog.at_level(logging.INFO, logger="idempotency_middleware"):
        Reporter(None).report(Attempt(), kind, status=status)
    [record] = caplog.records
    assert record.message.endswith(f"answered {status}")


@pytest.mark.parametrize("kind", ["conflict", "mismatch", "not_stored"])
def test_a_refusal_of_a_door_that_is_not_http_is_logged_without_an_http_status(
    caplog: pytest.LogCaptureFixture, kind: EventKind
) -> None:
    with caplog.at_level(logging.INFO, logger="idempotency_middleware"):
        Reporter(None, http=False).report(Attempt(), kind)
    [record] = caplog.records
    assert "answered" not in record.message
    assert record.message.endswith("refused without running")


def test_a_key_reused_with_other_arguments_of_a_function_is_logged_without_an_http_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @idempotent(store=MemoryStore(), key="key")
    def charge(key: str, amount: int) -> int:
        return amount

    charge("k-1", 5)
    with (
        caplog.at_level(logging.INFO, logger="idempotency_middleware"),
        pytest.raises(KeyReusedError),
    ):
        charge("k-1", 6)
    [record] = [r for r in caplog.records if r.__dict__.get("idempotency_event") == "mismatch"]
    assert record.message == (
        "idempotency key reused with different input; refused without running"
    )


def test_a_key_reused_with_another_message_of_a_consumer_is_logged_without_an_http_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handle(message: dict[str, int | str]) -> int | str:
        return message["amount"]

    consumer = IdempotentConsumer(handle, key=lambda message: message["key"], store=MemoryStore())
    consumer.process({"key": "k-1", "amount": 5})
    with caplog.at_level(logging.INFO, logger="idempotency_middleware"):
        consumer.process({"key": "k-1", "amount": 6})
    [record] = [r for r in caplog.records if r.__dict__.get("idempotency_event") == "mismatch"]
    assert "answered" not in record.message


def test_an_event_takes_its_fields_in_order_with_their_defaults() -> None:
    # Its __init__ is written out (cheaper than the generated one): it must stay the
    # dataclass's, field for field.
    parameters = list(inspect.signature(IdempotencyEvent).parameters.values())
    fields = dataclasses.fields(IdempotencyEvent)
    assert [p.name for p in parameters] == [f.name for f in fields]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_an_event_built_by_position_equals_one_built_by_keyword_and_stays_frozen() -> None:
    by_position = IdempotencyEvent("replayed", "a1b2", "POST", "/orders/5", 201)
    by_keyword = IdempotencyEvent(
        kind="replayed", key_hash="a1b2", method="POST", route="/orders/5", status=201
    )

    assert by_position == by_keyword
    assert hash(by_position) == hash(by_keyword)
    assert dataclasses.replace(by_position, status=200).status == 200
    assert dataclasses.asdict(by_position)["route_label"] == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        by_position.status = 500  # type: ignore[misc]
