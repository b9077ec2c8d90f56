"""Regression tests for two defects of a claim's lease, on both adapters (ASGI on uvicorn with
``AsyncDynamoDBStore``, WSGI on waitress with ``DynamoDBStore``), the store talking to moto
through ``FaultProxy``. Requests here are sequential (one owner, then its retries one at a
time), so nothing rests on moto's conditional writes being atomic (they are not:
tests/contract/test_moto_atomicity.py).

1. A slow claim lands with its lease nearly spent, and a live owner is taken over. The lease
   runs from ``now`` taken before the claim is sent; if the owner renews only an interval
   after the claim *returns*, a claim that took most of the lock timeout leaves the lease
   expired while its owner runs, and a retry takes the key over: the handler runs twice. The
   owner must renew by its lease's own deadline (before running, when the lease is nearly
   spent), so every retry during the run gets 409.
2. A claim whose answer was lost and that botocore re-sent (the stores' default
   ``max_attempts=2``) finds its own in-progress record: the condition fails against the
   request's own claim. A held record whose owner token is the request's own is the request's
   claim: the handler runs once, the client gets its response, a retry replays it.

The delay in (1) is real latency injected by the proxy, not a deadline a fake clock could
cross; nothing here sleeps.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import new_table
from tests.support.faultproxy import (
    CLIENT_TIMEOUT_SECONDS,
    Adapter,
    FaultProxy,
    serve_through_proxy,
)

ADAPTERS: tuple[Adapter, ...] = ("asgi", "wsgi")

# (1): a 2 s lock, a claim whose PutItem takes 1.5 s (under the stores' default 2 s read
# timeout), a 1 s handler. The lease runs out 0.5 s into the handler's run.
LOCK_SECONDS = 2.0
SLOW_CLAIM_MS = 1500.0
HANDLER_SECONDS = 1.0
SLOW_PATH = f"/sleep?seconds={HANDLER_SECONDS}"


@pytest.fixture(scope="module")
def dynamodb_table(moto_endpoint: str) -> str:
    """One table for the module (every test uses its own keys)."""
    return new_table(moto_endpoint, "lease")


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:
    return fault_proxy


def unique_key(label: str) -> str:
    return f"{label}-{time.time_ns()}"


def is_replay_of(response: httpx.Response, original: httpx.Response) -> bool:
    return (
        response.status_code == original.status_code
        and response.headers.get("idempotent-replayed") == "true"
        and response.content == original.content
    )


def describe(responses: list[httpx.Response]) -> str:
    """The responses in order, runs of the same answer counted: ``"25 x 409, 201 run 2"``."""
    answers: list[str] = []
    for response in responses:
        answer = str(response.status_code)
        if response.headers.get("idempotent-replayed") == "true":
            answer += " replay"
        if response.status_code == 201:
            answer += f" run {response.json().get('run')}"
        answers.append(answer)
    runs: list[list[Any]] = []
    for answer in answers:
        if runs and runs[-1][1] == answer:
            runs[-1][0] += 1
        else:
            runs.append([1, answer])
    return ", ".join(answer if count == 1 else f"{count} x {answer}" for count, answer in runs)


# --- 1. a slow claim must not leave its live owner open to a take-over --------------------------


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_retries_while_an_owner_runs_after_a_slow_claim_get_409_and_the_handler_runs_once(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    key = unique_key("slow-claim")
    with serve_through_proxy(
        adapter, dynamodb_table, proxy, lock_timeout_seconds=LOCK_SECONDS
    ) as served:
        proxy.set("delay", operations={"PutItem"}, count=1, delay_ms=SLOW_CLAIM_MS)
        with ThreadPoolExecutor(1) as pool:
            pending = served.post_in_background(pool, SLOW_PATH, key)
            served.workload.wait_for_runs("/sleep", 1)
            # The owner runs: its client's retries, one after another, until it answers.
            retries: list[httpx.Response] = []
            deadline = time.monotonic() + CLIENT_TIMEOUT_SECONDS
            while not pending.done() and time.monotonic() < deadline:
                retries.append(served.post(SLOW_PATH, key))
            owner = pending.result(timeout=CLIENT_TIMEOUT_SECONDS)
        after = served.post(SLOW_PATH, key)

        delayed = [seen.fault for seen in proxy.seen() if seen.operation == "PutItem"][:1]
        assert delayed == ["delay"], "the owner's claim was not the delayed PutItem"
        assert owner.status_code == 201
        assert owner.json() == {"path": "/sleep", "run": 1}
        assert served.workload.runs("/sleep") == 1, (
            f"the handler ran {served.workload.runs('/sleep')} times; retries during the "
            f"owner's run got {describe(retries)}; the retry after it {describe([after])}"
        )
        assert retries, "no retry was sent while the owner ran"
        assert all(retry.status_code == 409 or is_replay_of(retry, owner) for retry in retries), (
            describe(retries)
        )
        assert is_replay_of(after, owner), describe([after])


# --- 2. a claim re-sent by botocore after its answer was lost is the request's own -------------


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_claim_whose_lost_answer_botocore_resent_runs_the_handler_and_answers_its_response(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    key = unique_key("resent-claim")
    with serve_through_proxy(adapter, dynamodb_table, proxy) as served:
        proxy.set("cut", operations={"PutItem"}, count=1)
        first = served.post("/ok", key)

        # The stores' default retry configuration re-sent the claim that had landed.
        claims = [seen.fault for seen in proxy.seen() if seen.operation == "PutItem"]
        assert claims == ["cut", "pass"]
        assert first.status_code == 201, f"{first.status_code} {first.text}"
        assert first.json() == {"path": "/ok", "run": 1}
        assert first.headers.get("idempotent-replayed") is None
        assert served.workload.runs("/ok") == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_retry_after_a_claim_whose_lost_answer_botocore_resent_replays_its_response(
    adapter: Adapter, proxy: FaultProxy, dynamodb_table: str
) -> None:
    key = unique_key("resent-claim-retry")
    with serve_through_proxy(adapter, dynamodb_table, proxy) as served:
        proxy.set("cut", operations={"PutItem"}, count=1)
        first = served.post("/ok", key)
        retry = served.post("/ok", key)

        assert [seen.fault for seen in proxy.seen() if seen.operation == "PutItem"][:2] == [
            "cut",
            "pass",
        ]
        assert retry.status_code == 201, (
            f"the key is blocked: the first request got {first.status_code}, "
            f"its retry {retry.status_code} {retry.text}"
        )
        assert retry.headers.get("idempotent-replayed") == "true"
        assert retry.json() == {"path": "/ok", "run": 1}
        assert served.workload.runs("/ok") == 1
