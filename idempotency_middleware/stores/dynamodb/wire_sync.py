"""The lean DynamoDB client for threads: kept-alive sockets in a pool, HTTP/1.1 spoken
directly (one request at a time per connection, bodies by ``Content-Length`` or chunked).

``client.put_item(**params)`` takes and returns what boto3's does and raises what it raises,
for the five calls of the request path (``dynamodb_wire.OPERATIONS``); the request and
answer handling is in ``dynamodb_wire``. Not http.client: its header parsing (the email
package) and its two sends per request cost as much CPU as the rest of the call.
"""

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
from .wire_events import ClientMeta, OperationName, SentRequest
from .wire_retry import RetryPolicy

# What a dropped connection raises while sending or reading (botocore: ConnectionClosedError).
_CLOSED = (ConnectionError, EOFError, ssl.SSLEOFError, ssl.SSLZeroReturnError)
_READ_SIZE = 65536


class _Connection:
    """A kept-alive socket, and what was read past the last answer (nothing, normally)."""

    __slots__ = ("pending", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()

    def _more(self) -> None:
        data = self.sock.recv(_READ_SIZE)
        if not data:
            raise EOFError("the server closed the connection")
        self.pending += data

    def until(self, delimiter: bytes) -> bytes:
        """The bytes up to and including ``delimiter``."""
        while (end := self.pending.find(delimiter)) < 0:
            self._more()
        end += len(delimiter)
        data = bytes(self.pending[:end])
        del self.pending[:end]
        return data

    def exactly(self, size: int) -> bytes:
        """The next ``size`` bytes."""
        while len(self.pending) < size:
            self._more()
        data = bytes(self.pending[:size])
        del self.pending[:size]
        return data

    def to_end(self) -> bytes:
        """Everything until the server closes the connection."""
        while data := self.sock.recv(_READ_SIZE):
            self.pending += data
        data = bytes(self.pending)
        self.pending.clear()
        return data

    def dropped(self) -> bool:
        """An idle connection the server closed (readable: EOF, or bytes nobody asked for)."""
        if self.pending:
            return True
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))

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


class SyncWireClient:
    """The boto3 DynamoDB client's ``put_item``, ``update_item``, ``delete_item``,
    ``get_item`` and ``transact_write_items``, sent directly. Thread-safe: each call takes a
    connection of its own from the pool (at most ``max_pool_connections`` kept idle).

    Any other attribute (``describe_table``, ``exceptions``, waiters) is the boto3 client's
    that ``sdk`` returns, so the client stands in for boto3's wherever code expects one."""

    def __init__(
        self, config: WireConfig, credentials: Any, sdk: Callable[[], Any] | None = None
    ) -> None:
        self._sdk = sdk
        self._config = config
        self._credentials = credentials  # botocore Credentials, or None: none found
        self._signer = wire.Signer(config.endpoint, config.region)
        self._retry = RetryPolicy(config.max_attempts)
        self._idle: deque[_Connection] = deque()
        self.meta = ClientMeta(config.endpoint.url, config.region)
        self._request_line = f"POST {config.endpoint.path} HTTP/1.1\r\n".encode()

    def __getattr__(self, name: str) -> Any:
        sdk = self.__dict__.get("_sdk")
        if sdk is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(sdk(), name)

    def put_item(self, **params: Any) -> dict[str, Any]:
        """PutItem, as boto3's ``put_item``."""
        return self._call("PutItem", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        """UpdateItem, as boto3's ``update_item``."""
        return self._call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        """DeleteItem, as boto3's ``delete_item``."""
        return self._call("DeleteItem", params)

    def get_item(self, **params: Any) -> dict[str, Any]:
        """GetItem, as boto3's ``get_item``."""
        return self._call("GetItem", params)

    def transact_write_items(self, **params: Any) -> dict[str, Any]:
        """TransactWriteItems, as boto3's ``transact_write_items``."""
        return self._call("TransactWriteItems", params)

    def close(self) -> None:
        """Close the idle connections (calls still running close theirs when done)."""
        while self._idle:
            self._idle.pop().close()

    # -- one call: attempts, backoff --------------------------------------------------

    def _frozen(self) -> wire.Frozen:
        if self._credentials is None:
            from botocore.exceptions import NoCredentialsError

            raise NoCredentialsError()
        # Cheap for static credentials; refreshes refreshable ones when they near expiry.
        frozen = self._credentials.get_frozen_credentials()
        return wire.Frozen(frozen.access_key, frozen.secret_key, frozen.token)

    def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
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
            headers = self._signer.headers(target, body, self._frozen())
            if events:
                request = SentRequest(self._config.endpoint_url, "POST", headers, body)
                events.emit(f"before-send.dynamodb.{operation}", request=request)
            try:
                answer = self._exchange(headers, body)
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
            time.sleep(delay)
            attempt += 1

    # -- one attempt: a connection, a request, an answer ------------------------------

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
        from botocore import exceptions as boto

        config = self._config
        endpoint = config.endpoint
        try:
            sock = socket.create_connection(
                (endpoint.host, endpoint.port), timeout=config.connect_timeout
            )
        except TimeoutError as error:
            raise boto.ConnectTimeoutError(
                endpoint_url=endpoint.request_url, error=error
            ) from error
        except OSError as error:
            raise boto.EndpointConnectionError(
                endpoint_url=endpoint.request_url, error=error
            ) from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if config.ssl_context is not None:  # the handshake within the connect timeout
                sock = config.ssl_context.wrap_socket(sock, server_hostname=endpoint.host)
        except TimeoutError as error:
            sock.close()
            raise boto.ConnectTimeoutError(
                endpoint_url=endpoint.request_url, error=error
            ) from error
        except ssl.SSLError as error:
            sock.close()
            raise boto.SSLError(endpoint_url=endpoint.request_url, error=error) from error
        except OSError as error:
            sock.close()
            raise boto.EndpointConnectionError(
                endpoint_url=endpoint.request_url, error=error
            ) from error
        sock.settimeout(config.read_timeout)
        return _Connection(sock)

    def _exchange(self, headers: dict[str, str], body: bytes) -> wire.Answer:
        from botocore import exceptions as boto

        connection = self._connection()
        url = self._config.endpoint_url
        try:
            # One send: head and body in separate segments would wait on delayed ACKs.
            connection.sock.sendall(wire.request_head(self._request_line, headers) + body)
            status, answer_headers, data = _read_answer(connection)
        except TimeoutError as error:
            connection.close()
            raise boto.ReadTimeoutError(endpoint_url=url, error=error) from error
        except _CLOSED as error:
            connection.close()
            raise boto.ConnectionClosedError(endpoint_url=url, error=error) from error
        except (OSError, ValueError) as error:
            connection.close()
            raise boto.HTTPClientError(error=error) from error
        except BaseException:  # interrupted mid-answer: the connection's state is unknown
            connection.close()
            raise
        if (
            not wire.keeps_alive(answer_headers)
            or len(self._idle) >= self._config.max_pool_connections
        ):
            connection.close()
        else:
            self._idle.append(connection)
        return wire.Answer(status, answer_headers, data)
