"""FastStream: an ``IdempotentConsumer`` as a broker middleware (Kafka, RabbitMQ, NATS, Redis).

``IdempotencyFastStreamMiddleware`` goes in a broker's or a router's ``middlewares=``. Each
delivery a subscriber receives runs through a consumer named after the subscriber's
function, and the consumer's verdict becomes the broker's answer: ``ack`` acknowledges it
(and the handler's result, or the replayed one, is published as a reply as usual),
``retry`` nacks it so the broker delivers it again (after ``retry_after``, at most 5 s,
where the broker would deliver it again at once), ``dead`` rejects it (RabbitMQ: to the
queue's dead-letter exchange; NATS JetStream: terminated; Kafka and Redis streams, which
have no dead letters: acknowledged, after ``on_exhausted``).

Importing this module imports FastStream; importing the package does not.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from faststream import BaseMiddleware
    from faststream.exceptions import IgnoredException
    from faststream.message import SourceType
except ModuleNotFoundError as missing:  # tests/unit/test_missing_extras.py
    raise ModuleNotFoundError(
        "idempotency_middleware.faststream needs faststream, which is not installed: "
        'pip install "idempotency-middleware[faststream]"',
        name="faststream",
    ) from missing

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import InvalidKeyError, KeyInProgressError
from ..events import OnEvent
from ..functions.options import CallableOptions
from ..functions.results import Serializer
from ..policy.options import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TTL_SECONDS,
    named_options,
)
from ..stores.encryption import Encryption
from ..stores.protocol import AsyncStore, SyncStore
from .consumer import IdempotentConsumer, Outcome

if TYPE_CHECKING:
    from types import TracebackType

    from faststream._internal.context.repository import ContextRepo
    from faststream.message import StreamMessage

logger = logging.getLogger(__name__)

RETRY_PAUSE_SECONDS = 5.0
"""The longest the middleware waits before a nack the broker redelivers at once (RabbitMQ's
requeue, Kafka's seek back), when the verdict says when to come back (``retry_after``)."""


# The brokers whose nack delivers the message again at once (their message classes' modules).
_REDELIVERED_AT_ONCE = ("faststream.rabbit", "faststream.kafka", "faststream.confluent")

KEY_HEADER = "Idempotency-Key"
"""The header a producer sets to name one logical operation (the default ``key`` reads it
first)."""

MessageFunction = Callable[["StreamMessage[Any]"], Any]
CountFunction = Callable[["StreamMessage[Any]"], "int | Awaitable[int | None] | None"]


def message_id(message: StreamMessage[Any]) -> str | None:
    """The broker's id of the message, the same on every delivery of it; ``None`` when the
    message carries none. Kafka: ``topic:partition:offset``; RabbitMQ: the ``message_id``
    property; NATS and Redis: a ``message_id`` header, else NATS JetStream's
    ``stream:sequence`` or a Redis stream's ``stream:entry-id``."""
    raw = message.raw_message
    if all(hasattr(raw, name) for name in ("topic", "partition", "offset")):
        return f"{raw.topic}:{raw.partition}:{raw.offset}"  # one Kafka record
    if hasattr(raw, "delivery_tag") and hasattr(raw, "message_id"):
        return str(raw.message_id) if raw.message_id else None  # aio-pika: never generated
    carried = message.headers.get("message_id")
    if carried:
        return str(carried)
    metadata = _jetstream_metadata(raw)  # a JetStream message without that header
    if metadata is not None:
        return f"{metadata.stream}:{metadata.sequence.stream}"
    entries = raw.get("message_ids") if isinstance(raw, Mapping) else None
    if isinstance(entries, list) and len(entries) == 1:  # one Redis stream entry
        entry = entries[0].decode() if isinstance(entries[0], bytes) else str(entries[0])
        return f"{raw.get('channel')}:{entry}"
    return None


def _jetstream_metadata(raw: Any) -> Any:
    """A NATS JetStream message's metadata (``None`` for anything else: nats-py raises for
    a core NATS message)."""
    if not str(getattr(raw, "reply", "") or "").startswith("$JS.ACK."):
        return None
    try:
        return raw.metadata
    except Exception:
        return None


def header_or_message_id(message: StreamMessage[Any]) -> str:
    """The default key: the producer's ``Idempotency-Key`` header when it set one (one
    logical operation, however often it was sent), else ``message_id(message)`` (one
    message, however often it was delivered). ``InvalidKeyError`` when there is neither."""
    found = _header_or_message_id_if_any(message)
    if found is None:
        raise InvalidKeyError(
            "the message has no Idempotency-Key header and no message id: set one when "
            "publishing (headers={'Idempotency-Key': ...} or message_id=...), or pass key= "
            "to IdempotencyFastStreamMiddleware"
        )
    return found


def _header_or_message_id_if_any(message: StreamMessage[Any]) -> str | None:
    """The default key, ``None`` when the message has neither (``required=False``: the
    message then runs unprotected)."""
    header = message.headers.get(KEY_HEADER)
    return str(header) if header else message_id(message)


def message_body(message: StreamMessage[Any]) -> Any:
    """The default payload: the message's body as sent (bytes), the same on every
    delivery; headers and broker metadata (a redelivered flag, a count) are left out."""
    return message.body


async def broker_delivery_count(message: StreamMessage[Any]) -> int | None:
    """How many times the broker has delivered the message, this one included, where it
    says: NATS JetStream's ``num_delivered``, a RabbitMQ quorum queue's
    ``x-delivery-count`` header (plus this delivery), a Redis stream's pending entry.
    ``None`` elsewhere (Kafka, RabbitMQ classic queues, Redis lists and channels)."""
    raw = message.raw_message
    metadata = _jetstream_metadata(raw)
    delivered = getattr(metadata, "num_delivered", None)
    if isinstance(delivered, int):
        return delivered
    previous = message.headers.get("x-delivery-count")
    if isinstance(previous, int):
        return previous + 1
    if hasattr(raw, "delivery_tag"):
        return 1 if not getattr(raw, "redelivered", False) else None
    count = getattr(message, "get_delivery_count", None)
    if count is not None and getattr(message, "group", None) is not None:
        return int(await count())
    return None


@dataclass(frozen=True)
class _Delivery:
    """What the consumer processes: the message, and the rest of the chain to run it."""

    message: StreamMessage[Any]
    call_next: Callable[[StreamMessage[Any]], Awaitable[Any]]


async def _run(delivery: _Delivery) -> Any:
    return await delivery.call_next(delivery.message)


def subscriber_name(call_next: Callable[..., Any]) -> str | None:
    """``module.qualname`` of the subscriber function at the end of the middleware chain
    (each middleware's ``consume_scope`` is a ``partial`` over the next), or ``None``."""
    call: Any = call_next
    while isinstance(call, functools.partial) and call.args:
        call = call.args[0]
    wrapper = getattr(call, "__self__", None)  # FastStream's HandlerCallWrapper.call_wrapped
    function = inspect.unwrap(getattr(wrapper, "_original_call", call))
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module or not qualname or qualname.endswith("<lambda>"):
        return None
    return f"{module}.{qualname}"


class IdempotencyFastStreamMiddleware:
    """Runs each message a subscriber receives once, and answers its broker: ack, nack
    (deliver again) or reject.

    ``key`` takes FastStream's message and returns its key (default:
    ``header_or_message_id``: the producer's ``Idempotency-Key`` header, else the broker's
    message id); ``payload`` what identifies the work (default: the body). ``name`` is the
    keys' namespace: by default each subscriber's function's ``module.qualname``, so two
    subscribers of one message keep their keys apart. ``delivery_count`` (sync or async)
    says how many times a message has been delivered (default: ``broker_delivery_count``, where
    the broker says); with ``max_attempts``, a handler failing on that delivery is
    ``dead``. The other options are ``IdempotentConsumer``'s; the store must be async.
    """

    @named_options("IdempotencyFastStreamMiddleware")
    def __init__(
        self,
        *,
        store: AsyncStore | SyncStore,
        key: MessageFunction | None = None,
        payload: MessageFunction | None = None,
        name: str | None = None,
        max_attempts: int | None = None,
        on_exhausted: Callable[[StreamMessage[Any], Exception], Any] | None = None,
        delivery_count: CountFunction | None = None,
        required: bool = True,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
        wait_seconds: float = 0,
        serializer: Serializer | None = None,
        on_store_error: str = "fail",
        replay_cache_size: int = 0,
        on_event: OnEvent = None,
        clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
        encryption: Encryption | None = None,
    ) -> None:
        for option, value in (("key", key), ("payload", payload), ("on_exhausted", on_exhausted)):
            if value is not None and not callable(value):
                raise TypeError(f"{option} must be a callable taking the message, got {value!r}")
        if delivery_count is not None and not callable(delivery_count):
            raise TypeError(f"delivery_count must be a callable, got {delivery_count!r}")
        options = CallableOptions(
            store=store,
            name=name,
            required=required,
            ttl_seconds=ttl_seconds,
            lock_timeout_seconds=lock_timeout_seconds,
            wait_seconds=wait_seconds,
            serializer=serializer,
            on_store_error=on_store_error,
            replay_cache_size=replay_cache_size,
            on_event=on_event,
            clock=clock,
            clock_skew_seconds=clock_skew_seconds,
            encryption=encryption,
        )
        message_key = key or (header_or_message_id if required else _header_or_message_id_if_any)
        message_payload = payload or message_body
        hook = on_exhausted
        # Built now, so bad options fail at start-up, once: each subscriber's consumer is a
        # copy of it under the subscriber's name.
        self._prototype = IdempotentConsumer._of(
            _run,
            options,
            key=lambda delivery: message_key(delivery.message),
            payload=lambda delivery: message_payload(delivery.message),
            max_attempts=max_attempts,
            on_exhausted=None
            if hook is None
            else (lambda delivery, error: hook(delivery.message, error)),
            name=name or "faststream",
        )
        self._name = name
        self._clock = clock
        self._wait_seconds = wait_seconds
        self._count: CountFunction = delivery_count or broker_delivery_count
        self._consumers: dict[str, IdempotentConsumer] = {}

    def __repr__(self) -> str:
        return f"IdempotencyFastStreamMiddleware(name={self._name!r})"

    def consumer(self, name: str) -> IdempotentConsumer:
        """The consumer of the subscriber whose keys are ``name`` (for ``forget``)."""
        found = self._consumers.get(name)
        if found is None:
            found = self._consumers[name] = self._prototype._renamed(name)
        return found

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _Scope:
        """FastStream's middleware factory: one scope per received message."""
        return _Scope(msg, context=context, owner=self)

    async def _process(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        name = self._name or subscriber_name(call_next)
        if name is None:
            raise TypeError(
                "IdempotencyFastStreamMiddleware cannot name this subscriber's keys (its "
                "handler has no module.qualname): pass name="
            )
        try:
            count = self._count(msg)
            if inspect.isawaitable(count):
                count = await count
        except Exception as error:  # a count the broker cannot give: unknown, not a failure
            logger.warning("could not read the delivery count (%r): unknown", error)
            count = None
        outcome = await self.consumer(name).aprocess(_Delivery(msg, call_next), count)
        return await _answer(msg, outcome, self._clock, self._wait_seconds)


class _Answered(IgnoredException):
    """Raised after a nack or a reject, so FastStream publishes no reply; the scope that
    raised it suppresses it on its way out (nothing else sees it)."""


async def _answer(
    message: StreamMessage[Any], outcome: Outcome, clock: Clock, waited_seconds: float
) -> Any:
    """Tell the broker. Done here rather than left to FastStream's ``AckPolicy``, so it is
    the same under every policy, ``MANUAL`` included (a message answers once: the policy's
    own ack after this one does nothing)."""
    if outcome.action == "ack":
        await message.ack()
        return outcome.result
    if outcome.action == "retry":
        if outcome.retry_after is not None and _takes(message.nack, "delay"):
            await message.nack(delay=outcome.retry_after)  # type: ignore[call-arg]
        else:
            pause = _pause_before_nack(message, outcome, waited_seconds)
            if pause:
                await clock.asleep(pause)
            await message.nack()
    elif _stays_pending_on_reject(message):
        await message.ack()
    else:
        await message.reject()
    raise _Answered()


def _takes(method: Callable[..., Any], parameter: str) -> bool:
    return parameter in inspect.signature(method).parameters


def _pause_before_nack(message: StreamMessage[Any], outcome: Outcome, waited: float) -> float:
    """Seconds to hold a retried delivery before a nack its broker hands back at once
    (RabbitMQ's requeue, Kafka's seek back), which would otherwise bring a duplicate of a
    running message straight back to the store, again and again, until that run ends: the
    ``retry_after`` the verdict asks, at most ``RETRY_PAUSE_SECONDS``, less what the delivery
    waited for the running one already (``wait_seconds``). None for a failed handler (no
    ``retry_after``), a message answered already (``AckPolicy.ACK_FIRST``: the nack does
    nothing), and the other brokers (NATS takes the delay, a Redis entry waits pending)."""
    if outcome.retry_after is None or message.committed is not None:
        return 0.0
    if not type(message).__module__.startswith(_REDELIVERED_AT_ONCE):
        return 0.0
    pause = min(outcome.retry_after, RETRY_PAUSE_SECONDS)
    if isinstance(outcome.error, KeyInProgressError):
        pause -= waited
    return max(pause, 0.0)


def _stays_pending_on_reject(message: StreamMessage[Any]) -> bool:
    """A Redis stream message: Redis has no reject, a message left pending comes back."""
    raw = message.raw_message
    return (
        isinstance(raw, Mapping)
        and "message_ids" in raw
        and getattr(message, "group", None) is not None
    )


class _Scope(BaseMiddleware[Any, Any]):
    """One message's pass through the middleware."""

    def __init__(
        self, msg: Any, /, *, context: ContextRepo, owner: IdempotencyFastStreamMiddleware
    ) -> None:
        super().__init__(msg, context=context)
        self._owner = owner

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        if msg.source_type is not SourceType.CONSUME:
            # A reply read by broker.request() passes the broker's middlewares too: it is
            # not a delivery to a subscriber, there is nothing to run once or answer.
            return await call_next(msg)
        return await self._owner._process(call_next, msg)

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        return isinstance(exc_val, _Answered)


__all__ = [
    "KEY_HEADER",
    "IdempotencyFastStreamMiddleware",
    "broker_delivery_count",
    "header_or_message_id",
    "message_body",
    "message_id",
    "subscriber_name",
]
