"""Store faults (issue 5), on both adapters: ASGI on uvicorn with ``AsyncDynamoDBStore``,
WSGI on waitress with ``DynamoDBStore``.

The store talks to moto through ``FaultProxy``, which refuses, hangs, throttles, answers 5xx,
cuts or delays DynamoDB requests on demand. The stores keep their default retry
configuration (``max_attempts=2``: botocore re-sends a failed call once), as deployed, with
short timeouts; only the tests of the middleware's own finishing retries use one attempt per
call (see ``ONE_ATTEMPT``). The rules under test:

- the claim fails: 503 + ``Retry-After`` within a bounded time, handler not run; a claim
  that landed with every answer lost is released; with ``on_store_error="run"`` the handler
  runs unprotected and an ERROR is logged (a claim re-sent after a lost answer, the first
  answer lost and the second received, is tests/e2e/test_lease_defects.py's);
- complete fails after the handler ran: the client still gets the handler's response, an
  ERROR ``store_error`` event names the key hash, the key stays claimed (409) until its lock
  expires, then a retry runs the handler again;
- release fails (the handler answered 5xx): the client gets the 5xx, same discipline;
- a finishing write whose answer was lost and that botocore re-sent: the write landed once,
  and the key behaves as if the first answer had arrived.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore
from idempotency_middleware.engine.decisions import FINISH_ATTEMPTS
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS
from idempotency_middleware.stores.protocol import ClaimRequest, StoreUnavailable
from idempotency_middleware.stores.records import Status
from idempotency_middleware.testing import FakeClock
from tests.conftest import new_table
from tests.support.faultproxy import (
    CLIENT_TIMEOUT_SECONDS,
    REGION,
    Adapter,
    FaultProxy,
    Mode,
    Served,
    serve_through_proxy,
    wait_until,
)

ADAPTERS: tuple[Adapter, ...] = ("asgi", "wsgi")

# Short timeouts keep every fault fast; retries stay the stores' default (max_attempts=2).
TIMEOUT_SECONDS = 1.0
DEFAULT_MAX_ATTEMPTS = 2
FAST: dict[str, Any] = {"connect_timeout": TIMEOUT_SECONDS, "read_timeout": TIMEOUT_SECONDS}
# For the tests of the middleware's own finishing retries (complete, release): one attempt per
# store call, so the attempts counted are the middleware's, and giving up takes well under the
# short lock (botocore's re-sends, each after up to a second of backoff, would outlast it).
# (A breaker that never opens: a completion refused for the seconds it is retried would
# open it, and the test's next claim would get its 503, not the held key's 409.)
ONE_ATTEMPT: dict[str, Any] = {**FAST, "max_attempts": 1, "breaker_threshold": 1_000}
# A claim against a store that never answers gives up after its attempts' read timeouts (and
# botocore's backoff, up to 1 s); the bound leaves room for a loaded machine.
CLAIM_FAILURE_BOUND_SECONDS = 4.0
# The lock of the tests whose claim outlives a failed finishing write; the server's clock is
# a FakeClock they move past it, so no time passes on it while the handler runs.
LOCK_SECONDS = 3.0


@contextlib.contextmanager
def serve(
    adapter: Adapter,
    table: str,
    proxy: FaultProxy,
    *,
    store_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> Iterator[Served]:
    """``serve_through_proxy`` with short timeouts (``FAST``) unless ``store_kwargs`` says
    otherwise."""
    with serve_through_proxy(
        adapter, table, proxy, store_kwargs=store_kwargs or FAST, **options
    ) as served:
        yield served


@pytest.fixture(scope="module")
def dynamodb_table(moto_endpoint: str) -> str:
    """One table for the module (every test uses its own keys)."""
    return new_table(moto_endpoint, "faults")


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:
    return fault_proxy


def key_hash(path: str, key: str) -> str:
    return storage_key("POST", path, None, key)


def unique_key(label: str) -> str:
    return f"{label}-{time.time_ns()}"


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = orjson.loads(response.content)
    assert problem["status"] == status
    assert {"type", "title", "status", "detail"} <= problem.keys()
    return problem


def stored_record_lock(moto_endpoint: str, table: str, hashed: str) -> float:
    """The in-progress record's ``lock_expires_at``, read straight from moto."""
    with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as direct:
        record = direct.get(hashed)
    assert record is not None, "the claim should still be stored"
    assert record.status is Status.IN_PROGRESS
    return record.lock_expires_at


