"""The lean DynamoDB clients' ``meta``: the endpoint, the region, and the subset of
botocore's event system they emit (``before-call``, ``before-send``), so instrumentation and
tests registering on ``client.meta.events`` see every call and attempt as on boto3."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class OperationName(NamedTuple):
    """What an event's ``model`` argument offers: the operation's ``name``."""

    name: str


class Events:
    """The subset of botocore's event system the lean clients emit: ``before-call`` (with
    ``model`` and ``params``) and ``before-send`` (with ``request``, whose ``headers`` and
    ``body`` are what goes out), so instrumentation and tests registering on
    ``client.meta.events`` see every call and every attempt as with botocore."""

    def __init__(self) -> None:
        self._handlers: list[tuple[str, Callable[..., Any]]] = []

    def register(self, event_name: str, handler: Callable[..., Any], **_: Any) -> None:
        """Call ``handler`` for events named ``event_name`` or under it."""
        self._handlers.append((event_name, handler))

    def unregister(
        self, event_name: str, handler: Callable[..., Any] | None = None, **_: Any
    ) -> None:
        """Stop calling ``handler`` (every handler, when ``None``) for ``event_name``."""
        self._handlers = [
            (name, known)
            for name, known in self._handlers
            if name != event_name or (handler is not None and known != handler)
        ]

    def __bool__(self) -> bool:
        return bool(self._handlers)

    def emit(self, event_name: str, **kwargs: Any) -> None:
        """Call every handler registered on ``event_name`` or a prefix of it."""
        for name, handler in list(self._handlers):
            if event_name == name or event_name.startswith(name + "."):
                handler(event_name=event_name, **kwargs)


def events_of(client: Any) -> Events | None:
    """A lean client's events (``None`` for an SDK client, or none)."""
    events = getattr(getattr(client, "meta", None), "events", None)
    return events if isinstance(events, Events) else None


def forward_sdk_events(sdk: Any, lean_events: Callable[[], Events | None]) -> None:
    """Let handlers registered on a lean client's ``meta.events`` hear the calls its store
    makes on the SDK client beside it (table administration), as they would on one boto3
    client."""

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
    """``client.meta`` of a lean client: the endpoint, the region and the events."""

    def __init__(self, endpoint_url: str, region_name: str) -> None:
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.service_model = OperationName("dynamodb")
        self.events = Events()
