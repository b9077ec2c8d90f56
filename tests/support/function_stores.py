"""Every store kind as the store of an ``idempotent`` function, sync and async.

The kinds are ``tests.support.store_kinds.STORE_KINDS``: ``MemoryStore`` and ``SQLiteStore``
(each once for a plain function and once for a coroutine function), ``RedisStore`` and
``PostgresStore`` likewise on real servers, ``DynamoDBStore`` and ``AsyncDynamoDBStore`` on
moto's server, and both DynamoDB stores on Amazon's DynamoDB Local (ids containing
``dynamodb-local``: skipped unless ``scripts/dynamodb-local.sh`` runs them). A test module's
fixture, parametrized over them, opens each with ``open_function_store``::

    @pytest.fixture(params=STORE_KINDS)
    def fstore(request: pytest.FixtureRequest) -> Iterator[FunctionStore]:
        yield from open_function_store(request, request.param)

A test writes its function once, as a plain ``def``; ``FunctionStore.decorate`` makes it a
coroutine function for the async kinds (same signature, annotations and qualname), and
``run``/``start`` call it either way, so one test body holds sync and async functions to
the same contract. Async kinds run everything on one event loop kept for the test, where
their store lives and is closed.

Time is a ``StepClock`` (a ``FakeClock``) given to the store and the decorator: tests cross
lock timeouts by advancing it, never by sleeping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import re
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyEvent,
    MemoryStore,
    SQLiteStore,
    idempotent,
)
from idempotency_middleware.errors import StoreUnavailable
from idempotency_middleware.stores.dynamodb import MAX_ITEM_RESPONSE_BYTES
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult, Completion
from idempotency_middleware.stores.records import Record
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION, table_creator
from tests.support.db_stores import location, new_store, raw_record, unreachable_store
from tests.support.ports import free_port
from tests.support.store_kinds import LOCAL_KINDS, is_db_kind

# Real seconds a test waits at most for another thread or task (never for a deadline).
TIMEOUT = 10.0
_POLL = 0.002

Function = Callable[..., Any]


def fresh_key(label: str = "key") -> str:
    return f"{label}-{uuid.uuid4().hex}"


class StepClock(FakeClock):
    """A ``FakeClock`` that can run a hook at the next sleep (a waiting duplicate's first
    poll), to let a test act exactly while a call waits."""

    def __init__(self) -> None:
        # Real time to start from: DynamoDB Local's TTL sweeper deletes items whose ``ttl``
        # is in the real past, which would remove claims of a clock started in 2023.
        super().__init__(start=time.time())
        self._hook: Callable[[], None] | None = None
        self._async_hook: Callable[[], Awaitable[None]] | None = None

    def at_next_sleep(
        self,
        hook: Callable[[], None] | None = None,
        async_hook: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._hook, self._async_hook = hook, async_hook

    def sleep(self, seconds: float) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        super().sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        hook, self._async_hook = self._async_hook, None
        if hook is not None:
            await hook()
        await super().asleep(seconds)


class Hold:
    """Holds the first call that passes it until ``open``; later calls pass at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._opened = threading.Event()
        self._lock = threading.Lock()
        self._passes = 0

    def open(self) -> None:
        self._opened.set()

    def _first(self) -> bool:
        with self._lock:
            self._passes += 1
            return self._passes == 1

    def block(self) -> None:
        if self._first():
            self.entered.set()
            if not self._opened.wait(TIMEOUT):
                raise TimeoutError("the hold was never opened")

    async def ablock(self) -> None:
        if self._first():
            self.entered.set()
            deadline = time.monotonic() + TIMEOUT
            while not self._opened.is_set():
                if time.monotonic() > deadline:
                    raise TimeoutError("the hold was never opened")
                await asyncio.sleep(_POLL)


class Events:
    """An ``on_event`` hook keeping every event (thread-safe)."""

    def __init__(self) -> None:
        self._events: list[IdempotencyEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: IdempotencyEvent) -> None:
        with self._lock:
            self._events.append(event)

    @property
    def all(self) -> list[IdempotencyEvent]:
        with self._lock:
            return list(self._events)

    def kinds(self) -> list[str]:
        return [event.kind for event in self.all]

    def of(self, kind: str) -> list[IdempotencyEvent]:
        return [event for event in self.all if event.kind == kind]


