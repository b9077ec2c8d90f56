"""Real servers on 127.0.0.1 and the harness that runs one scenario on every adapter/store.

``serve_asgi`` runs uvicorn in a background thread with its own event loop; ``serve_wsgi``
runs waitress. Both bind port 0 and yield the base URL. ``Harness`` builds the app for its
combination (FastAPI or Flask; a memory, SQLite or DynamoDB store, the DynamoDB one on moto
or on DynamoDB Local), wraps it in the middleware with the options a test asks for, serves
it, and hands out httpx clients.

``ALL_COMBOS`` (memory and moto) is what the shared ``harness`` fixture runs; the behaviour
suite adds ``DB_COMBOS`` (Redis and PostgreSQL on real servers). Claims about
concurrency are proven on ``ATOMIC_COMBOS`` instead: stores whose conditional writes are
atomic (moto's threaded server is not: see tests/contract/test_moto_atomicity.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
import uvicorn
import waitress
from waitress import wasyncore

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    SQLiteStore,
    StoreUnavailable,
)
from idempotency_middleware.stores.protocol import (
    AsyncStore,
    ClaimRequest,
    ClaimResult,
    Completion,
    SyncStore,
)
from idempotency_middleware.web.asgi import ASGIApp
from idempotency_middleware.web.wsgi import WSGIApp
from tests.support.apps import AppState, build_asgi_app, build_wsgi_app
from tests.support.db_stores import count_records, new_store
from tests.support.db_stores import unreachable_store as unreachable_db_store
from tests.support.ports import free_port

if TYPE_CHECKING:
    from typing_extensions import Self

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 10.0
CLIENT_TIMEOUT_SECONDS = 15.0

Adapter = Literal["asgi", "wsgi"]
# "dynamodb" is moto's server; "dynamodb-local" is Amazon's DynamoDB Local
# (scripts/dynamodb-local.sh), the same store classes on another endpoint.
StoreKind = Literal["memory", "sqlite", "dynamodb", "dynamodb-local", "redis", "postgres"]
DYNAMODB_KINDS: frozenset[StoreKind] = frozenset({"dynamodb", "dynamodb-local"})


@contextlib.contextmanager
def serve_asgi(
    app: ASGIApp,
    *,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    lifespan: bool = False,
) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free port; ``on_shutdown`` runs on the server's loop.
    With ``lifespan`` the app gets uvicorn's lifespan start-up before the port opens."""
    config = uvicorn.Config(
        app,
        host=HOST,
        port=0,
        lifespan="on" if lifespan else "off",
        log_level="warning",
        timeout_graceful_shutdown=2,
    )
    server = PromptServer(config)
    failure: list[BaseException] = []

    async def main() -> None:
        try:
            await server.serve()
        finally:
            if on_shutdown is not None:
                await on_shutdown()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as error:  # reported to the test thread below
            failure.append(error)

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    try:
        _wait_until(lambda: server.started or not thread.is_alive(), "uvicorn did not start")
        if not server.started:
            raise RuntimeError(f"uvicorn failed to start: {failure!r}")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{HOST}:{port}"
    finally:
        server.stop()
        thread.join(10)
    if failure:
        raise RuntimeError("the uvicorn thread failed") from failure[0]


