"""The two DynamoDB client flavours: aioboto3 (async) and boto3 (sync).

Everything that differs between the flavours beyond ``async``/``await`` lives here, in two
small bases: how a client is created, closed and entered as a context manager, and how an S3
body is read. ``AsyncDynamoDBStore`` (``dynamodb_async.py``) is written once on
:class:`AsyncClients`; ``scripts/unasync.py`` derives ``DynamoDBStore`` (``dynamodb_sync.py``)
on :class:`SyncClients` from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Any, TypeVar

from .dynamodb import DynamoDBStoreBase

AsyncSelf = TypeVar("AsyncSelf", bound="AsyncClients")
SyncSelf = TypeVar("SyncSelf", bound="SyncClients")


class AsyncClients(DynamoDBStoreBase):
    """aioboto3 clients, created on first use and reused for the life of the store; the
    connection pool is sized by ``max_pool_connections``. The clients belong to the event
    loop that first used them, as aiobotocore clients do."""

    def _init_transport(self) -> None:
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._client_lock: asyncio.Lock | None = None

    async def client(self) -> Any:
        """The aioboto3 DynamoDB client, created once."""
        return await self._dynamodb()

    async def awarm_up(self) -> None:
        """Create the client now (it takes a second or more on a loaded machine), so the
        first claim does not pay for it out of its lease. ``IdempotencyMiddleware`` calls
        this at ASGI lifespan start-up, on the loop that serves requests."""
        await self._dynamodb()

    async def _dynamodb(self) -> Any:
        if self._client is not None:
            return self._client
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:
            if self._client is None:
                import aioboto3

                session = self._session or aioboto3.Session()
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    session.client(
                        "dynamodb", **self._settings.client_arguments(self._client_kwargs)
                    )
                )
                self._exit_stack = stack
        return self._client

    async def _s3(self) -> Any:
        """The aioboto3 S3 client for overflowing responses, created once."""
        if self._s3_client is not None:
            return self._s3_client
        await self._dynamodb()  # creates the exit stack and the lock
        assert self._client_lock is not None and self._exit_stack is not None
        async with self._client_lock:
            if self._s3_client is None:
                import aioboto3

                assert self._overflow is not None
                session = self._session or aioboto3.Session()
                self._s3_client = await self._exit_stack.enter_async_context(
                    session.client("s3", **self._settings.s3_client_arguments(self._overflow))
                )
        return self._s3_client

    async def _read_body(self, body: Any) -> bytes:
        async with body as stream:
            data: bytes = await stream.read()
        return data

    async def aclose(self) -> None:
        """Release the clients and their connections."""
        stack, self._exit_stack = self._exit_stack, None
        self._client = self._s3_client = None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self: AsyncSelf) -> AsyncSelf:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class SyncClients(DynamoDBStoreBase):
    """boto3 clients, created on first use and reused (boto3 clients are thread-safe); the
    connection pool is sized by ``max_pool_connections``."""

    def _init_transport(self) -> None:
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 DynamoDB client, created once."""
        return self._dynamodb()

    def warm_up(self) -> None:
        """Create the client now, so the first claim does not pay for it out of its lease.
        Call it in each worker process after it starts (post-fork), not before forking."""
        self._dynamodb()

    def _dynamodb(self) -> Any:
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    import boto3

                    session = self._session or boto3.session.Session()
                    self._client = session.client(
                        "dynamodb", **self._settings.client_arguments(self._client_kwargs)
                    )
        return self._client

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
            for client in (self._client, self._s3_client):
                if client is not None:
                    client.close()
            self._client = self._s3_client = None

    def __enter__(self: SyncSelf) -> SyncSelf:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
