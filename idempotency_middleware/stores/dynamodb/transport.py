"""The DynamoDB transports, sync (boto3) and async (aioboto3): send the flows' requests
(``wire.OPERATIONS`` on the lean client unless configured otherwise; table administration
and S3 on SDK clients) and do their waits by the store's clock. The async one keeps a set of
clients per event loop: an aiobotocore client, like a lean one, only works on its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..kit import Flow, LoopLocal, adrive, drive, finish_without_loop
from .config import DynamoDBConfig, WireConfig, resolve
from .errors import ConditionFailed, store_errors, translate_error
from .ops import CLAIMING, S3, Backoff, Call
from .wire import OPERATIONS, Declined
from .wire_client import WireClient, events_of, forward_sdk_events

T = TypeVar("T")
ADMIN = "admin"  # the SDK's DynamoDB client beside a lean one, for table administration


def _taken(service: str, result: Any) -> Any:
    """A lean client's answer to ``declining``: a declined condition is the flows'
    ``ConditionFailed`` at once (on the SDK, ``translate_error`` makes it of a ClientError),
    the answer of a call sent as ``CLAIMING``, raised for any other (see ``ops``)."""
    if type(result) is Declined:
        failed = ConditionFailed(result.item)
        if service == CLAIMING:
            return failed
        raise failed
    return result


class _Transport:
    """What both flavours share: the configuration, and the lean one resolved once."""

    def __init__(self, config: DynamoDBConfig) -> None:
        self._config = config
        self._lean = config.lean
        self._wire: WireConfig | None = None
        self._errors = store_errors()
        self._lock = threading.Lock()

    def _resolve_wire(self) -> WireConfig | None:
        if self._wire is None:
            import botocore.session

            self._wire = resolve(self._config.settings, botocore.session.Session())
            if self._wire is None:
                self._lean = False
        return self._wire

    def _failed(self, service: str, operation: str, error: BaseException) -> Exception:
        if service == S3:
            return translate_error(f"S3 {operation}", error)
        return translate_error(operation, error, self._config.table_name)

    def _sdk(self, session: Any, name: str) -> Any:
        settings = self._config.settings
        if name == S3:
            return session.client(S3, **settings.client_arguments({}, self._config.overflow))
        return session.client("dynamodb", **settings.client_arguments(self._config.client_kwargs))


class SyncTransport(_Transport):
    """boto3 clients (or the lean one for the request path), made on first use and reused
    (both are thread-safe). Flows only run blocking: ``arun`` refuses them."""

    def __init__(self, config: DynamoDBConfig) -> None:
        super().__init__(config)
        self.client: Any = None  # the request path's
        self._others: dict[str, Any] = {}  # ADMIN, S3

    def run(self, operation: str, flow: Flow[T]) -> T:
        return drive(flow, self.send)

    async def arun(self, operation: str, flow: Flow[T]) -> T:
        flow.close()
        raise TypeError(f"DynamoDBStore is sync: call its {operation}()")

    def send(self, request: Call | Backoff) -> Any:
        if isinstance(request, Backoff):
            return self._config.clock.sleep(request.seconds)
        service, operation, params = request
        try:
            if service == S3:
                result: dict[str, Any] = getattr(self._other(S3), operation)(**params)
                if operation == "get_object":
                    result["Blob"] = result["Body"].read()
                return result
            if operation not in OPERATIONS:
                return getattr(self.admin(), operation)(**params)
            client = self.client or self.dynamodb()
            if isinstance(client, WireClient):
                return _taken(service, client.declining(operation, params))
            return getattr(client, operation)(**params)
        except self._errors as error:
            raise self._failed(service, operation, error) from error

    def dynamodb(self) -> Any:
        if self.client is None:
            with self._lock:
                if self.client is None:
                    self.client = self._new_dynamodb()
        return self.client

    def _new_dynamodb(self) -> Any:
        if self._lean:
            config = self._resolve_wire()
            if config is not None:
                import botocore.session

                from .wire_sync import SyncWireClient

                credentials = botocore.session.Session().get_credentials()
                return SyncWireClient(config, credentials, self.admin)
        return self._sdk(self._session(), "dynamodb")

    def _session(self) -> Any:
        import boto3

        return self._config.session or boto3.session.Session()

    def admin(self) -> Any:
        """The boto3 client for table administration (the request path's, if boto3's)."""
        return self._other(ADMIN) if self._lean else self.dynamodb()

    def _other(self, name: str) -> Any:
        client = self._others.get(name)
        if client is None:
            with self._lock:
                client = self._others.get(name)
                if client is None:
                    client = self._others[name] = self._sdk(self._session(), name)
                    if name == ADMIN:
                        forward_sdk_events(client, lambda: events_of(self.client))
        return client

    def close(self) -> None:
        with self._lock:
            for client in (self.client, *self._others.values()):
                if client is not None:
                    client.close()
            self.client = None
            self._others.clear()

    async def aclose(self) -> None:
        self.close()


@dataclass(slots=True)
class _LoopClients:
    """The clients of one event loop, and what guards them: aiohttp sessions, and an
    ``asyncio.Lock``, each belong to the loop they were made on."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    dynamodb: Any = None  # the request path's client (lean or SDK)
    others: dict[str, Any] = field(default_factory=dict)  # ADMIN, S3