class PromptServer(uvicorn.Server):
    """uvicorn's server, stopped as soon as :meth:`stop` is called.

    uvicorn looks at ``should_exit`` every 0.1 s and then sleeps 0.1 s more before waiting
    for open connections: about 0.2 s of every test that stops a server, thousands of times
    a run. Here the main loop wakes on an event instead, and a server left with no
    connection and no task (the tests close their clients first) skips the pause; with
    connections open, uvicorn's own shutdown runs unchanged.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None

    def stop(self) -> None:
        """Ask the server to stop (from any thread)."""
        self.should_exit = True
        loop, stop_requested = self._loop, self._stop_requested
        if loop is not None and stop_requested is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stop_requested.set)

    async def main_loop(self) -> None:
        self._stop_requested = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        # on_tick refreshes the Date header when counter % 10 == 0, and answers should_exit.
        while not await self.on_tick(counter):
            counter += 10
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop_requested.wait(), 1.0)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks or sockets:
            await super().shutdown(sockets)
            return
        for server in self.servers:
            server.close()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


@contextlib.contextmanager
def serve_wsgi(app: WSGIApp) -> Iterator[str]:
    """Serve ``app`` with waitress (32 threads) on a free port."""
    server = waitress.create_server(app, host=HOST, port=0, threads=32)
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.effective_port}"
    finally:
        # server.close() and the open connections' sockets are closed on the server's own
        # loop thread (a trigger thunk): closed under a running select() they would raise
        # EBADF there. With its socket map empty, the loop returns.
        try:
            server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        except OSError:
            # The trigger's pipe is already gone (seen once in CI: EBADF): close the map
            # from here instead; the loop's select() then fails and the loop returns.
            with contextlib.suppress(OSError):
                wasyncore.close_all(server._map, ignore_all=True)
        thread.join(10)
        # Stop the worker threads too, or every test would leave 32 of them behind.
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)


def _wait_until(condition: Callable[[], bool], message: str) -> None:
    done = threading.Event()
    for _ in range(int(START_TIMEOUT_SECONDS / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise TimeoutError(message)


@contextlib.contextmanager
def server_process(
    command: list[str],
    *,
    env: dict[str, str],
    log: Path,
    listening: re.Pattern[str],
    cwd: Path = REPO_ROOT,
    timeout: float = 20.0,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Run ``command``, a server told to bind port 0, with its output appended to ``log``;
    yield the process and the URL it listens on, which ``listening`` (a pattern with one
    group) finds in the log ("Uvicorn running on (http://...)"): no port is chosen before
    the server binds it, so no other process can take it in between. Killed (by pid, with
    its session) if still running when the block ends."""
    start = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as log_file:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            found = listening.search(log.read_bytes()[start:].decode(errors="replace"))
            if found is not None:
                break
            if process.poll() is not None:
                raise RuntimeError(f"exited with {process.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not listening after {timeout} s: {log.read_text()}")
            time.sleep(0.05)
        yield process, found.group(1)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


# What uvicorn (at --log-level info) and waitress print once they listen.
UVICORN_LISTENING = re.compile(r"Uvicorn running on (http://[0-9.]+:[0-9]+)")
WAITRESS_LISTENING = re.compile(r"Serving on (http://[0-9.]+:[0-9]+)")


class BackgroundHTTPServer:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 port 0 served from a daemon thread while the
    ``with`` block runs: the base of the tests' small fake endpoints."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer((HOST, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass(frozen=True)
class Combo:
    adapter: Adapter
    store: StoreKind

    @property
    def id(self) -> str:
        return f"{self.adapter}-{self.store}"

    @property
    def on_dynamodb(self) -> bool:
        """A DynamoDB store, on moto or on DynamoDB Local."""
        return self.store in DYNAMODB_KINDS


ALL_COMBOS = (
    Combo("asgi", "memory"),
    Combo("asgi", "dynamodb"),
    Combo("wsgi", "memory"),
    Combo("wsgi", "dynamodb"),
)
ASGI_COMBOS = tuple(combo for combo in ALL_COMBOS if combo.adapter == "asgi")
WSGI_COMBOS = tuple(combo for combo in ALL_COMBOS if combo.adapter == "wsgi")
DYNAMODB_COMBOS = tuple(combo for combo in ALL_COMBOS if combo.store == "dynamodb")
SQLITE_COMBOS = (Combo("asgi", "sqlite"), Combo("wsgi", "sqlite"))
DYNAMODB_LOCAL_COMBOS = (Combo("asgi", "dynamodb-local"), Combo("wsgi", "dynamodb-local"))
# Redis and PostgreSQL on their real servers (tests/support/db_servers.py): atomic, and run by the
# behaviour suite beside ALL_COMBOS.
DB_COMBOS = (
    Combo("asgi", "redis"),
    Combo("wsgi", "redis"),
    Combo("asgi", "postgres"),
    Combo("wsgi", "postgres"),
)
# Stores whose conditional writes are atomic, where concurrency claims are proven. The
# DynamoDB Local ones need its endpoint (scripts/dynamodb-local.sh): a fixture building them
# skips them without it (see tests/e2e/test_concurrency.py).
ATOMIC_COMBOS = (
    Combo("asgi", "memory"),
    Combo("wsgi", "memory"),
    *SQLITE_COMBOS,
    *DB_COMBOS,
    *DYNAMODB_LOCAL_COMBOS,
)