class CountingStore:
    """Delegates every call to ``inner`` (sync or async) and counts them by operation,
    each once it has ended."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.renewed = 0  # renewals that extended the lock
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _counted(self, operation: str) -> Iterator[None]:
        """Counts a call once it has ended (answered or raised)."""
        try:
            yield
        finally:
            with self._lock:
                self.calls[operation] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def _renewal(self, renewed: bool) -> bool:
        if renewed:
            with self._lock:
                self.renewed += 1
        return renewed

    def claim(self, request: ClaimRequest) -> ClaimResult:
        with self._counted("claim"):
            result: ClaimResult = self.inner.claim(request)
            return result

    def complete(self, completion: Completion) -> bool:
        with self._counted("complete"):
            return bool(self.inner.complete(completion))

    def release(self, key_hash: str, owner: str) -> bool:
        with self._counted("release"):
            return bool(self.inner.release(key_hash, owner))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        with self._counted("renew"):
            return self._renewal(bool(self.inner.renew(key_hash, owner, lock_expires_at)))

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        with self._counted("claim"):
            result: ClaimResult = await self.inner.aclaim(request)
            return result

    async def acomplete(self, completion: Completion) -> bool:
        with self._counted("complete"):
            return bool(await self.inner.acomplete(completion))

    async def arelease(self, key_hash: str, owner: str) -> bool:
        with self._counted("release"):
            return bool(await self.inner.arelease(key_hash, owner))

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        with self._counted("renew"):
            return self._renewal(bool(await self.inner.arenew(key_hash, owner, lock_expires_at)))


class DownStore:
    """A store (both flavours) whose backend never answers: every call raises."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self) -> StoreUnavailable:
        self.calls += 1
        return StoreUnavailable("the store is down")

    def claim(self, request: ClaimRequest) -> ClaimResult:
        raise self._fail()

    def complete(self, completion: Completion) -> bool:
        raise self._fail()

    def release(self, key_hash: str, owner: str) -> bool:
        raise self._fail()

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        raise self._fail()

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        raise self._fail()

    async def acomplete(self, completion: Completion) -> bool:
        raise self._fail()

    async def arelease(self, key_hash: str, owner: str) -> bool:
        raise self._fail()

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        raise self._fail()


