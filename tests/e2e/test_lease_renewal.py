"""Lease renewal (issue 5): a slow but alive owner keeps its claim; renewal stops when the
handler ends, raises or is cancelled; an ASGI owner whose event loop is blocked stops
renewing and is taken over by another server sharing the store.

Renewals are counted with an instrumented ``MemoryStore`` or, for DynamoDB, on the wire (the
``UpdateItem`` requests setting ``lock_expires_at`` that pass through ``FaultProxy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    MemoryStore,
)
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.records import Status
from idempotency_middleware.testing import FakeClock
from tests.support.faultproxy import (
    CLIENT_TIMEOUT_SECONDS,
    REGION,
    Adapter,
    Events,
    FaultProxy,
    Served,
    Workload,
    serve_workload,
)

StoreKind = Literal["memory", "dynamodb"]
COMBOS = [
    ("asgi", "memory"),
    ("asgi", "dynamodb"),
    ("wsgi", "memory"),
    ("wsgi", "dynamodb"),
]

# Renewed every LOCK / 3 = 0.25 s.
LOCK_SECONDS = 0.75
# A lock on a FakeClock: the renewers tick every third of it in real time.
FAKE_LOCK_SECONDS = 0.3


class CountingMemoryStore(MemoryStore):
    """A ``MemoryStore`` that records each renewal: when it was asked for, whether it held."""

    def __init__(self) -> None:
        super().__init__()
        self._renewals_lock = threading.Lock()
        self._attempts: list[tuple[float, bool]] = []

    def renew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        asked = time.time()
        renewed = super().renew(key, owner, lock_expires_at)
        with self._renewals_lock:
            self._attempts.append((asked, renewed))
        return renewed

    def renewals(self) -> list[float]:
        """When every renewal was asked for, whether it held or not."""
        with self._renewals_lock:
            return [asked for asked, _ in self._attempts]

    def extensions(self) -> list[float]:
        """When each renewal that extended the lock was asked for."""
        with self._renewals_lock:
            return [asked for asked, renewed in self._attempts if renewed]


@dataclass
class Renewing:
    """A served workload and a way to count the renewals its store received."""

    served: Served
    renewals: Callable[[], list[float]]


def unique_key(label: str) -> str:
    return f"{label}-{time.time_ns()}"


@contextlib.contextmanager
def serve_renewing(
    adapter: Adapter,
    store_kind: StoreKind,
    request: pytest.FixtureRequest,
    **options: Any,
) -> Iterator[Renewing]:
    """Serve the workload on ``adapter`` with ``store_kind``; DynamoDB goes through a proxy
    so renewals can be counted on the wire."""
    if store_kind == "memory":
        memory = CountingMemoryStore()

        with serve_workload(adapter, memory, **options) as served:
            yield Renewing(served, memory.renewals)
        return

    moto_endpoint: str = request.getfixturevalue("moto_endpoint")
    table: str = request.getfixturevalue("dynamodb_table")

    with FaultProxy(moto_endpoint) as proxy:

        def wire_renewals() -> list[float]:
            return [seen.at for seen in proxy.renewals()]

        if adapter == "asgi":
            async_store = AsyncDynamoDBStore(table, endpoint_url=proxy.url, region_name=REGION)
            with serve_workload(
                adapter, async_store, on_shutdown=async_store.aclose, **options
            ) as served:
                yield Renewing(served, wire_renewals)
        else:
            with (
                DynamoDBStore(table, endpoint_url=proxy.url, region_name=REGION) as sync_store,
                serve_workload(adapter, sync_store, **options) as served,
            ):
                yield Renewing(served, wire_renewals)


def wait_for_more(count: Callable[[], int], than: int, what: str) -> None:
    """Poll (real time) until ``count()`` exceeds ``than``: the renewers tick on real time."""
    deadline = time.monotonic() + CLIENT_TIMEOUT_SECONDS
    while count() <= than:
        assert time.monotonic() < deadline, f"no {what} within {CLIENT_TIMEOUT_SECONDS} s"
        time.sleep(0.01)


@pytest.mark.parametrize(("adapter", "store_kind"), COMBOS, ids=["-".join(c) for c in COMBOS])
def test_a_handler_running_three_lock_timeouts_is_not_taken_over(
    adapter: Adapter, store_kind: StoreKind, request: pytest.FixtureRequest
) -> None:
    key = unique_key("slow")
    path = "/gate"
    # The server's time is a FakeClock the test moves one renewal interval at a time; its
    # renewer still ticks on real time (every third of the lock) and renews what is due.
    clock = FakeClock(time.time())
    lock = FAKE_LOCK_SECONDS
    with (
        # One clock, so no skew margin: a lock that was not renewed is stale once crossed.
        serve_renewing(
            adapter,
            store_kind,
            request,
            lock_timeout_seconds=lock,
            clock_skew_seconds=0,
            clock=clock,
        ) as renewing,
        ThreadPoolExecutor(1) as pool,
    ):
        served = renewing.served
        gate = served.workload.arm_gate()
        pending = served.post_in_background(pool, path, key)
        served.workload.wait_for_runs(path, 1)
        # Three lock timeouts of the clock: at each interval a renewal falls due, the owner
        # makes it, and a retry then is refused.
        for _ in range(9):
            before = len(renewing.renewals())
            clock.advance(lock / 3)
            wait_for_more(lambda: len(renewing.renewals()), before, "renewal")
            retry = served.post(path, key)
            assert retry.status_code == 409, retry.text
        gate.set()
        first = pending.result(timeout=CLIENT_TIMEOUT_SECONDS)
        assert first.status_code == 201
        assert first.json() == {"path": path, "run": 1}
        assert served.workload.runs(path) == 1
        assert not served.events.of("taken_over")

        replay = served.post(path, key)
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.json() == {"path": path, "run": 1}
        assert served.workload.runs(path) == 1

        # Renewal stopped with the handler: nothing more over a lock timeout of the clock
        # and two of the renewer's real ticks.
        count = len(renewing.renewals())
        clock.advance(lock)
        time.sleep(2 * lock / 3)
        assert len(renewing.renewals()) == count


ENDINGS = ["returns", "raises"]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("adapter", ["asgi", "wsgi"])
def test_renewal_stops_when_the_handler_returns_or_raises(adapter: Adapter, ending: str) -> None:
    """No renewal after the handler ended, however many fall due by the clock."""
    key = unique_key(ending)
    lock = FAKE_LOCK_SECONDS
    path = "/gate" if ending == "returns" else "/gate-fail"
    store = CountingMemoryStore()
    clock = FakeClock(time.time())
    with (
        serve_workload(adapter, store, lock_timeout_seconds=lock, clock=clock) as served,
        ThreadPoolExecutor(1) as pool,
    ):
        gate = served.workload.arm_gate()
        pending = served.post_in_background(pool, path, key)
        served.workload.wait_for_runs(path, 1)
        for _ in range(2):  # the handler outlives two renewals
            before = len(store.extensions())
            clock.advance(lock / 3)
            wait_for_more(lambda: len(store.extensions()), before, "renewal")
        gate.set()
        response = pending.result(timeout=CLIENT_TIMEOUT_SECONDS)
        assert response.status_code == (201 if ending == "returns" else 500)
        attempts = store.renewals()

        # A whole lock of the clock falls due, and the renewer gets two of its real ticks.
        clock.advance(lock)
        time.sleep(2 * lock / 3)
        assert store.renewals() == attempts, "renewed after the handler ended"
        hashed = storage_key("POST", path, None, key)
        record = store.get(hashed)
        if ending == "returns":
            assert record is not None and record.status is Status.COMPLETED
        else:
            assert record is None  # raised: released


async def test_renewal_stops_and_the_key_is_released_when_the_app_task_is_cancelled() -> None:
    """ASGI, in-process: the task running the middleware is cancelled mid-handler."""
    store = CountingMemoryStore()
    workload = Workload()
    events = Events()
    app = IdempotencyMiddleware(
        workload.asgi, store=store, lock_timeout_seconds=0.3, on_event=events
    )
    key = unique_key("cancelled")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/sleep",
        "raw_path": b"/sleep",
        "root_path": "",
        "query_string": b"seconds=30",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"idempotency-key", key.encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        sent.append(dict(message))

    task = asyncio.ensure_future(app(scope, receive, send))
    await asyncio.sleep(0.5)  # renewals due at 0.1, 0.2, 0.3, 0.4 s
    assert workload.runs("/sleep") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    extended = store.extensions()
    assert len(extended) >= 2
    cancelled_at = time.time()

    await asyncio.sleep(0.4)
    assert store.extensions() == extended, "the lock was extended after the cancellation"
    assert len([at for at in store.renewals() if at >= cancelled_at]) <= 1
    assert sent == [], "a cancelled request sends nothing"
    # Cancelled is treated like raised: the claim is released, a retry runs again.
    assert store.get(storage_key("POST", "/sleep", None, key)) is None
    assert len(events.of("released")) == 1


# --- a blocked event loop cannot renew ----------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["memory", "dynamodb"])
def test_an_asgi_owner_whose_loop_is_blocked_is_taken_over_by_another_server(
    store_kind: StoreKind, request: pytest.FixtureRequest
) -> None:
    """Server A's handler blocks its loop (``time.sleep`` in ``async def``) for four lock
    timeouts: its renewal timer cannot fire, so server B, sharing the store, takes the key
    over once the lock expires and runs the handler; A's late result is fenced out."""
    lock = LOCK_SECONDS
    block_seconds = 4 * lock
    key = unique_key("blocked")
    path = "/first-block"
    target = f"{path}?seconds={block_seconds}"
    workload = Workload()  # shared, so the run number counts across both servers
    with contextlib.ExitStack() as stack:
        renewals: Callable[[], list[float]]
        if store_kind == "memory":
            shared = CountingMemoryStore()
            renewals = shared.renewals
            stores: list[MemoryStore | AsyncDynamoDBStore] = [shared, shared]
        else:
            moto_endpoint: str = request.getfixturevalue("moto_endpoint")
            table: str = request.getfixturevalue("dynamodb_table")
            proxy = stack.enter_context(FaultProxy(moto_endpoint))

            def wire_renewals() -> list[float]:
                return [seen.at for seen in proxy.renewals()]

            renewals = wire_renewals
            stores = [
                AsyncDynamoDBStore(table, endpoint_url=proxy.url, region_name=REGION)
                for _ in range(2)
            ]
        servers = [
            stack.enter_context(
                serve_workload(
                    "asgi",
                    store,
                    workload=workload,
                    on_shutdown=store.aclose if isinstance(store, AsyncDynamoDBStore) else None,
                    lock_timeout_seconds=lock,
                )
            )
            for store in stores
        ]
        server_a, server_b = servers
        pool = stack.enter_context(ThreadPoolExecutor(1))

        pending = server_a.post_in_background(pool, target, key)
        workload.wait_for_runs(path, 1)
        blocked_at = time.monotonic()
        blocked_wall = time.time()
        # B gets 409 while A's lock holds, then takes the key over and runs the handler.
        conflicts = 0
        while True:
            response = server_b.post(target, key)
            if response.status_code != 409:
                break
            conflicts += 1
            assert time.monotonic() - blocked_at < block_seconds, "never taken over"
            time.sleep(0.1)
        assert response.status_code == 201
        assert response.json() == {"path": path, "run": 2}
        assert conflicts >= 1
        assert len(server_b.events.of("taken_over")) == 1
        assert workload.finished(path) == 1, "A is still blocked"

        # A's client still gets A's own response; A's result is not stored.
        first = pending.result(timeout=CLIENT_TIMEOUT_SECONDS)
        assert first.status_code == 201
        assert first.json() == {"path": path, "run": 1}
        # (A claim that landed late is renewed once before its handler runs; none after.)
        assert [at for at in renewals() if at >= blocked_wall] == [], "a blocked loop renewed"
        assert len(server_a.events.of("lost")) == 1

        # The stored record is B's run, on either server.
        for server in (server_a, server_b):
            replay = server.post(target, key)
            assert replay.headers.get("idempotent-replayed") == "true"
            assert replay.json() == {"path": path, "run": 2}
        assert workload.runs(path) == 2
