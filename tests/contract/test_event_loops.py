"""``AsyncDynamoDBStore`` works on whatever event loop uses it.

An aiobotocore client only works on the loop it was made on. The README's create-table
snippet, ``asyncio.run(store.create_table())``, used to leave the store holding a client of
a closed loop, and every request of the server given that store afterwards answered 503
("Event loop is closed"). The store now keeps one client per loop: a new loop gets a new
client, and a loop's client is closed with the loop (``asyncio.run`` closes it on its way
out) or, for a loop closed without that, released without I/O; no "Unclosed client session"
or "Unclosed connector" warning either way.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware
from idempotency_middleware.stores.kit import finish_without_loop as _finish_without_loop
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest, Completion
from idempotency_middleware.stores.records import StoredResponse
from tests.conftest import REGION
from tests.support.faultproxy import Workload
from tests.support.servers import serve_asgi


@pytest.fixture
def no_unclosed(caplog: pytest.LogCaptureFixture) -> Iterator[list[warnings.WarningMessage]]:
    """Fails the test if anything reports an unclosed aiohttp session, connector or transport
    (a ResourceWarning, or asyncio's "Unclosed ..." error log), up to a full collection.

    Earlier tests' garbage is collected before the recording starts: a worker's previous
    files left moto's request bodies and an event loop unreferenced, and their warnings,
    raised by this test's collection, failed it (a worker runs files in varying company)."""
    gc.collect()
    with (
        warnings.catch_warnings(record=True) as caught,
        caplog.at_level(logging.ERROR, logger="asyncio"),
    ):
        warnings.simplefilter("always")
        yield caught
        gc.collect()
    unclosed = [str(warning.message) for warning in caught if "nclosed" in str(warning.message)]
    logged = [record.getMessage() for record in caplog.records if "nclosed" in record.getMessage()]
    assert unclosed == [] and logged == [], (unclosed, logged)


def new_store(moto_endpoint: str, table: str) -> AsyncDynamoDBStore:
    return AsyncDynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION)


def test_a_store_used_by_asyncio_run_then_served_by_uvicorn_answers_and_replays(
    moto_endpoint: str, no_unclosed: list[warnings.WarningMessage]
) -> None:
    table = f"loops-{uuid.uuid4().hex[:8]}"
    store = new_store(moto_endpoint, table)
    asyncio.run(store.create_table())  # as the README's create-table snippet does
    workload = Workload()
    app = IdempotencyMiddleware(workload.asgi, store=store)
    with (
        serve_asgi(app, on_shutdown=store.aclose) as url,
        httpx.Client(base_url=url, trust_env=False, timeout=15) as client,
    ):
        answers = [
            client.post("/ok", content=b"{}", headers={"Idempotency-Key": f'"{key}"'})
            for key in ("first", "second", "first", "second")
        ]
    assert [answer.status_code for answer in answers] == [201, 201, 201, 201]
    assert answers[2].content == answers[0].content  # replayed, not run again
    assert answers[3].content == answers[1].content
    assert workload.runs("/ok") == 2


async def claim_and_complete(store: AsyncDynamoDBStore, key: str) -> Any:
    """One claim and completion on the running loop; the client the store used for them."""
    now = time.time()
    assert await store.aclaim(ClaimRequest(key, "fp", "owner", now, 30)) == Claimed()
    response = StoredResponse(201, [], b"{}")
    assert await store.acomplete(Completion(key, "owner", now, 60, response))
    record = await store.aget(key)
    assert record is not None and record.response == response
    return await store.client()


def test_loops_in_sequence_each_get_a_client_and_async_with_closes_the_last(
    moto_endpoint: str, dynamodb_table: str, no_unclosed: list[warnings.WarningMessage]
) -> None:
    store = new_store(moto_endpoint, dynamodb_table)
    first = asyncio.run(claim_and_complete(store, "loop-1"))
    second = asyncio.run(claim_and_complete(store, "loop-2"))
    assert first is not second

    async def with_block() -> tuple[Any, Any]:
        async with store:
            client = await claim_and_complete(store, "loop-3")
            assert await store.client() is client  # one client per loop, reused
        return client, store._transport.clients.values()

    third, after_exit = asyncio.run(with_block())
    assert third is not second
    assert after_exit == []  # closed by the async with


def test_a_loop_closed_without_shutdown_does_not_strand_the_store(
    moto_endpoint: str, dynamodb_table: str, no_unclosed: list[warnings.WarningMessage]
) -> None:
    store = new_store(moto_endpoint, dynamodb_table)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(claim_and_complete(store, "manual-1"))
    loop.close()  # no shutdown_asyncgens: nothing closed the client on its loop
    asyncio.run(claim_and_complete(store, "manual-2"))


def test_loops_on_two_threads_use_the_store_at_the_same_time(
    moto_endpoint: str, dynamodb_table: str, no_unclosed: list[warnings.WarningMessage]
) -> None:
    store = new_store(moto_endpoint, dynamodb_table)
    start = threading.Barrier(2, timeout=60)
    clients: dict[str, Any] = {}
    failures: list[BaseException] = []

    def worker(name: str) -> None:
        async def calls() -> None:
            start.wait(10)
            for number in range(5):
                clients[name] = await claim_and_complete(store, f"{name}-{number}")

        try:
            asyncio.run(calls())
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert clients["a"] is not clients["b"]


def test_aclose_on_a_new_loop_releases_the_clients_of_closed_ones(
    moto_endpoint: str, dynamodb_table: str, no_unclosed: list[warnings.WarningMessage]
) -> None:
    store = new_store(moto_endpoint, dynamodb_table)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(claim_and_complete(store, "aclose-1"))
    loop.close()
    asyncio.run(store.aclose())
    assert store._transport.clients.values() == []


class Pending:
    """Awaited, it yields itself, as an asyncio future does until its loop resolves it."""

    def __await__(self) -> Any:
        yield self


async def waits_for_a_future() -> None:
    await Pending()


async def raises() -> None:
    raise RuntimeError("Event loop is closed")


def test_closing_without_a_loop_gives_up_on_what_needs_one() -> None:
    for needs_a_loop in (waits_for_a_future(), raises()):
        assert _finish_without_loop(needs_a_loop) is False
        assert inspect.getcoroutinestate(needs_a_loop) == inspect.CORO_CLOSED  # not pending
