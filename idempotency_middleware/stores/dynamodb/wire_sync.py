"""The lean DynamoDB client for threads: HTTP/1.1 on kept-alive sockets in a pool (one
request at a time per connection, bodies by ``Content-Length`` or chunked). Not http.client:
its header parsing and its two sends per request cost as much CPU as the rest of the call."""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from . import wire
from .config import WireConfig
from .wire_client import WireClient

# What a dropped connection raises while sending or reading (botocore: ConnectionClosedError).
_CLOSED = (ConnectionError, EOFError, ssl.SSLEOFError, ssl.SSLZeroReturnError)
_READ_SIZE = 65536


class _Connection:
    """A kept-alive socket, and what was read past the last answer (nothing, normally)."""

    __slots__ = ("pending", "poller", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()
        # Registered once: each reuse then costs one poll(2), not a new poll object.
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def _more(self) -> None:
        data = self.sock.recv(_READ_SIZE)
        if not data:
            raise EOFError("the server closed the connection")
        self.pending += data

    def until(self, delimiter: bytes) -> bytes:  # delimiter included
        while (end := self.pending.find(delimiter)) < 0:
            self._more()
        end += len(delimiter)
        data = bytes(self.pending[:end])
        del self.pending[:end]
        return data

    def exactly(self, size: int) -> bytes:
        while len(self.pending) < size:
            self._more()
        data = bytes(self.pending[:size])
        del self.pending[:size]
        return data

    def to_end(self) -> bytes:  # until the server closes the connection
        while data := self.sock.recv(_READ_SIZE):
            self.pending += data
        data = bytes(self.pending)
        self.pending.clear()
        return data

    def dropped(self) -> bool:
        """An idle connection the server closed (readable: EOF, or bytes nobody asked for)."""
        if self.pending:
            return True
        return bool(self.poller.poll(0))

    def close(self) -> None:
        self.sock.close()


def _read_answer(connection: _Connection) -> tuple[int, dict[str, str], bytes]:
    status, headers = wire.parse_head(connection.until(b"\r\n\r\n"))
    length = headers.get("content-length")
    if length is not None:
        return status, headers, connection.exactly(int(length))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        while size := int(connection.until(b"\r\n").split(b";", 1)[0], 16):
            parts.append(connection.exactly(size))
            connection.exactly(2)
        while connection.until(b"\r\n") != b"\r\n":  # trailers
            pass
        return status, headers, b"".join(parts)
    headers["connection"] = "close"  # the body runs to the end of the connection
    return status, headers, connection.to_end()


class SyncWireClient(WireClient):
    """The boto3 DynamoDB client's five calls of the request path, sent directly; any other
    attribute (``describe_table``, ``exceptions``, waiters) is the boto3 client's that ``sdk``
    returns. Thread-safe: each call takes a connection of its own from the pool."""

    def __init__(
        self, config: WireConfig, credentials: Any, sdk: Callable[[], Any] | None = None
    ) -> None:
        super().__init__(config, credentials, sdk)
        self._idle: deque[_Connection] = deque()

    def __getattr__(self, name: str) -> Any:
        sdk = self.__dict__.get("_sdk")
        if sdk is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(sdk(), name)

    def close(self) -> None:
        """Close the idle connections (calls still running close theirs when done)."""
        while self._idle:
            self._idle.pop().close()

    def _call(self, operation: str, params: dict[str, Any], declines: bool = False) -> Any:
        target, body = self._start(operation, params)
        attempt, cost = 1, 0
        while True:
            # Cheap for static credentials; refreshes refreshable ones when they near expiry.
            frozen = self._credentials.get_frozen_credentials()
            headers = self._sign(operation, target, body, frozen)
            try:
                answer = self._exchange(headers, body)
            except Exception as error:
                delay, cost = self._retry.after_exception(attempt, error)
                if delay is None:
                    raise
            else:
                delay, cost, result = self._judge(operation, attempt, cost, answer, declines)
                if delay is None:
                    return result
            time.sleep(delay)
            attempt += 1

    def _connection(self) -> _Connection:
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                break
            if not connection.dropped():
                return connection
            connection.close()
        return self._connect()

    def _connect(self) -> _Connection:
        config = self._config
        endpoint = config.endpoint
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(
                (endpoint.host, endpoint.port), timeout=config.connect_timeout
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if config.ssl_context is not None:  # the handshake within the connect timeout
                sock = config.ssl_context.wrap_socket(sock, server_hostname=endpoint.host)
        except Exception as error:
            if sock is not None:
                sock.close()
            self._connect_failed(error)
            raise
        sock.settimeout(config.read_timeout)
        return _Connection(sock)

    def _exchange(self, headers: dict[str, str], body: bytes) -> wire.Answer:
        connection = self._connection()
        try:
            # One send: head and body in separate segments would wait on delayed ACKs.
            connection.sock.sendall(wire.request_head(self._request_line, headers) + body)
            status, answer_headers, data = _read_answer(connection)
        except BaseException as error:  # interrupted mid-answer: the state is unknown
            connection.close()
            self._exchange_failed(error, _CLOSED)
            raise
        if self._keep(answer_headers, len(self._idle)):
            self._idle.append(connection)
        else:
            connection.close()
        return wire.Answer(status, answer_headers, data)
