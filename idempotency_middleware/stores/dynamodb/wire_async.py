"""The lean DynamoDB client for one event loop: HTTP/1.1 on kept-alive asyncio streams, as
``wire_sync`` speaks it; aiohttp's per-request machinery costs more CPU than the whole call
should."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from . import wire
from .config import WireConfig
from .wire_client import WireClient

_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

# What a dropped connection raises while sending or reading (botocore: ConnectionClosedError).
_CLOSED = (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, EOFError)
_STREAM_LIMIT = 1 << 20  # a response head is far smaller; bodies are read by length


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status, headers = wire.parse_head(await reader.readuntil(b"\r\n\r\n"))
    length = headers.get("content-length")
    if length is not None:
        return status, headers, await reader.readexactly(int(length))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
            pass
        return status, headers, b"".join(parts)
    headers["connection"] = "close"  # the body runs to the end of the connection
    return status, headers, await reader.read()


class AsyncWireClient(WireClient):
    """:class:`~.wire_sync.SyncWireClient` for aiobotocore, on the event loop that made it
    (any other method is called on the aiobotocore client ``sdk`` returns)."""

    def __init__(
        self, config: WireConfig, credentials: Any, sdk: Callable[[], Awaitable[Any]] | None = None
    ) -> None:
        super().__init__(config, credentials, sdk)
        self._idle: list[_Stream] = []
        # Made in a coroutine: its connections belong to this loop, as an aiohttp session's.
        self._loop = asyncio.get_running_loop()

    def __getattr__(self, name: str) -> Any:
        sdk = self.__dict__.get("_sdk")
        if sdk is None or name.startswith("_"):
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await getattr(await sdk(), name)(*args, **kwargs)

        return call

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

    async def _call(self, operation: str, params: dict[str, Any], declines: bool = False) -> Any:
        # Used off its loop, pooled connections would wait on futures no loop resolves: fail
        # as aiohttp does, in words translate_error classifies as ``loop_closed``.
        if asyncio.get_running_loop() is not self._loop:
            if self._loop.is_closed():
                raise RuntimeError("Event loop is closed")
            raise RuntimeError("the lean DynamoDB client is attached to a different loop")
        target, body = self._start(operation, params)
        attempt, cost = 1, 0
        while True:
            frozen = await self._credentials.get_frozen_credentials()
            headers = self._sign(operation, target, body, frozen)
            try:
                answer = await self._exchange(headers, body)
            except Exception as error:
                delay, cost = self._retry.after_exception(attempt, error)
                if delay is None:
                    raise
            else:
                delay, cost, result = self._judge(operation, attempt, cost, answer, declines)
                if delay is None:
                    return result
            await asyncio.sleep(delay)
            attempt += 1

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
            try:
                return await asyncio.wait_for(opening, config.connect_timeout)
            except asyncio.TimeoutError as error:  # not the builtin TimeoutError before 3.11
                raise TimeoutError(f"no connection within {config.connect_timeout} s") from error
        except Exception as error:
            self._connect_failed(error)
            raise

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
        reader, writer = await self._connection()
        try:
            writer.write(wire.request_head(self._request_line, headers) + body)
            status, answer_headers, data = await self._read_within(reader, writer)
        except BaseException as error:  # cancelled mid-answer: the state is unknown
            _abort(writer)
            self._exchange_failed(error, _CLOSED)
            raise
        if self._keep(answer_headers, len(self._idle)):
            self._idle.append((reader, writer))
        else:
            _abort(writer)
        return wire.Answer(status, answer_headers, data)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Drop a connection at once, without awaiting its close (its loop may be gone)."""
    # On a closed loop asyncio cannot close a transport (it schedules the close on the
    # loop): the garbage collector releases the socket then, as it does aiohttp's.
    with contextlib.suppress(RuntimeError):
        writer.transport.abort()
