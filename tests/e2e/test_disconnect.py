"""Client disconnects and cancellation (issue 5), through real servers.

- A client that goes away mid-handler does not stop the result from being stored: uvicorn
  does not cancel the app when its client disconnects, the middleware buffers the response,
  completes the key, and the server drops the bytes nobody reads. The retry gets the replay.
- A cancelled app task (here: a deadline wrapper around the middleware that cancels it with
  ``asyncio.wait_for``) leaves the key released, as for an exception: nothing was stored,
  so a retry runs the handler again. This is the documented behaviour: a cancelled handler
  may or may not have done its work, and the middleware cannot tell which.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    MemoryStore,
)
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.records import Record, Status
from idempotency_middleware.web.asgi import ASGIApp, Message, Receive, Scope, Send
from tests.support.faultproxy import (
    CLIENT_TIMEOUT_SECONDS,
    REGION,
    Adapter,
    Events,
    FaultProxy,
    Workload,
    serve_workload,
    wait_until,
)
from tests.support.servers import serve_asgi

StoreKind = Literal["memory", "dynamodb"]
DISCONNECT_COMBOS = [("asgi", "memory"), ("asgi", "dynamodb"), ("wsgi", "memory")]
HANDLER_SECONDS = 1.0


def unique_key(label: str) -> str:
    return f"{label}-{time.time_ns()}"


@contextlib.contextmanager
def store_for(
    adapter: Adapter, store_kind: StoreKind, request: pytest.FixtureRequest
) -> Iterator[tuple[Any, Callable[[str], Record | None]]]:
    """A store for the adapter, and a way to read a record as stored."""
    if store_kind == "memory":
        memory = MemoryStore()
        yield memory, memory.get
        return
    moto_endpoint: str = request.getfixturevalue("moto_endpoint")
    table: str = request.getfixturevalue("dynamodb_table")

    def read(hashed: str) -> Record | None:
        with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as direct:
            return direct.get(hashed)

    if adapter == "asgi":
        yield AsyncDynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION), read
    else:
        with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as sync:
            yield sync, read


def on_shutdown_for(store: Any) -> Any:
    return store.aclose if isinstance(store, AsyncDynamoDBStore) else None


@pytest.mark.parametrize(
    ("adapter", "store_kind"), DISCONNECT_COMBOS, ids=["-".join(c) for c in DISCONNECT_COMBOS]
)
def test_a_client_that_disconnects_mid_handler_still_gets_its_result_stored(
    adapter: Adapter, store_kind: StoreKind, request: pytest.FixtureRequest
) -> None:
    key = unique_key("disconnect")
    target = f"/sleep?seconds={HANDLER_SECONDS}"
    with (
        store_for(adapter, store_kind, request) as (store, read),
        serve_workload(adapter, store, on_shutdown=on_shutdown_for(store)) as served,
    ):
        # A raw connection, closed once the handler is running: a client that gave up.
        with socket.create_connection(("127.0.0.1", urlsplit(served.url).port or 80)) as raw:
            raw.sendall(
                f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: {key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".encode()
            )
            served.workload.wait_for_runs("/sleep", 1)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert served.workload.finished("/sleep") == 0, "the handler should still be running"

        wait_until(lambda: bool(served.events.of("completed")), 10, "never completed")
        record = read(storage_key("POST", "/sleep", None, key))
        assert record is not None and record.status is Status.COMPLETED

        retry = served.post(target, key, body=b"{}")
        assert retry.status_code == 201
        assert retry.headers.get("idempotent-replayed") == "true"
        assert retry.json() == {"path": "/sleep", "run": 1}
        assert served.workload.runs("/sleep") == 1


def with_deadline(app: ASGIApp) -> ASGIApp:
    """Cancel ``app`` after the seconds in an ``X-Deadline`` header, then answer 504 — as a
    timeout middleware or a server cancelling its request tasks would."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        deadline = dict(scope.get("headers", [])).get(b"x-deadline")
        if scope["type"] != "http" or deadline is None:
            await app(scope, receive, send)
            return
        try:
            await asyncio.wait_for(app(scope, receive, send), float(deadline))
        except TimeoutError:
            body = b"deadline exceeded"
            start: Message = {
                "type": "http.response.start",
                "status": 504,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
            await send(start)
            await send({"type": "http.response.body", "body": body})

    return wrapped


@pytest.mark.parametrize("store_kind", ["memory", "dynamodb"])
def test_a_cancelled_app_task_releases_the_key_so_a_retry_runs_again(
    store_kind: StoreKind, request: pytest.FixtureRequest
) -> None:
    key = unique_key("cancelled")
    target = "/first-sleep?seconds=5"
    workload = Workload()
    events = Events()
    hashed = storage_key("POST", "/first-sleep", None, key)
    with store_for("asgi", store_kind, request) as (store, read):
        middleware = IdempotencyMiddleware(
            workload.asgi, store=store, on_event=events, lock_timeout_seconds=30
        )
        with (
            serve_asgi(with_deadline(middleware), on_shutdown=on_shutdown_for(store)) as url,
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS) as client,
        ):
            # Warm the store's client up, so the claim below is quick even on a loaded machine.
            warm = {"Idempotency-Key": unique_key("warm-up"), "Content-Type": "application/json"}
            assert client.post("/ok", content=b"{}", headers=warm).status_code == 201
            headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
            cancelled = client.post(target, content=b"{}", headers={**headers, "X-Deadline": "1.0"})
            assert cancelled.status_code == 504
            assert workload.runs("/first-sleep") == 1
            assert workload.finished("/first-sleep") == 1  # its finally ran: cancelled

            # Released, not left claimed for its 30 s lock, and nothing stored.
            assert [event.key_hash for event in events.of("released")] == [hashed]
            assert read(hashed) is None

            retry = client.post(target, content=b"{}", headers=headers)
            assert retry.status_code == 201
            assert retry.headers.get("idempotent-replayed") is None
            assert retry.json() == {"path": "/first-sleep", "run": 2}
            assert workload.runs("/first-sleep") == 2

            replay = client.post(target, content=b"{}", headers=headers)
            assert replay.headers.get("idempotent-replayed") == "true"
            assert replay.json() == {"path": "/first-sleep", "run": 2}


