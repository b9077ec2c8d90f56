"""The lean DynamoDB client for one event loop: kept-alive asyncio stream connections.

``await client.put_item(**params)`` takes and returns what aiobotocore's does and raises what
it raises, for the five calls of the request path; the request and answer handling is in
``dynamodb_wire``. HTTP/1.1 is spoken here directly (one request at a time per connection,
bodies by ``Content-Length`` or chunked): DynamoDB needs nothing more, and aiohttp's
per-request machinery costs more CPU than the whole call should.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from . import wire
from .config import WireConfig
from .wire_events import ClientMeta, OperationName, SentRequest
from .wire_retry import RetryPolicy

_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

# What a dropped connection raises while sending or reading (botocore: ConnectionClosedError).
_CLOSED = (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, EOFError)
_STREAM_LIMIT = 1 << 20  # a response head is far smaller; bodies are read by length


async def _connect_within(seconds: float, opening: Awaitable[_Stream]) -> _Stream:
    try:
        return await asyncio.wait_for(opening, seconds)
    except asyncio.TimeoutError as error:  # not the builtin TimeoutError before 3.11
        raise TimeoutError(f"no connection within {seconds} s") from error


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status, headers = wire.parse_head(await reader.readuntil(b"\r\n\r\n"))
    length = headers.get("content-length")
    if length is not None:
        return status, headers, await reader.readexactly(int(length))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return status, headers, await _chunked(reader)
    headers["connection"] = "close"  # the body runs to the end of the connection
    return status, headers, await reader.read()


class AsyncWireClient:
    """aiobotocore's DynamoDB ``put_item``, ``update_item``, ``delete_item``, ``get_item``
    and ``transact_write_items``, sent directly, on the event loop that made it: each call
    takes a connection of its own (at most ``max_pool_connections`` kept idle).

    Any other method (``describe_table`` ...) is called on the aiobotocore client ``sdk``
    returns, so the client stands in for aiobotocore's wherever code calls one."""

    def __init__(
        self,
        config: WireConfig,
        credentials: Any,
        sdk: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self._sdk = sdk
        self._config = config
        self._credentials = credentials  # aiobotocore credentials, or None: none found
        self._signer = wire.Signer(config.endpoint, config.region)
        self._retry = RetryPolicy(config.max_attempts)
        self._idle: list[_Stream] = []
        self.meta = ClientMeta(config.endpoint.url, config.region)
        endpoint = config.endpoint
        self._request_line = f"POST {endpoint.path} HTTP/1.1\r\n".encode()
        # Made in a coroutine: its connections belong to this loop, as an aiohttp session's.
        self._loop = asyncio.get_running_loop()

    def __getattr__(self, name: str) -> Any:
        sdk = self.__dict__.get("_sdk")
        if sdk is None or name.startswith("_"):
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await getattr(await sdk(), name)(*args, **kwargs)

        return call

    async def put_item(self, **params: Any) -> dict[str, Any]:
        """PutItem, as aiobotocore's ``put_item``."""
        return await self._call("PutItem", params)

    async def update_item(self, **params: Any) -> dict[str, Any]:
        """UpdateItem, as aiobotocore's ``update_item``."""
        return await self._call("UpdateItem", params)

    async def delete_item(self, **params: Any) -> dict[str, Any]:
        """DeleteItem, as aiobotocore's ``delete_item``."""
        return await self._call("DeleteItem", params)

    async def get_item(self, **params: Any) -> dict[str, Any]:
        """GetItem, as aiobotocore's ``get_item``."""
        return await self._call("GetItem", params)

    async def transact_write_items(self, **params: Any) -> dict[str, Any]:
        """TransactWriteItems, as aiobotocore's ``transact_write_items``."""
        return await self._call("TransactWriteItems", params)

    async def __aenter__(self) -> AsyncWireClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the idle connections; works on a closed loop too (no I/O awaited)."""
        idle, self._idle = self._idle, []
        for _, writer in idle:
            _abort(writer)

    # -- one call: attempts, backoff --------------------------------------------------

    async def _frozen(self) -> wire.Frozen:
        if self._credentials is None:
            from botocore.exceptions import NoCredentialsError

            raise NoCredentialsError()
        frozen = await self._credentials.get_frozen_credentials()
        return wire.Frozen(frozen.access_key, frozen.secret_key, frozen.token)

    def _check_loop(self) -> None:
        # Used off its loop, pooled connections would wait on futures no loop resolves: fail
        # as aiohttp does, in words translate_error classifies as ``loop_closed``.
        if asyncio.get_running_loop() is not self._loop:
            if self._loop.is_closed():
                raise RuntimeError("Event loop is closed")
            raise RuntimeError("the lean DynamoDB client is attached to a different loop")

    async def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        self._check_loop()
        body = wire.encode(params)
        target = wire.TARGET_PREFIX + operation
        events = self.meta.events
        if events:
            events.emit(
                f"before-call.dynamodb.{operation}",
                model=OperationName(operation),
                params=params,
            )
        attempt, cost = 1, 0
        while True:
            headers = self._signer.headers(target, body, await self._frozen())
            if events:
                request = SentRequest(self._config.endpoint_url, "POST", headers, body)
                events.emit(f"before-send.dynamodb.{operation}", request=request)
            try:
                answer = await self._exchange(headers, body)
            except Exception as error:
                delay, cost = self._retry.after_exception(attempt, error)
                if delay is None:
                    raise
            else:
                delay, retry_cost = self._retry.after_answer(attempt, answer)
                if delay is None:
                    if answer.status < 300:
                        self._retry.succeeded(cost)
                        return wire.parse_success(answer, attempt)
                    exhausted = retry_cost > 0
                    raise wire.client_error(answer, operation, attempt, exhausted)
                cost = retry_cost
            await asyncio.sleep(delay)
            attempt += 1

    # -- one attempt: a connection, a request, an answer ------------------------------

    async def _connection(self) -> _Stream:
        while self._idle:
            stream = self._idle.pop()
            reader, writer = stream
            # The server closed it while idle (EOF seen by the loop), or it is closing.
            if not reader.at_eof() and not writer.is_closing():
                return stream
            _abort(writer)
        return await self._connect()

    async def _connect(self) -> _Stream:
        from botocore import exceptions as boto

        config = self._config
        endpoint = config.endpoint
        opening = asyncio.open_connection(
            endpoint.host,
            endpoint.port,
            ssl=config.ssl_context,
            server_hostname=endpoint.host if config.ssl_context else None,
            limit=_STREAM_LIMIT,
        )
        try:
            # wait_for: a task per connection, but connections are rare (pooled) and its
            # cancellation cannot leak into the caller's task.
            return await _connect_within(config.connect_timeout, opening)
        except TimeoutError as error:
            raise boto.ConnectTimeoutError(
                endpoint_url=endpoint.request_url, error=error
            ) from error
        except ssl.SSLError as error:
            raise boto.SSLError(endpoint_url=endpoint.request_url, error=error) from error
        except OSError as error:
            raise boto.EndpointConnectionError(
                endpoint_url=endpoint.request_url, error=error
            ) from error

    async def _read_within(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[int, dict[str, str], bytes]:
        """The answer, or ``TimeoutError`` after ``read_timeout``. The timer aborts the
        connection rather than cancelling the task (as ``asyncio.timeout`` would): a
        cancellation racing an answer that arrived in the same loop iteration would outlive
        the call and cancel the caller's next await."""
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            writer.transport.abort()

        timer = self._loop.call_later(self._config.read_timeout, expire)
        try:
            return await _read_answer(reader)
        except Exception as error:
            if expired:
                raise TimeoutError(f"no answer within {self._config.read_timeout} s") from error
            raise
        finally:
            timer.cancel()

    async def _exchange(self, headers: dict[str, str], body: bytes) -> wire.Answer:
        from botocore import exceptions as boto

        reader, writer = await self._connection()
        head = wire.request_head(self._request_line, headers)
        url = self._config.endpoint_url
        try:
            writer.write(head + body)
            status, answer_headers, data = await self._read_within(reader, writer)
        except TimeoutError as error:
            _abort(writer)
            raise boto.ReadTimeoutError(endpoint_url=url, error=error) from error
        except _CLOSED as error:
            _abort(writer)
            raise boto.ConnectionClosedError(endpoint_url=url, error=error) from error
        except (OSError, ValueError) as error:
            _abort(writer)
            raise boto.HTTPClientError(error=error) from error
        except BaseException:  # cancelled mid-answer: the connection's state is unknown
            _abort(writer)
            raise
        if (
            not wire.keeps_alive(answer_headers)
            or len(self._idle) >= self._config.max_pool_connections
        ):
            _abort(writer)
        else:
            self._idle.append((reader, writer))
        return wire.Answer(status, answer_headers, data)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Drop a connection at once, without awaiting its close (its loop may be gone)."""
    # On a closed loop asyncio cannot close a transport (it schedules the close on the
    # loop): the garbage collector releases the socket then, as it does aiohttp's.
    with contextlib.suppress(RuntimeError):
        writer.transport.abort()