# A response body the store cannot keep: over MemoryStore(max_response_bytes=...) and
# SQLiteStore(max_response_bytes=...) as the harness builds them, and over DynamoDB's 400 KB
# item limit (random bytes do not compress).
MEMORY_MAX_RESPONSE_BYTES = 1000
TOO_LARGE_RESPONSE_BYTES: dict[StoreKind, int] = {
    "memory": 5000,
    "sqlite": 5000,
    "dynamodb": 600 * 1024,
    "dynamodb-local": 600 * 1024,
    "redis": 5000,
    "postgres": 5000,
}


@dataclass(frozen=True)
class AWSSessions:
    """Sessions shared by every store of a test run (each new session reloads the service
    model), and a boto3 client on the DynamoDB endpoint (moto or DynamoDB Local) for looking
    into tables."""

    boto3_session: Any
    aioboto3_session: Any
    dynamodb: Any


def _renewal_cut_off() -> StoreUnavailable:
    return StoreUnavailable("this owner's lease renewals cannot reach the store (test)")


class SyncPassThrough:
    """A real sync store behind a wrapper that changes only what its subclass overrides."""

    def __init__(self, store: SyncStore) -> None:
        self._store = store

    def claim(self, request: ClaimRequest) -> ClaimResult:
        return self._store.claim(request)

    def complete(self, completion: Completion) -> bool:
        return self._store.complete(completion)

    def release(self, key: str, owner: str) -> bool:
        return self._store.release(key, owner)

    def renew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return self._store.renew(key, owner, lock_expires_at)


