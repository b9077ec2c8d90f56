"""The two DynamoDB client flavours: aioboto3 (async) and boto3 (sync).

Everything that differs between the flavours beyond ``async``/``await`` lives here, in two
small bases: how a client is created, closed and entered as a context manager, and how an S3
body is read. The request path's client is the lean transport's (``dynamodb_wire*.py``) unless
the store was told otherwise; table administration has an SDK client of its own then.
``AsyncDynamoDBStore`` (``dynamodb_async.py``) is written once on
:class:`AsyncClients`; ``scripts/unasync.py`` derives ``DynamoDBStore`` (``dynamodb_sync.py``)
on :class:`SyncClients` from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from .dynamodb import DynamoDBStoreBase
from .dynamodb_wire_config import WireConfig, resolve
from .dynamodb_wire_events import events_of, forward_sdk_events

AsyncSelf = TypeVar("AsyncSelf", bound="AsyncClients")
SyncSelf = TypeVar("SyncSelf", bound="SyncClients")

logger = logging.getLogger(__name__)

# How many bare yields a closing coroutine may make when it is run with no event loop
# (``_finish_without_loop``); aiobotocore's close of a client on a closed loop makes one.
_STEPS_WITHOUT_LOOP = 100


class _LoopClients:
    """The clients of one event loop, and what guards them: aiohttp sessions, and an
    ``asyncio.Lock``, each belong to the loop they were made on."""

    __slots__ = ("admin", "dropped", "dynamodb", "lock", "loop", "s3", "stack", "watcher")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = asyncio.Lock()
        self.stack = contextlib.AsyncExitStack()
        self.dynamodb: Any = None  # the request path's client (lean or SDK)
        self.admin: Any = None  # the SDK client for table administration, beside a lean one
        self.s3: Any = None
        self.watcher: AsyncGenerator[None, None] | None = None
        self.dropped = False  # closed, or given up: the watcher has nothing left to do


def _finish_without_loop(closing: Coroutine[Any, Any, Any]) -> bool:
    """Run ``closing`` to its end with no event loop; whether it got there.

    aiohttp closes a session whose loop is closed without doing any I/O (it only marks it
    closed, which silences its "Unclosed client session" warning), and aiobotocore's close
    around it only yields bare ``None``s: those are stepped through here. A coroutine that
    waits for a real future (or raises) needs its loop, and is abandoned.
    """
    for _ in range(_STEPS_WITHOUT_LOOP):
        try:
            if closing.send(None) is not None:
                break
        except StopIteration:
            return True
        except Exception as error:
            logger.debug("closing a client of a closed event loop failed: %r", error)
            return False
    closing.close()
    return False


class _WireResolution(DynamoDBStoreBase):
    """The lean transport's configuration, resolved once per store."""

    _wire_config: WireConfig | None = None

    def _resolve_wire(self) -> WireConfig | None:
        """The configuration, or ``None`` (and the store on the SDK from now on) when the
        lean transport cannot carry the store's settings. Raises ``NoRegionError`` as
        botocore's client creation does."""
        if self._wire_config is None:
            import botocore.session

            config = resolve(self._settings, botocore.session.Session())
            if config is None:
                self._lean = False
            self._wire_config = config
        return self._wire_config