class Pending:
    """A call started in the background: a thread (sync) or a task on the test's loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        future: concurrent.futures.Future[Any] | None = None,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        self._loop = loop
        self._future = future
        self.task = task

    def done(self) -> bool:
        if self.task is not None:
            return self.task.done()
        assert self._future is not None
        return self._future.done()

    def wait(self) -> None:
        """Block until the call ended (sync kinds; from another thread)."""
        assert self._future is not None
        concurrent.futures.wait([self._future], timeout=TIMEOUT)

    def result(self) -> Any:
        if self.task is not None:
            assert self._loop is not None
            return self._loop.run_until_complete(asyncio.wait_for(self.task, TIMEOUT))
        assert self._future is not None
        return self._future.result(TIMEOUT)


class FunctionStore:
    """One store kind, with what a test needs to decorate, call and inspect functions."""

    def __init__(
        self,
        kind: str,
        store: Any,
        *,
        clock: StepClock,
        loop: asyncio.AbstractEventLoop | None,
        unavailable: Callable[[], Any],
        raw: Callable[[str], str],
    ) -> None:
        self.kind = kind
        self.store = store
        self.clock = clock
        self.loop = loop
        self._unavailable = unavailable
        self._raw = raw
        self._holds: list[Hold] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"FunctionStore({self.kind})"

    @property
    def is_async(self) -> bool:
        return self.loop is not None

    # -- functions ----------------------------------------------------------------------

    def hold(self) -> Hold:
        hold = Hold()
        self._holds.append(hold)
        return hold

    def adapt(self, function: Function, hold: Hold | None = None) -> Function:
        """``function`` as this kind's flavour: a coroutine function for the async kinds
        (``functools.wraps`` keeps its signature, annotations and qualname)."""
        if self.is_async:

            @functools.wraps(function)
            async def coroutine_function(*args: Any, **kwargs: Any) -> Any:
                if hold is not None:
                    await hold.ablock()
                return function(*args, **kwargs)

            return coroutine_function
        if hold is None:
            return function

        @functools.wraps(function)
        def held(*args: Any, **kwargs: Any) -> Any:
            hold.block()
            return function(*args, **kwargs)

        return held

    def decorate(
        self, *, hold: Hold | None = None, store: Any = None, **options: Any
    ) -> Callable[[Function], Function]:
        """``idempotent(store=<this store>, clock=<the clock>, **options)`` applied to the
        function made this kind's flavour."""

        def decorate(function: Function) -> Function:
            chosen = self.store if store is None else store
            decorator = idempotent(store=chosen, clock=self.clock, **options)
            decorated: Function = decorator(self.adapt(function, hold))
            return decorated

        return decorate

    def run(self, function: Function, *args: Any, **kwargs: Any) -> Any:
        """Call a decorated function and return its result (awaited for async kinds)."""
        if self.loop is None:
            return function(*args, **kwargs)
        return self.loop.run_until_complete(asyncio.wait_for(function(*args, **kwargs), TIMEOUT))

    def start(self, function: Function, *args: Any, **kwargs: Any) -> Pending:
        """Call a decorated function in the background (a thread, or a task)."""
        if self.loop is not None:
            return Pending(self.loop, task=self.loop.create_task(function(*args, **kwargs)))
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(4)
        return Pending(None, future=self._pool.submit(function, *args, **kwargs))

    def wait_until(self, condition: Callable[[], bool], message: str = "condition") -> None:
        """Poll ``condition`` (letting the test's loop run between polls, for async kinds)."""
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {message}")
            if self.loop is not None:
                self.loop.run_until_complete(asyncio.sleep(_POLL))
            else:
                time.sleep(_POLL)

    def when_waiting(self, hold: Hold, first: Pending) -> None:
        """At the next sleep of the clock (a duplicate waiting for ``first``): open ``hold``
        and let ``first`` finish before the waiter polls again."""
        if self.loop is None:

            def hook() -> None:
                hold.open()
                first.wait()

            self.clock.at_next_sleep(hook=hook)
            return
        task = first.task
        assert task is not None

        async def async_hook() -> None:
            hold.open()
            await asyncio.wait({task}, timeout=TIMEOUT)

        self.clock.at_next_sleep(async_hook=async_hook)

    # -- stores -------------------------------------------------------------------------

    def counting(self) -> CountingStore:
        return CountingStore(self.store)

    def unavailable(self) -> Any:
        """A store of this kind that cannot be reached."""
        return self._unavailable()

    def get(self, key_hash: str) -> Record | None:
        """The stored record, through the store's own ``get``/``aget``."""
        if self.loop is None:
            record: Record | None = self.store.get(key_hash)
            return record
        found: Record | None = self.loop.run_until_complete(self.store.aget(key_hash))
        return found

    def raw(self, key_hash: str) -> str:
        """What the backend holds for ``key_hash``, as it holds it (its row, its item)."""
        return self._raw(key_hash)

    def close(self) -> None:
        for hold in self._holds:
            hold.open()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


# -- opening a kind ------------------------------------------------------------------------


_TABLES: dict[str, str] = {}
_TABLES_LOCK = threading.Lock()


def function_table(endpoint: str) -> str:
    """The table for functions on ``endpoint``, created once per run (tests use their own
    random keys; a table per test would cost more than the tests)."""
    with _TABLES_LOCK:
        if endpoint not in _TABLES:
            name = f"idem-functions-{uuid.uuid4().hex[:10]}"
            with table_creator(name, endpoint) as creator:
                creator.create_table()
            _TABLES[endpoint] = name
        return _TABLES[endpoint]


def _raw_dynamodb(endpoint: str, table: str) -> Callable[[str], str]:
    def raw(key_hash: str) -> str:
        client = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)
        try:
            item = client.get_item(
                TableName=table, Key={"pk": {"S": key_hash}}, ConsistentRead=True
            )
            scanned = client.scan(TableName=table)
        finally:
            client.close()
        mine = [each for each in scanned["Items"] if each["pk"]["S"] == key_hash]
        return repr(item.get("Item")) + repr(mine)

    return raw


def _raw_sqlite(path: Path) -> Callable[[str], str]:
    def raw(key_hash: str) -> str:
        connection = sqlite3.connect(path)
        try:
            rows = connection.execute("SELECT * FROM idempotency_records").fetchall()
        finally:
            connection.close()
        files = b"".join(
            candidate.read_bytes()
            for candidate in (path, path.with_name(path.name + "-wal"))
            if candidate.exists()
        )
        mine = [row for row in rows if key_hash in row]
        return repr(mine) + files.decode("latin-1")

    return raw