def retried_past_the_lock(
    served: Served, path: str, key: str, lock_expires_at: float, clock: FakeClock
) -> httpx.Response:
    """Retries of a key whose claim stays: refused (409, Retry-After) up to the end of the
    lock and the door's clock-skew margin, by the server's clock; the response of the first
    retry past it (which runs the handler again)."""
    stale_at = lock_expires_at + DEFAULT_CLOCK_SKEW_SECONDS
    at_once = served.post(path, key)
    clock.advance(stale_at - 0.01 - clock.now())
    at_the_edge = served.post(path, key)
    for held in (at_once, at_the_edge):
        assert_problem(held, 409)
        assert int(held.headers["retry-after"]) >= 1
    clock.advance(0.02)
    return served.post(path, key)


# --- the claim fails -------------------------------------------------------------------------


# (A hanging store is the next test's, with two attempts.)
CLAIM_FAULTS: tuple[Mode, ...] = ("refuse", "throttle", "error", "cut")


@pytest.mark.parametrize("fault", CLAIM_FAULTS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_failing_claim_answers_503_with_retry_after_and_does_not_run_the_handler(
    adapter: Adapter, fault: Mode, proxy: FaultProxy, dynamodb_table: str
) -> None:
    key = unique_key("claim")
    with serve(adapter, dynamodb_table, proxy) as served:
        proxy.set(fault)
        started = time.monotonic()
        response = served.post("/ok", key)
        elapsed = time.monotonic() - started

        problem = assert_problem(response, 503)
        assert int(response.headers["retry-after"]) >= 1
        assert key not in problem["detail"]
        assert elapsed < CLAIM_FAILURE_BOUND_SECONDS
        assert served.workload.runs("/ok") == 0
        [error] = served.events.of("store_error", "claim")
        assert error.key_hash == key_hash("/ok", key)
        if fault == "throttle":
            assert error.error is not None and "ThrottlingException" in error.error
        if fault != "refuse":  # (a refused connection is reset before its request is read)
            assert proxy.operations().count("PutItem") == DEFAULT_MAX_ATTEMPTS

        if fault == "cut":
            # The claim reached the store: the next test checks its release. The store is
            # back for the middleware's background release, so that the server stops at once
            # instead of waiting out that release's retries against a cut store.
            proxy.set("pass")
            return
        # Nothing was claimed: once the store is back, the same key runs normally.
        proxy.set("pass")
        assert served.post("/ok", key).status_code == 201
        assert served.workload.runs("/ok") == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_claim_whose_answers_were_all_lost_is_released_so_a_retry_runs_long_before_its_lock(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str, moto_endpoint: str
) -> None:
    """The PutItem landed but its response was cut, and so was the response to botocore's
    re-send: the client gets 503, and the middleware releases the claim it may hold (fenced
    by its owner token, in the background), so the retry runs the handler at once instead of
    getting 409 for a whole lock timeout."""
    key = unique_key("cut")
    hashed = key_hash("/ok", key)
    long_lock = 60.0
    with serve(adapter, dynamodb_table, proxy, lock_timeout_seconds=long_lock) as served:
        proxy.set("cut", operations={"PutItem"}, count=DEFAULT_MAX_ATTEMPTS)
        failed_at = time.monotonic()
        assert_problem(served.post("/ok", key), 503)
        assert served.workload.runs("/ok") == 0
        claims = [seen.fault for seen in proxy.seen() if seen.operation == "PutItem"]
        assert claims == ["cut"] * DEFAULT_MAX_ATTEMPTS

        wait_until(
            lambda: "DeleteItem" in proxy.operations(), 10, "the lost claim was never released"
        )
        with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as db:
            wait_until(lambda: db.get(hashed) is None, 10, "the lost claim is still stored")
        retry = served.post("/ok", key)
        assert retry.status_code == 201
        assert retry.json() == {"path": "/ok", "run": 1}
        assert time.monotonic() - failed_at < long_lock / 4
        assert served.workload.runs("/ok") == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_claim_against_a_hanging_store_is_bounded_by_its_timeouts_and_attempts(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    """The default ``max_attempts=2``: two PutItems reach the wire, each given up after the
    read timeout, then 503 (within two timeouts plus botocore's backoff and some slack)."""
    with serve(adapter, dynamodb_table, proxy) as served:
        proxy.set("hang")
        started = time.monotonic()
        response = served.post("/ok", unique_key("bounded"))
        elapsed = time.monotonic() - started
        assert_problem(response, 503)
        assert int(response.headers["retry-after"]) >= 1
        assert 2 * TIMEOUT_SECONDS <= elapsed < 2 * TIMEOUT_SECONDS + CLAIM_FAILURE_BOUND_SECONDS
        assert proxy.operations().count("PutItem") == DEFAULT_MAX_ATTEMPTS
        assert served.workload.runs("/ok") == 0
        assert len(served.events.of("store_error", "claim")) == 1
        # The store is back for the background release of the claim the middleware may
        # hold, so that the server stops without waiting out its retries against the hang.
        proxy.set("pass")


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_fail_open_runs_the_handler_and_logs_an_error(
    adapter: Adapter,
    proxy: FaultProxy,
    dynamodb_table: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="idempotency_middleware")
    key = unique_key("fail-open")
    with serve(adapter, dynamodb_table, proxy, on_store_error="run") as served:
        proxy.set("refuse")
        first = served.post("/ok", key)
        assert first.status_code == 201
        assert first.json()["run"] == 1
        assert [event.key_hash for event in served.events.of("fail_open")] == [key_hash("/ok", key)]
        assert served.events.of("store_error", "claim")
        fail_open_logs = [
            record
            for record in caplog.records
            if getattr(record, "idempotency_event", None) == "fail_open"
        ]
        assert fail_open_logs and all(log.levelno == logging.ERROR for log in fail_open_logs)

        # Unprotected means unprotected: nothing was stored, so a retry runs it again.
        second = served.post("/ok", key)
        assert second.status_code == 201
        assert served.workload.runs("/ok") == 2


# --- complete fails after the handler ran -----------------------------------------------------


@pytest.mark.parametrize("fault", ["refuse", "throttle"])
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_failing_complete_still_answers_and_holds_the_key_until_its_lock_expires(
    adapter: Adapter,
    fault: Mode,
    proxy: FaultProxy,
    dynamodb_table: str,
    moto_endpoint: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="idempotency_middleware")
    key = unique_key("complete")
    hashed = key_hash("/gate", key)
    clock = FakeClock(time.time())
    with serve(
        adapter,
        dynamodb_table,
        proxy,
        store_kwargs=ONE_ATTEMPT,
        lock_timeout_seconds=LOCK_SECONDS,
        clock=clock,
    ) as served:
        gate = served.workload.arm_gate()
        with ThreadPoolExecutor(1) as pool:
            pending = served.post_in_background(pool, "/gate", key)
            served.workload.wait_for_runs("/gate", 1)
            switched = time.time()
            proxy.set(fault)  # the store goes away while the handler runs
            gate.set()
            first: httpx.Response = pending.result(timeout=CLIENT_TIMEOUT_SECONDS)
        proxy.set("pass")

        # The client gets the handler's response all the same.
        assert first.status_code == 201
        assert first.json() == {"path": "/gate", "run": 1}
        # An ERROR event and log name the key at risk.
        [error] = served.events.of("store_error", "complete")
        assert error.key_hash == hashed
        # Retried for FINISH_SECONDS (the lock is longer), on the fake clock: more than the
        # FINISH_ATTEMPTS a release gets.
        assert error.error is not None
        given_up = re.search(r"gave up after (\d+) attempts", error.error)
        assert given_up is not None and int(given_up.group(1)) > FINISH_ATTEMPTS
        assert not served.events.of("completed")
        assert any(
            getattr(record, "idempotency_key_hash", None) == hashed
            and getattr(record, "idempotency_operation", None) == "complete"
            and record.levelno == logging.ERROR
            for record in caplog.records
        )
        if fault == "throttle":  # (a refused connection is reset before its request is read)
            finishing = [
                seen.fault
                for seen in proxy.seen()
                if seen.operation == "UpdateItem" and not seen.is_renewal and seen.at >= switched
            ]
            assert finishing == ["throttle"] * int(given_up.group(1))

        # The claim stays until its lock expires: 409 first, then the handler runs again.
        lock_expires_at = stored_record_lock(moto_endpoint, dynamodb_table, hashed)
        rerun = retried_past_the_lock(served, "/gate", key, lock_expires_at, clock)
        assert rerun.status_code == 201
        assert rerun.json() == {"path": "/gate", "run": 2}
        assert served.workload.runs("/gate") == 2
        # ... and that run was stored: the next retry is its replay.
        replay = served.post("/gate", key)
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.json() == {"path": "/gate", "run": 2}


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_complete_that_fails_twice_is_retried_and_lands(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    """Throttled twice: botocore's own two attempts, then the middleware's next try lands."""
    key = unique_key("retried")
    with serve(adapter, dynamodb_table, proxy) as served:
        proxy.set("throttle", operations={"UpdateItem"}, count=2)
        first = served.post("/ok", key)
        assert first.status_code == 201
        assert not served.events.of("store_error")
        assert [event.key_hash for event in served.events.of("completed")] == [key_hash("/ok", key)]
        updates = [seen.fault for seen in proxy.seen() if seen.operation == "UpdateItem"]
        assert updates == ["throttle", "throttle", "pass"]

        replay = served.post("/ok", key)
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.content == first.content
        assert served.workload.runs("/ok") == 1


# --- release fails after a 5xx ------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_failing_release_still_answers_the_5xx_and_holds_the_key_until_its_lock_expires(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str, moto_endpoint: str
) -> None:
    key = unique_key("release")
    hashed = key_hash("/gate-fail", key)
    clock = FakeClock(time.time())
    with serve(
        adapter,
        dynamodb_table,
        proxy,
        store_kwargs=ONE_ATTEMPT,
        lock_timeout_seconds=LOCK_SECONDS,
        clock=clock,
    ) as served:
        gate = served.workload.arm_gate()
        with ThreadPoolExecutor(1) as pool:
            pending = served.post_in_background(pool, "/gate-fail", key)
            served.workload.wait_for_runs("/gate-fail", 1)
            proxy.set("refuse")
            gate.set()
            first: httpx.Response = pending.result(timeout=CLIENT_TIMEOUT_SECONDS)
        proxy.set("pass")

        assert first.status_code == 500
        assert first.json() == {"path": "/gate-fail", "run": 1}
        [error] = served.events.of("store_error", "release")
        assert error.key_hash == hashed
        assert not served.events.of("released")

        lock_expires_at = stored_record_lock(moto_endpoint, dynamodb_table, hashed)
        rerun = retried_past_the_lock(served, "/gate-fail", key, lock_expires_at, clock)
        assert rerun.status_code == 500
        assert rerun.json() == {"path": "/gate-fail", "run": 2}


# --- a finishing write re-sent after its answer was lost --------------------------------------


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_complete_whose_lost_answer_botocore_resent_stores_the_response(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    """The completing UpdateItem landed and its answer was cut; botocore's re-send, fenced by
    the owner token, lands again: the response is stored, nothing is reported lost."""
    key = unique_key("complete-resent")
    with serve(adapter, dynamodb_table, proxy) as served:
        proxy.set("cut", operations={"UpdateItem"}, count=1)
        first = served.post("/ok", key)
        assert first.status_code == 201
        updates = [seen.fault for seen in proxy.seen() if seen.operation == "UpdateItem"]
        assert updates == ["cut", "pass"]
        assert not served.events.of("store_error")
        assert not served.events.of("lost")
        assert [event.key_hash for event in served.events.of("completed")] == [key_hash("/ok", key)]

        replay = served.post("/ok", key)
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.content == first.content
        assert served.workload.runs("/ok") == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_release_whose_lost_answer_botocore_resent_frees_the_key_for_a_retry(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    """The releasing DeleteItem (after a 500) landed and its answer was cut; botocore's
    re-send finds nothing to delete. The key is free all the same: a retry runs at once."""
    key = unique_key("release-resent")
    with serve(adapter, dynamodb_table, proxy, lock_timeout_seconds=60.0) as served:
        proxy.set("cut", operations={"DeleteItem"}, count=1)
        first = served.post("/gate-fail", key)
        assert first.status_code == 500
        deletes = [seen.fault for seen in proxy.seen() if seen.operation == "DeleteItem"]
        assert deletes == ["cut", "pass"]

        retry = served.post("/gate-fail", key)
        assert retry.status_code == 500
        assert retry.json() == {"path": "/gate-fail", "run": 2}


# --- a slow store ---------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_slow_store_only_slows_requests_down(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    key = unique_key("slow")
    with serve(adapter, dynamodb_table, proxy) as served:
        proxy.set("delay", delay_ms=150)  # well under the 1 s read timeout
        started = time.monotonic()
        first = served.post("/ok", key)
        assert first.status_code == 201
        assert time.monotonic() - started >= 0.3  # claim and complete, each delayed
        replay = served.post("/ok", key)
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.content == first.content
        assert served.workload.runs("/ok") == 1
        assert not served.events.of("store_error")


# --- the stores' max_attempts -----------------------------------------------------------------


def test_sync_store_max_attempts_is_the_number_of_attempts(
    proxy: FaultProxy, dynamodb_table: str
) -> None:
    """``max_attempts=2`` sends a throttled claim at most twice (README: the claim is bounded
    by about timeout x max_attempts). See BUGS-reliability.md."""
    proxy.set("throttle")
    with (
        DynamoDBStore(
            dynamodb_table, endpoint_url=proxy.url, region_name=REGION, max_attempts=2
        ) as store,
        pytest.raises(StoreUnavailable),
    ):
        store.claim(_claim_request())
    assert proxy.operations().count("PutItem") == 2


async def test_async_store_max_attempts_is_the_number_of_attempts(
    proxy: FaultProxy, dynamodb_table: str
) -> None:
    proxy.set("throttle")
    async with AsyncDynamoDBStore(
        dynamodb_table, endpoint_url=proxy.url, region_name=REGION, max_attempts=2
    ) as store:
        with pytest.raises(StoreUnavailable):
            await store.aclaim(_claim_request())
    assert proxy.operations().count("PutItem") == 2


def _claim_request() -> ClaimRequest:
    return ClaimRequest(
        key_hash=unique_key("attempts"),
        fingerprint="fingerprint",
        owner="owner",
        now=time.time(),
        lock_timeout_seconds=5,
    )
