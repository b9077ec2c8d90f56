"""Observability: the ``on_event`` hook and the structured logs, on both adapters and both
stores, through real servers. Keys and scope values never appear in clear."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from idempotency_middleware import IdempotencyEvent, scope_by_header
from idempotency_middleware.testing import FakeClock
from tests.support.apps import POST_SLOW
from tests.support.servers import Harness

SECRET_SCOPE = "api-key-that-must-not-leak"


class Recorder:
    def __init__(self) -> None:
        self.events: list[IdempotencyEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: IdempotencyEvent) -> None:
        with self._lock:
            self.events.append(event)

    def kinds(self) -> list[str]:
        with self._lock:
            return [event.kind for event in self.events]

    def wait_for(self, kind: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while kind not in self.kinds():
            assert time.monotonic() < deadline, f"no {kind!r} event in {self.kinds()}"
            time.sleep(0.02)


def test_each_outcome_is_reported_as_a_typed_event(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    client = harness.serve(on_event=recorder, scope=scope_by_header("X-Api-Key"))
    key = f"event-key-{uuid.uuid4()}"
    headers = {"Idempotency-Key": key, "X-Api-Key": SECRET_SCOPE}
    caplog.set_level(logging.DEBUG, logger="idempotency_middleware")

    assert client.post("/orders", json={"a": 1}, headers=headers).status_code == 201
    assert client.post("/orders", json={"a": 1}, headers=headers).status_code == 201
    assert client.post("/orders", json={"a": 2}, headers=headers).status_code == 422
    assert client.post("/fail", headers=headers).status_code == 500

    recorder.wait_for("released")
    assert recorder.kinds()[:4] == ["claimed", "completed", "replayed", "mismatch"]
    assert recorder.kinds()[4:] == ["claimed", "released"]
    completed = recorder.events[1]
    assert completed.status == 201
    assert completed.method == "POST"
    assert completed.route == "/orders"
    assert completed.key_hash == recorder.events[0].key_hash
    assert recorder.events[0].store_latency_ms is not None
    # Nothing a client sent is in an event or a log line in clear.
    logged = " ".join(
        f"{record.getMessage()} {vars(record)}"
        for record in caplog.records
        if record.name == "idempotency_middleware"
    )
    assert "idempotency_key_hash" in logged
    for event in recorder.events:
        assert key not in repr(event)
        assert SECRET_SCOPE not in repr(event)
    assert key not in logged
    assert SECRET_SCOPE not in logged


def test_a_conflict_is_reported(harness: Harness) -> None:
    recorder = Recorder()
    client = harness.serve(on_event=recorder)
    key = f"conflict-{uuid.uuid4()}"
    gate = harness.state.arm_gate()
    first = threading.Thread(
        target=client.post, args=("/slow",), kwargs={"headers": {"Idempotency-Key": key}}
    )
    first.start()
    try:
        assert harness.state.wait_for_calls(POST_SLOW, 1)
        assert client.post("/slow", headers={"Idempotency-Key": key}).status_code == 409
    finally:
        gate.set()
        first.join(10)
    assert "conflict" in recorder.kinds()
    conflict = next(event for event in recorder.events if event.kind == "conflict")
    assert conflict.status == 409


LOCK_SECONDS = 0.3


def test_a_take_over_is_reported(harness: Harness) -> None:
    recorder = Recorder()
    key = f"takeover-{uuid.uuid4()}"
    # Both servers read one clock, which only the test moves: no time passes while the first
    # owner's claim is in flight, so it always runs on a whole lease.
    clock = FakeClock(time.time())
    # The first owner's renewals never reach the store: it is as good as dead.
    owner = harness.client(
        harness.start(lock_timeout_seconds=LOCK_SECONDS, renewals_cut_off=True, clock=clock)
    )
    # (One clock: no skew margin, so the lock crossed is stale at once.)
    client = harness.serve(
        on_event=recorder, lock_timeout_seconds=LOCK_SECONDS, clock_skew_seconds=0, clock=clock
    )
    gate = harness.state.arm_gate()
    first = threading.Thread(
        target=owner.post, args=("/slow",), kwargs={"headers": {"Idempotency-Key": key}}
    )
    first.start()
    try:
        assert harness.state.wait_for_calls(POST_SLOW, 1)
        clock.advance(LOCK_SECONDS + 0.1)  # past the first owner's lock
        response = client.post("/slow", headers={"Idempotency-Key": key})
    finally:
        gate.set()
        first.join(10)
    assert response.status_code == 201
    assert recorder.kinds() == ["taken_over", "completed"]