def test_a_task_cancelled_while_its_claim_is_in_flight_leaves_the_key_free(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    """The deadline cancels the task while its claim (a PutItem the proxy delays) is on the
    wire; the PutItem still lands. README: "app task cancelled: nothing stored, the claim is
    released". The retry should run the handler, not get 409 for the whole 30 s lock.
    See BUGS-reliability.md, item 3."""
    workload = Workload()
    key = unique_key("cancelled-claim")
    with FaultProxy(moto_endpoint) as proxy:
        store = AsyncDynamoDBStore(dynamodb_table, endpoint_url=proxy.url, region_name=REGION)
        middleware = IdempotencyMiddleware(workload.asgi, store=store, lock_timeout_seconds=30)
        with (
            serve_asgi(with_deadline(middleware), on_shutdown=store.aclose) as url,
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS) as client,
        ):
            warm = {"Idempotency-Key": unique_key("warm-up"), "Content-Type": "application/json"}
            assert client.post("/ok", content=b"{}", headers=warm).status_code == 201
            headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
            proxy.forget()
            proxy.set("delay", operations={"PutItem"}, count=1, delay_ms=800)
            cancelled = client.post("/ok", content=b"{}", headers={**headers, "X-Deadline": "0.2"})
            assert cancelled.status_code == 504
            assert workload.runs("/ok") == 1  # the warm-up only: cancelled during the claim
            # Landed: moto answered it. (Polling the table for it could miss it: the
            # background release may delete it within a moment of its landing.)
            wait_until(lambda: "PutItem" in proxy.answered(), 10, "the delayed claim never landed")

            deadline = time.monotonic() + 3  # a tenth of the lock
            while (retry := client.post("/ok", content=b"{}", headers=headers)).status_code == 409:
                assert time.monotonic() < deadline, "the cancelled claim still holds the key"
                time.sleep(0.2)
            assert retry.status_code == 201
            assert retry.json() == {"path": "/ok", "run": 2}


async def test_a_client_gone_before_its_body_arrived_claims_nothing() -> None:
    """In-process: the server reports ``http.disconnect`` while the body is read."""
    store = MemoryStore()
    workload = Workload()
    app = IdempotencyMiddleware(workload.asgi, store=store)
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/ok",
        "raw_path": b"/ok",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"idempotency-key", b"gone"), (b"content-length", b"100")],
    }
    messages: list[Message] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent == []
    assert workload.runs("/ok") == 0
    assert len(store) == 0
