"""What the two lean DynamoDB clients (``wire_sync``, ``wire_async``) share: the five calls,
signing, the retry decisions, failures mapped to botocore's exceptions, and ``meta``. The
clients only do the I/O."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, NamedTuple

from . import wire
from .config import WireConfig
from .wire_retry import RetryPolicy


class OperationName(NamedTuple):
    """What an event's ``model`` argument offers: the operation's ``name``."""

    name: str


class Events:
    """The subset of botocore's event system the lean clients emit, ``before-call`` (``model``,
    ``params``) and ``before-send`` (``request``), so instrumentation registering on
    ``client.meta.events`` sees every call and every attempt as with botocore."""

    def __init__(self) -> None:
        self._handlers: list[tuple[str, Callable[..., Any]]] = []

    def register(self, event_name: str, handler: Callable[..., Any], **_: Any) -> None:
        self._handlers.append((event_name, handler))

    def unregister(
        self, event_name: str, handler: Callable[..., Any] | None = None, **_: Any
    ) -> None:
        self._handlers = [
            (name, known)
            for name, known in self._handlers
            if name != event_name or (handler is not None and known != handler)
        ]

    def __bool__(self) -> bool:
        return bool(self._handlers)

    def emit(self, event_name: str, **kwargs: Any) -> None:
        for name, handler in list(self._handlers):
            if event_name == name or event_name.startswith(name + "."):
                handler(event_name=event_name, **kwargs)


def events_of(client: Any) -> Events | None:
    events = getattr(getattr(client, "meta", None), "events", None)
    return events if isinstance(events, Events) else None


def forward_sdk_events(sdk: Any, lean_events: Callable[[], Events | None]) -> None:
    """Let handlers on a lean client's ``meta.events`` hear the calls its store makes on the
    SDK client beside it (table administration), as they would on one boto3 client."""

    def forward(event_name: str, **kwargs: Any) -> None:
        events = lean_events()
        if events:
            events.emit(event_name, **kwargs)

    for name in ("before-call.dynamodb", "before-send.dynamodb"):
        sdk.meta.events.register(name, forward)


class SentRequest(NamedTuple):
    """The ``request`` of a ``before-send`` event."""

    url: str
    method: str
    headers: dict[str, str]
    body: bytes


class ClientMeta:
    """``client.meta`` of a lean client."""

    def __init__(self, endpoint_url: str, region_name: str) -> None:
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.service_model = OperationName("dynamodb")
        self.events = Events()


class WireClient:
    """The SDK client's five calls of the request path, sent directly (a subclass does I/O)."""

    def __init__(self, config: WireConfig, credentials: Any, sdk: Any = None) -> None:
        self._sdk = sdk  # the SDK client's maker, for any other call
        self._config = config
        self._credentials = credentials  # botocore's (or aiobotocore's), or None: none found
        self._signer = wire.Signer(config.endpoint, config.region)
        self._retry = RetryPolicy(config.max_attempts)
        self.meta = ClientMeta(config.endpoint.url, config.region)
        self._request_line = f"POST {config.endpoint.path} HTTP/1.1\r\n".encode()

    def _call(self, operation: str, params: dict[str, Any], declines: bool = False) -> Any:
        raise NotImplementedError

    def declining(self, method: str, params: dict[str, Any]) -> Any:
        """The stores' entry: the SDK method ``method`` (one of ``wire.OPERATIONS``), except
        that a failed condition answers ``wire.Declined`` instead of raising botocore's
        ``ClientError``. A replay's claim fails its condition every time: no exception is
        built, raised and translated for it."""
        return self._call(wire.OPERATIONS[method], params, True)

    # The SDK client's methods of the same names.
    def put_item(self, **params: Any) -> Any:
        return self._call("PutItem", params)

    def update_item(self, **params: Any) -> Any:
        return self._call("UpdateItem", params)

    def delete_item(self, **params: Any) -> Any:
        return self._call("DeleteItem", params)

    def get_item(self, **params: Any) -> Any:
        return self._call("GetItem", params)

    def transact_write_items(self, **params: Any) -> Any:
        return self._call("TransactWriteItems", params)

    def _start(self, operation: str, params: dict[str, Any]) -> tuple[str, bytes]:
        if self.meta.events:
            model = OperationName(operation)
            self.meta.events.emit(f"before-call.dynamodb.{operation}", model=model, params=params)
        if self._credentials is None:
            from botocore.exceptions import NoCredentialsError

            raise NoCredentialsError()
        return wire.TARGET_PREFIX + operation, wire.encode(params)

    def _sign(self, operation: str, target: str, body: bytes, frozen: Any) -> dict[str, str]:
        """One attempt's headers, signed with ``frozen`` (shaped as ``wire.Frozen``)."""
        headers = self._signer.headers(target, body, frozen)
        if self.meta.events:
            request = SentRequest(self._config.endpoint.request_url, "POST", headers, body)
            self.meta.events.emit(f"before-send.dynamodb.{operation}", request=request)
        return headers

    def _judge(
        self, operation: str, attempt: int, cost: int, answer: wire.Answer, declines: bool
    ) -> tuple[float | None, int, Any]:
        """Seconds to wait before the next attempt and the quota that retry took, or
        ``(None, 0, result)`` to answer the call with; raises the failure a non-retried error
        answer means (with ``declines``, a failed condition is a ``wire.Declined`` result)."""
        if answer.status < 300:
            delay, retry_cost = self._retry.after_answer(attempt, answer)
            if delay is not None:
                return delay, retry_cost, None
            self._retry.succeeded(cost)
            return None, 0, wire.parse_success(answer, attempt)
        error = wire.read_error(answer)  # parsed once: the retry decision, then the failure
        code = error[0]
        delay, retry_cost = self._retry.after_answer(attempt, answer, code)
        if delay is not None:
            return delay, retry_cost, None
        if declines and code == wire.CONDITION_FAILED:
            return None, 0, wire.Declined.of(error[1])
        raise wire.client_error(answer, operation, attempt, retry_cost > 0, error)

    def _connect_failed(self, error: BaseException) -> None:
        """Raise botocore's exception for a connection that could not be made (returns for
        anything else: the caller raises it as it is)."""
        from botocore import exceptions as boto

        url = self._config.endpoint.request_url
        if isinstance(error, TimeoutError):
            raise boto.ConnectTimeoutError(endpoint_url=url, error=error) from error
        if isinstance(error, ssl.SSLError):
            raise boto.SSLError(endpoint_url=url, error=error) from error
        if isinstance(error, OSError):
            raise boto.EndpointConnectionError(endpoint_url=url, error=error) from error

    def _exchange_failed(
        self, error: BaseException, closed: tuple[type[BaseException], ...]
    ) -> None:
        """Raise botocore's exception for an attempt that failed mid-way (returns as
        :meth:`_connect_failed`)."""
        from botocore import exceptions as boto

        url = self._config.endpoint.request_url
        if isinstance(error, TimeoutError):
            raise boto.ReadTimeoutError(endpoint_url=url, error=error) from error
        if isinstance(error, closed):
            raise boto.ConnectionClosedError(endpoint_url=url, error=error) from error
        if isinstance(error, (OSError, ValueError)):
            raise boto.HTTPClientError(error=error) from error

    def _keep(self, headers: dict[str, str], idle: int) -> bool:
        return wire.keeps_alive(headers) and idle < self._config.max_pool_connections