class AsyncTransport(_Transport):
    """aioboto3 clients (or the lean one for the request path), one set per event loop, made
    on first use there. Flows only run awaited: ``run`` refuses them."""

    def __init__(self, config: DynamoDBConfig) -> None:
        super().__init__(config)
        self.clients: LoopLocal[_LoopClients] = LoopLocal(
            self._open, self._close, lambda clients: finish_without_loop(clients.stack.aclose())
        )

    def run(self, operation: str, flow: Flow[T]) -> T:
        flow.close()
        raise TypeError(f"AsyncDynamoDBStore is async: await its a{operation}()")

    async def arun(self, operation: str, flow: Flow[T]) -> T:
        return await adrive(flow, self.send)

    async def send(self, request: Call | Backoff) -> Any:
        if isinstance(request, Backoff):
            return await self._config.clock.asleep(request.seconds)
        service, operation, params = request
        try:
            clients = await self.clients.get()
            if service == S3:
                s3 = await self._other(clients, S3)
                result: dict[str, Any] = await getattr(s3, operation)(**params)
                if operation == "get_object":
                    async with result["Body"] as stream:
                        result["Blob"] = await stream.read()
                return result
            if operation in OPERATIONS:
                client = clients.dynamodb
                if isinstance(client, WireClient):
                    return _taken(service, await client.declining(operation, params))
                return await getattr(client, operation)(**params)
            return await getattr(await self._admin(clients), operation)(**params)
        except self._errors as error:
            raise self._failed(service, operation, error) from error

    async def client(self) -> Any:
        return (await self.clients.get()).dynamodb

    def _session(self) -> Any:
        import aioboto3

        return self._config.session or aioboto3.Session()

    async def _open(self) -> _LoopClients:
        clients = _LoopClients()
        try:
            clients.dynamodb = await clients.stack.enter_async_context(
                await self._new_dynamodb(clients)
            )
        except BaseException:
            await clients.stack.aclose()
            raise
        return clients

    async def _close(self, clients: _LoopClients) -> None:
        await clients.stack.aclose()

    async def _new_dynamodb(self, clients: _LoopClients) -> Any:  # an async context manager
        if self._lean:
            with self._lock:
                config = self._resolve_wire()
            if config is not None:
                from aiobotocore.session import AioSession

                from .wire_async import AsyncWireClient

                credentials = await AioSession().get_credentials()
                return AsyncWireClient(config, credentials, lambda: self._admin(clients))
        return self._sdk(self._session(), "dynamodb")

    async def _admin(self, clients: _LoopClients) -> Any:
        return await self._other(clients, ADMIN) if self._lean else clients.dynamodb

    async def _other(self, clients: _LoopClients, name: str) -> Any:
        async with clients.lock:
            if name not in clients.others:
                made = self._sdk(self._session(), name)  # an async context manager
                client = clients.others[name] = await clients.stack.enter_async_context(made)
                if name == ADMIN:
                    forward_sdk_events(client, lambda: events_of(clients.dynamodb))
        return clients.others[name]

    def close(self) -> None:
        self.clients.release_closed_loops()

    async def aclose(self) -> None:
        await self.clients.aclose()