class AsyncPassThrough:
    """The async twin of :class:`SyncPassThrough`."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        return await self._store.aclaim(request)

    async def acomplete(self, completion: Completion) -> bool:
        return await self._store.acomplete(completion)

    async def arelease(self, key: str, owner: str) -> bool:
        return await self._store.arelease(key, owner)

    async def arenew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return await self._store.arenew(key, owner, lock_expires_at)


class SyncRenewalsCutOff(SyncPassThrough):
    """A real sync store whose lease renewals never get through: an owner cut off from it.

    Claims, completions and releases go to the real store, so the fencing under test is the
    store's own; only ``renew`` fails, as it would for an owner that lost its connection.
    """

    def renew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        raise _renewal_cut_off()


class AsyncRenewalsCutOff(AsyncPassThrough):
    """The async twin of :class:`SyncRenewalsCutOff`."""

    async def arenew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        raise _renewal_cut_off()


class Renewals:
    """How many lease renewals got through to the store (a ``renew`` that answered True)."""

    def __init__(self) -> None:
        self._count = 0
        self._condition = threading.Condition()

    def record(self, renewed: bool) -> bool:
        if renewed:
            with self._condition:
                self._count += 1
                self._condition.notify_all()
        return renewed

    def wait_for(self, count: int, timeout: float = START_TIMEOUT_SECONDS) -> bool:
        """Whether ``count`` renewals got through within ``timeout`` real seconds (the
        renewers tick on real time even under a fake clock)."""
        with self._condition:
            return self._condition.wait_for(lambda: self._count >= count, timeout)


class SyncRenewalsCounted(SyncPassThrough):
    """A real sync store whose successful lease renewals are counted in ``renewals``."""

    def __init__(self, store: SyncStore, renewals: Renewals) -> None:
        super().__init__(store)
        self._renewals = renewals

    def renew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return self._renewals.record(super().renew(key, owner, lock_expires_at))


class AsyncRenewalsCounted(AsyncPassThrough):
    """The async twin of :class:`SyncRenewalsCounted`."""

    def __init__(self, store: AsyncStore, renewals: Renewals) -> None:
        super().__init__(store)
        self._renewals = renewals

    async def arenew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return self._renewals.record(await super().arenew(key, owner, lock_expires_at))


class Harness:
    """One adapter/store combination: start servers with options, make clients, read counters.

    Every server a test starts uses the same store (one ``MemoryStore``, one SQLite file, or
    one DynamoDB table), as the instances of one deployment do. A SQLite combination gets a
    fresh file in a temporary directory unless ``sqlite_path`` names one.
    """

    def __init__(
        self,
        combo: Combo,
        stack: contextlib.ExitStack,
        *,
        table_name: str | None = None,
        dynamodb_endpoint: str | None = None,
        region: str | None = None,
        aws: AWSSessions | None = None,
        sqlite_path: str | None = None,
        db_location: str | None = None,
    ) -> None:
        if combo.store in ("redis", "postgres") and db_location is None:
            raise ValueError("a Redis or PostgreSQL combination needs its server's URL")
        if combo.on_dynamodb and (table_name is None or dynamodb_endpoint is None or aws is None):
            raise ValueError("a DynamoDB combination needs a table, an endpoint and sessions")
        self.combo = combo
        self.state = AppState()
        self.memory_store = MemoryStore(max_response_bytes=MEMORY_MAX_RESPONSE_BYTES)
        self._stack = stack
        self._table_name = table_name
        self._dynamodb_endpoint = dynamodb_endpoint
        self._region = region
        self._aws = aws
        self._sqlite_path = sqlite_path
        self._sqlite_store: SQLiteStore | None = None
        self._db_location = db_location
        self._db_store: Any = None
        # Counted for servers started with ``count_renewals``.
        self.renewals = Renewals()

    @property
    def adapter(self) -> Adapter:
        return self.combo.adapter

    @property
    def store_kind(self) -> StoreKind:
        return self.combo.store

    @property
    def too_large_response_bytes(self) -> int:
        """A response size the combination's store cannot keep."""
        return TOO_LARGE_RESPONSE_BYTES[self.combo.store]

    def calls(self, endpoint: str) -> int:
        return self.state.calls(endpoint)

    @property
    def sqlite_store(self) -> SQLiteStore:
        """The combination's ``SQLiteStore``, made on first use and closed after every server
        the test started has stopped."""
        if self._sqlite_store is None:
            if self._sqlite_path is None:
                directory = tempfile.mkdtemp(prefix="idempotency-harness-")
                self._stack.callback(shutil.rmtree, directory, ignore_errors=True)
                self._sqlite_path = f"{directory}/idempotency.sqlite3"
            store = SQLiteStore(self._sqlite_path, max_response_bytes=MEMORY_MAX_RESPONSE_BYTES)
            # Registered before any server that uses it is entered: closed after they stop.
            self._stack.callback(store.close)
            self._sqlite_store = store
        return self._sqlite_store

    @property
    def db_store(self) -> Any:
        """The combination's ``RedisStore`` or ``PostgresStore`` (a namespace of its own on
        the session's server), made on first use and closed after every server stopped."""
        if self._db_store is None:
            assert self._db_location is not None
            # The servers run in the test process, their event loop sharing the GIL with
            # the test's client threads (24 at once in a burst), under coverage on a loaded
            # machine: there a connect to the local Redis can outlive RedisStore's 1 s
            # default while the loop waits its turn. PostgresStore's default is 5 s; the
            # connect timeout itself is tested on unreachable stores (db_stores.py).
            slow_loop: dict[str, Any] = (
                {"socket_connect_timeout": 5.0} if self.combo.store == "redis" else {}
            )
            store = new_store(
                self.combo.store,
                self._db_location,
                max_response_bytes=MEMORY_MAX_RESPONSE_BYTES,
                **slow_loop,
            )
            self._stack.callback(store.close)
            self._db_store = store
        return self._db_store

    def start(
        self,
        *,
        unreachable_store: bool = False,
        renewals_cut_off: bool = False,
        count_renewals: bool = False,
        flask_propagate_exceptions: bool = True,
        **options: Any,
    ) -> str:
        """Serve the combination's app wrapped in the middleware with ``options``; its URL.

        ``unreachable_store`` points a DynamoDB, Redis or PostgreSQL store at a closed port on
        127.0.0.1.
        ``renewals_cut_off`` makes this server an owner whose lease renewals never reach the
        store (see :class:`SyncRenewalsCutOff`).
        ``count_renewals`` counts this server's renewals that got through in ``renewals``.
        ``flask_propagate_exceptions`` (WSGI only) lets unhandled exceptions leave Flask.
        """
        endpoint = self._dynamodb_endpoint
        if unreachable_store:
            if self.combo.store in ("redis", "postgres"):
                down = unreachable_db_store(self.combo.store, free_port())
                self._stack.callback(down.close)
                self._db_store = down
            elif not self.combo.on_dynamodb:
                raise ValueError("only a DynamoDB, Redis or PostgreSQL store can be unreachable")
            endpoint = f"http://{HOST}:{free_port()}"
        if self.combo.adapter == "asgi":
            return self._start_asgi(endpoint, renewals_cut_off, count_renewals, options)
        return self._start_wsgi(
            endpoint, renewals_cut_off, count_renewals, flask_propagate_exceptions, options
        )

    def _start_asgi(
        self,
        endpoint: str | None,
        renewals_cut_off: bool,
        count_renewals: bool,
        options: dict[str, Any],
    ) -> str:
        app = build_asgi_app(self.state)
        on_shutdown: Callable[[], Awaitable[None]] | None = None
        store: AsyncStore
        if self.combo.store == "memory":
            store = self.memory_store
        elif self.combo.store == "sqlite":
            store = self.sqlite_store
        elif self.combo.store in ("redis", "postgres"):
            store = self.db_store
            on_shutdown = self.db_store.aclose  # its async client belongs to the server's loop
        else:
            assert self._table_name is not None
            assert self._aws is not None
            dynamodb = AsyncDynamoDBStore(
                self._table_name,
                endpoint_url=endpoint,
                region_name=self._region,
            )
            store = dynamodb
            on_shutdown = dynamodb.aclose  # the client belongs to the server's loop
        if renewals_cut_off:
            store = AsyncRenewalsCutOff(store)
        if count_renewals:
            store = AsyncRenewalsCounted(store, self.renewals)
        wrapped = IdempotencyMiddleware(app, store=store, **options)
        return self._stack.enter_context(serve_asgi(wrapped, on_shutdown=on_shutdown))

    def _start_wsgi(
        self,
        endpoint: str | None,
        renewals_cut_off: bool,
        count_renewals: bool,
        propagate_exceptions: bool,
        options: dict[str, Any],
    ) -> str:
        app = build_wsgi_app(self.state, propagate_exceptions=propagate_exceptions)
        store: SyncStore
        if self.combo.store == "memory":
            store = self.memory_store
        elif self.combo.store == "sqlite":
            store = self.sqlite_store
        elif self.combo.store in ("redis", "postgres"):
            store = self.db_store
        else:
            assert self._table_name is not None
            assert self._aws is not None
            dynamodb = DynamoDBStore(
                self._table_name,
                endpoint_url=endpoint,
                region_name=self._region,
            )
            store = dynamodb
            self._stack.callback(dynamodb.close)  # after the server stopped (LIFO)
        if renewals_cut_off:
            store = SyncRenewalsCutOff(store)
        if count_renewals:
            store = SyncRenewalsCounted(store, self.renewals)
        app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
            app.wsgi_app, store=store, **options
        )
        return self._stack.enter_context(serve_wsgi(app))

    def client(self, base_url: str, **kwargs: Any) -> httpx.Client:
        """An httpx client for ``base_url``, closed before the servers stop."""
        kwargs.setdefault("timeout", CLIENT_TIMEOUT_SECONDS)
        client = httpx.Client(base_url=base_url, trust_env=False, **kwargs)
        self._stack.callback(client.close)
        return client

    def serve(self, **options: Any) -> httpx.Client:
        """``start(**options)`` and a client for it."""
        return self.client(self.start(**options))

    def stored_records(self) -> int:
        """How many records the combination's store holds."""
        if self.combo.store == "memory":
            return len(self.memory_store)
        if self.combo.store == "sqlite":
            store = self.sqlite_store
            with contextlib.closing(sqlite3.connect(store.path)) as connection:
                row = connection.execute(f'SELECT COUNT(*) FROM "{store.table_name}"').fetchone()
            return int(row[0])
        if self.combo.store in ("redis", "postgres"):
            assert self._db_location is not None
            return count_records(self.combo.store, self.db_store, self._db_location)
        assert self._aws is not None
        result = self._aws.dynamodb.scan(
            TableName=self._table_name, Select="COUNT", ConsistentRead=True
        )
        return int(result["Count"])


def released(store: MemoryStore, key_hash: str) -> bool:
    """Whether the key's record is gone, waiting for it a little: a server may answer its
    client (a body cut to its declared length is whole to the client) before it has
    finished iterating the response, which is when a live stream's key is released."""
    deadline = time.monotonic() + 5
    while store.get(key_hash) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
