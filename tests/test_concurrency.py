"""Simultaneous duplicates through real servers: the handler runs exactly once.

Each combination is hit by a burst of requests carrying one key to ``POST /sleep`` (a
handler that takes ``SLEEP_SECONDS``): from one ``httpx.AsyncClient`` (many connections on
one event loop) and from a pool of threads with their own ``httpx.Client``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.apps import POST_SLEEP
from tests.servers import CLIENT_TIMEOUT_SECONDS, Harness

BURST = 24
BODY = {"amount": 10, "currency": "EUR"}


def assert_ran_once(harness: Harness, responses: list[httpx.Response]) -> None:
    """One original 201; every other response a 409 with Retry-After or the replay."""
    assert len(responses) == BURST
    statuses = sorted(response.status_code for response in responses)
    assert all(status < 500 for status in statuses), statuses
    originals = [
        response
        for response in responses
        if response.status_code == 201 and "idempotent-replayed" not in response.headers
    ]
    assert len(originals) == 1, statuses
    for response in responses:
        if response is originals[0]:
            continue
        if response.status_code == 409:
            assert response.headers.get("retry-after", "").isdigit(), response.headers
            assert response.headers["content-type"] == "application/problem+json"
        else:
            assert response.status_code == 201, response.text
            assert response.headers.get("idempotent-replayed") == "true"
            assert response.content == originals[0].content
    assert harness.calls(POST_SLEEP) == 1


async def test_simultaneous_duplicates_from_async_clients_run_the_handler_once(
    harness: Harness,
) -> None:
    url = harness.start()
    headers = {"Idempotency-Key": f"burst-{uuid.uuid4()}"}
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)

    async with httpx.AsyncClient(
        base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS, limits=limits
    ) as client:
        responses = await asyncio.gather(
            *(client.post("/sleep", json=BODY, headers=headers) for _ in range(BURST))
        )

    assert_ran_once(harness, list(responses))


def test_simultaneous_duplicates_from_threads_run_the_handler_once(harness: Harness) -> None:
    url = harness.start()
    headers = {"Idempotency-Key": f"burst-{uuid.uuid4()}"}
    barrier = threading.Barrier(BURST)

    def send() -> httpx.Response:
        with httpx.Client(base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS) as client:
            barrier.wait(timeout=10)
            return client.post("/sleep", json=BODY, headers=headers)

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        responses = list(pool.map(lambda _: send(), range(BURST)))

    assert_ran_once(harness, responses)