class AsyncClients(_WireResolution):
    """aioboto3 clients, one DynamoDB client (and S3 client, for overflowing responses) per
    event loop that uses the store, made on first use there; the connection pool is sized
    by ``max_pool_connections``.

    An aiobotocore client only works on the loop it was made on, so a store used on another
    loop (``asyncio.run(store.create_table())`` before a server starts its own) makes a new
    client there. A loop's clients are closed when ``asyncio.run`` (or any runner that calls
    ``loop.shutdown_asyncgens()``) ends the loop, or by :meth:`aclose` on it; those of a loop
    closed without that are released, without I/O, when the store next meets a new loop.
    """

    _libraries = ("aioboto3", "aiobotocore")
    _extra = "dynamodb"

    def _init_transport(self) -> None:
        self._loops: dict[asyncio.AbstractEventLoop, _LoopClients] = {}
        self._loops_lock = threading.Lock()  # the loops may run on several threads
        # The last loop's clients: the usual single loop costs one comparison per call.
        self._current: _LoopClients | None = None

    async def client(self) -> Any:
        """The request path's DynamoDB client of the running event loop (the lean
        transport's, or aioboto3's), made on first use; both take ``put_item``,
        ``update_item``, ``delete_item``, ``get_item`` and ``transact_write_items`` as
        aioboto3's does (a lean client passes other calls to an aioboto3 client)."""
        return await self._dynamodb()

    async def awarm_up(self) -> None:
        """Create the client now (it takes a second or more on a loaded machine), so the
        first claim does not pay for it out of its lease. ``IdempotencyMiddleware`` calls
        this at ASGI lifespan start-up, on the loop that serves requests."""
        await self._dynamodb()

    async def _dynamodb(self) -> Any:
        current = self._current
        if (
            current is not None
            and current.dynamodb is not None
            and current.loop is asyncio.get_running_loop()
        ):
            return current.dynamodb
        return (await self._open()).dynamodb

    async def _s3(self) -> Any:
        """The aioboto3 S3 client of the running loop, for overflowing responses."""
        current = self._current
        if (
            current is not None
            and current.s3 is not None
            and current.loop is asyncio.get_running_loop()
        ):
            return current.s3
        clients = await self._open()
        if clients.s3 is None:
            async with clients.lock:
                if clients.s3 is None:
                    assert self._overflow is not None
                    clients.s3 = await clients.stack.enter_async_context(
                        self._new_session().client(
                            "s3", **self._settings.s3_client_arguments(self._overflow)
                        )
                    )
        return clients.s3

    def _new_session(self) -> Any:
        import aioboto3

        return self._session or aioboto3.Session()

    def _clients_for(self, loop: asyncio.AbstractEventLoop) -> _LoopClients:
        """``loop``'s clients (made empty if new); releases those of loops now closed."""
        with self._loops_lock:
            clients = self._loops.get(loop)
            if clients is None:
                clients = self._loops[loop] = _LoopClients(loop)
            self._current = clients
        self._release_closed_loops()
        return clients

    def _release_closed_loops(self) -> None:
        with self._loops_lock:
            ended = [clients for clients in self._loops.values() if clients.loop.is_closed()]
            for clients in ended:
                del self._loops[clients.loop]
        for clients in ended:
            self._forget(clients)
            self._drop(clients)

    async def _admin_dynamodb(self) -> Any:
        """The aioboto3 DynamoDB client of the running loop for what the lean transport does
        not carry (table administration); the request path's client when that is the SDK's."""
        clients = await self._open()
        if not self._lean:
            return clients.dynamodb
        if clients.admin is None:
            async with clients.lock:
                if clients.admin is None:
                    clients.admin = await clients.stack.enter_async_context(self._new_sdk())
                    forward_sdk_events(clients.admin, lambda: events_of(clients.dynamodb))
        return clients.admin

    def _new_sdk(self) -> Any:
        return self._new_session().client(
            "dynamodb", **self._settings.client_arguments(self._client_kwargs)
        )

    async def _new_dynamodb(self) -> Any:
        """The request path's client, as an async context manager."""
        if self._lean:
            with self._loops_lock:
                config = self._resolve_wire()
            if config is not None:
                from aiobotocore.session import AioSession

                from .dynamodb_wire_async import AsyncWireClient

                credentials = await AioSession().get_credentials()
                return AsyncWireClient(config, credentials, self._admin_dynamodb)
        return self._new_sdk()

    async def _open(self) -> _LoopClients:
        clients = self._clients_for(asyncio.get_running_loop())
        async with clients.lock:
            if clients.dynamodb is None:
                clients.dynamodb = await clients.stack.enter_async_context(
                    await self._new_dynamodb()
                )
                # Once there is something to close (a failed creation, say for want of a
                # region, is retried on the same clients: one watcher each).
                await self._watch(clients)
        self._client = clients.dynamodb  # the last loop's client, as the sync store has one
        return clients

    async def _watch(self, clients: _LoopClients) -> None:
        """Start the watcher that closes ``clients`` when their loop shuts down."""
        watcher = self._until_loop_ends(clients)
        await watcher.__anext__()  # runs to its yield at once
        clients.watcher = watcher

    async def _until_loop_ends(self, clients: _LoopClients) -> AsyncGenerator[None, None]:
        # An async generator left suspended for the loop's lifetime: the loop closes it
        # before it closes (shutdown_asyncgens), the last moment its clients can be closed
        # on it, with their connections. asyncio has no other hook for a loop's end.
        try:
            yield
        finally:
            if not clients.dropped:
                clients.dropped = True
                self._forget(clients)
                await clients.stack.aclose()

    def _forget(self, clients: _LoopClients) -> None:
        with self._loops_lock:
            if self._loops.get(clients.loop) is clients:
                del self._loops[clients.loop]
            if self._current is clients:
                self._current = None
                self._client = None

    def _drop(self, clients: _LoopClients) -> None:
        """Release the clients of a loop that closed without closing them: nothing can run
        on it, but the sessions can still be marked closed (no "Unclosed" warnings), and the
        watcher finished (its loop can no longer finalize it)."""
        clients.dropped = True
        _finish_without_loop(clients.stack.aclose())
        if clients.watcher is not None:
            _finish_without_loop(clients.watcher.aclose())

    async def _read_body(self, body: Any) -> bytes:
        async with body as stream:
            data: bytes = await stream.read()
        return data

    async def aclose(self) -> None:
        """Release the running loop's clients and their connections (and those of loops
        already closed). The store stays usable: the next call makes new clients."""
        with self._loops_lock:
            clients = self._loops.get(asyncio.get_running_loop())
        self._release_closed_loops()
        if clients is None or clients.dropped:
            return
        clients.dropped = True
        self._forget(clients)
        try:
            await clients.stack.aclose()
        finally:
            if clients.watcher is not None:
                await clients.watcher.aclose()  # ends at once: its clients are closed

    async def __aenter__(self: AsyncSelf) -> AsyncSelf:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class SyncClients(_WireResolution):
    """boto3 clients (or the lean transport's for the request path), created on first use
    and reused (both are thread-safe); the connection pool is sized by
    ``max_pool_connections``."""

    _libraries = ("boto3", "botocore")
    _extra = "boto3"

    def _init_transport(self) -> None:
        self._client_lock = threading.Lock()
        self._admin_client: Any = None

    @property
    def client(self) -> Any:
        """The request path's DynamoDB client (the lean transport's, or boto3's), created
        once; both take ``put_item``, ``update_item``, ``delete_item``, ``get_item`` and
        ``transact_write_items`` as boto3 does."""
        return self._dynamodb()

    def warm_up(self) -> None:
        """Create the client now, so the first claim does not pay for it out of its lease.
        Call it in each worker process after it starts (post-fork), not before forking."""
        self._dynamodb()

    def _dynamodb(self) -> Any:
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._new_dynamodb()
        return self._client

    def _new_dynamodb(self) -> Any:
        if self._lean:
            config = self._resolve_wire()
            if config is not None:
                import botocore.session

                from .dynamodb_wire_sync import SyncWireClient

                credentials = botocore.session.Session().get_credentials()
                return SyncWireClient(config, credentials, self._admin_dynamodb)
        return self._new_sdk()

    def _new_sdk(self) -> Any:
        import boto3

        session = self._session or boto3.session.Session()
        return session.client("dynamodb", **self._settings.client_arguments(self._client_kwargs))

    def _admin_dynamodb(self) -> Any:
        """The boto3 DynamoDB client for what the lean transport does not carry (table
        administration); the request path's client when that is boto3's."""
        if not self._lean:
            return self._dynamodb()
        if self._admin_client is None:
            with self._client_lock:
                if self._admin_client is None:
                    admin = self._new_sdk()
                    forward_sdk_events(admin, lambda: events_of(self._client))
                    self._admin_client = admin
        return self._admin_client

    def _s3(self) -> Any:
        """The boto3 S3 client for overflowing responses, created once."""
        if self._s3_client is None:
            with self._client_lock:
                if self._s3_client is None:
                    import boto3

                    assert self._overflow is not None
                    session = self._session or boto3.session.Session()
                    self._s3_client = session.client(
                        "s3", **self._settings.s3_client_arguments(self._overflow)
                    )
        return self._s3_client

    def _read_body(self, body: Any) -> bytes:
        data: bytes = body.read()
        return data

    def close(self) -> None:
        """Release the clients' connections. The store cannot be used afterwards."""
        with self._client_lock:
            for client in (self._client, self._admin_client, self._s3_client):
                if client is not None:
                    client.close()
            self._client = self._admin_client = self._s3_client = None

    def __enter__(self: SyncSelf) -> SyncSelf:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