def open_function_store(request: pytest.FixtureRequest, kind: str) -> Iterator[FunctionStore]:
    """A ``FunctionStore`` of ``kind`` (a store kind), closed after the test."""
    is_async = kind.endswith("-async")
    clock = StepClock()
    loop = asyncio.new_event_loop() if is_async else None
    to_close: list[Any] = []
    store: Any
    unavailable: Callable[[], Any]
    raw: Callable[[str], str]
    if kind.startswith("memory"):
        # Mimics DynamoDB's item limit, so "too large" means the same thing everywhere.
        memory = MemoryStore(max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock)
        store = memory
        unavailable = DownStore
        raw = lambda key_hash: repr(memory.get(key_hash))  # noqa: E731
    elif is_db_kind(kind):
        base = kind.removesuffix("-async")
        where = location(request, base)
        db_store = new_store(base, where, max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock)
        store = db_store
        to_close.append(db_store)

        def unavailable() -> Any:
            # Nothing listens on that port: every call is refused at once.
            down = unreachable_store(base, free_port(), clock=clock)
            to_close.append(down)
            return down

        raw = functools.partial(raw_record, base, db_store, where)
    elif kind.startswith("sqlite"):
        tmp_path: Path = request.getfixturevalue("tmp_path")
        path = tmp_path / "functions.sqlite3"
        store = SQLiteStore(path, max_response_bytes=MAX_ITEM_RESPONSE_BYTES, clock=clock)
        to_close.append(store)

        def unavailable() -> Any:
            # A file in a directory that does not exist: every call fails to open it.
            broken = SQLiteStore(tmp_path / "missing" / "functions.sqlite3", clock=clock)
            to_close.append(broken)
            return broken

        raw = _raw_sqlite(path)
    else:
        local = kind in LOCAL_KINDS
        endpoint: str = request.getfixturevalue(
            "dynamodb_local_endpoint" if local else "moto_endpoint"
        )
        table = function_table(endpoint)
        store_class: Any = AsyncDynamoDBStore if is_async else DynamoDBStore
        # The default (lean) transport, as users get it; the SDK path has its own tests. A
        # patient read: under load moto (a Python server) can take longer than the 2 s
        # default, and the retried request then overlaps the first inside moto, whose
        # transactions are not atomic (a conflict's position came back wrong). The timeouts
        # themselves are tested with stores of their own, behind the fault proxies.
        store = store_class(
            table, endpoint_url=endpoint, region_name=REGION, clock=clock, read_timeout=30.0
        )
        to_close.append(store)

        def unavailable() -> Any:
            # Nothing listens on that port: every request is refused at once.
            closed = store_class(
                table,
                endpoint_url=f"http://127.0.0.1:{free_port()}",
                region_name=REGION,
                max_attempts=1,
                connect_timeout=1,
                clock=clock,
            )
            to_close.append(closed)
            return closed

        raw = _raw_dynamodb(endpoint, table)
    function_store = FunctionStore(
        kind, store, clock=clock, loop=loop, unavailable=unavailable, raw=raw
    )
    try:
        yield function_store
    finally:
        function_store.close()
        if loop is None:
            for each in to_close:
                each.close()
        else:
            _close_loop(loop, to_close)


# psycopg_pool names its tasks "<pool name>-worker-<n>" and "<pool name>-scheduler".
_POOL_TASK = re.compile(r"-(worker-\d+|scheduler)$")


def _close_loop(loop: asyncio.AbstractEventLoop, to_close: list[Any]) -> None:
    try:
        # Background work the flows started (a lost claim's release) ends first; a
        # connection pool's own tasks (psycopg_pool's workers) run until the store closes.
        pending = [
            task
            for task in asyncio.all_tasks(loop)
            if not task.done() and not _POOL_TASK.search(task.get_name())
        ]
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=TIMEOUT))
        for each in to_close:
            closing: Coroutine[Any, Any, None] = each.aclose()
            loop.run_until_complete(closing)
        leftover = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in leftover:
            task.cancel()
        if leftover:
            loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        with contextlib.suppress(RuntimeError):
            loop.close()


__all__ = [
    "TIMEOUT",
    "CountingStore",
    "DownStore",
    "Events",
    "FunctionStore",
    "Hold",
    "Pending",
    "StepClock",
    "fresh_key",
    "function_table",
    "open_function_store",
]
