"""``IdempotentConsumer``: the consumer door. A function door plus a verdict for the broker.

A queue consumer must tell its broker what to do with each delivery: delete it (``ack``),
let it come back later (``retry``), or give up on it (``dead``). The attempt is the one every
door runs (``function_attempts`` over ``engine.flow.attempt``); this module only reads the
key and the payload from the message and words the attempt's outcome as a verdict.
``process`` never raises for a delivery: every situation is an ``Outcome``.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..clock import SYSTEM_CLOCK, Clock
from ..engine import decisions, refusals
from ..errors import InvalidKeyError
from ..events import OnEvent
from ..functions.answers import Answer, Returned, aanswer, answer
from ..functions.attempts import (
    FunctionAttempts,
    check_store,
    derived_name,
    is_coroutine_callable,
    is_generator_callable,
)
from ..functions.options import CallableOptions
from ..functions.payloads import fingerprint_payload
from ..functions.results import Serializer
from ..policy.options import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TTL_SECONDS,
    named_options,
)
from ..stores.encryption import Encryption
from ..stores.protocol import AsyncStore, SyncStore

logger = logging.getLogger(__name__)

Verdict = Literal["ack", "retry", "dead"]
MessageFunction = Callable[[Any], Any]
ExhaustedHook = Callable[[Any, Exception], Any]


@dataclass(frozen=True)
class Outcome:
    """What to tell the broker about one delivery.

    ``action``: ``"ack"`` (done: delete the message), ``"retry"`` (deliver it again, after
    ``retry_after`` seconds when known) or ``"dead"`` (give up on it: ``on_exhausted`` was
    called). ``result`` is the handler's result, or the replayed one (``None`` unless
    ``ack``); ``replayed`` when it comes from an earlier delivery; ``error`` the exception
    behind a ``retry`` or ``dead`` (``None`` on ``ack``).
    """

    action: Verdict
    result: Any = None
    replayed: bool = False
    error: Exception | None = None
    retry_after: float | None = None


def message_payload(message: Any) -> Any:
    """What stays the same from one delivery of ``message`` to the next: an SQS message's
    body (boto3's ``Body``, a Lambda record's ``body``: never its receipt handle or receive
    count), else the message itself."""
    if isinstance(message, Mapping):
        if "Body" in message and "ReceiptHandle" in message:
            return message["Body"]
        if "body" in message and (
            "receiptHandle" in message or message.get("eventSource") == "aws:sqs"
        ):
            return message["body"]
    return message


def _check_count(value: object, name: str, minimum: int) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < minimum
    ):
        raise TypeError(f"{name} must be None or an int of at least {minimum}, got {value!r}")


class IdempotentConsumer:
    """Processes each message once, and says what the broker should do with each delivery.

    ``handler`` (sync or async) takes one message; ``key`` takes the message and returns its
    idempotency key (``str``); ``payload`` takes the message and returns what identifies the
    work (default: ``message_payload``). ``max_attempts`` with a delivery count gives up on a
    message whose handler keeps failing (``dead``, after ``on_exhausted(message, error)``).
    ``required=False`` runs a message without a key unprotected (``ack``) instead of giving
    it up (``dead``). The other options mean what they mean for ``idempotent``; a consumer and an
    ``idempotent`` function with the same ``name`` share their keys.
    """

    @named_options("IdempotentConsumer")
    def __init__(
        self,
        handler: Callable[[Any], Any],
        *,
        store: SyncStore | AsyncStore,
        key: MessageFunction,
        payload: MessageFunction | None = None,
        name: str | None = None,
        max_attempts: int | None = None,
        on_exhausted: ExhaustedHook | None = None,
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
        self._setup(handler, options, key, payload, max_attempts, on_exhausted)

    @classmethod
    def _of(
        cls,
        handler: Callable[[Any], Any],
        options: CallableOptions,
        *,
        key: MessageFunction,
        payload: MessageFunction | None = None,
        max_attempts: int | None = None,
        on_exhausted: ExhaustedHook | None = None,
        name: str | None = None,
    ) -> IdempotentConsumer:
        """A consumer from options a broker's door built and checked (and warned about)
        once; ``name``, when given, in place of theirs (a door naming keys its own way)."""
        consumer = cls.__new__(cls)
        consumer._setup(handler, options, key, payload, max_attempts, on_exhausted, name)
        return consumer

    def _setup(
        self,
        handler: Callable[[Any], Any],
        options: CallableOptions,
        key: MessageFunction,
        payload: MessageFunction | None,
        max_attempts: int | None,
        on_exhausted: ExhaustedHook | None,
        name: str | None = None,
    ) -> None:
        """What is the consumer's own: its handler, how it reads a message, when it gives
        one up."""
        if not callable(handler):
            raise TypeError(f"IdempotentConsumer takes a handler (a callable), got {handler!r}")
        qualname = getattr(handler, "__qualname__", type(handler).__qualname__)
        if is_generator_callable(handler):
            raise TypeError(
                f"consumer handler {qualname} is a generator function: its result is an "
                "iterator that cannot be stored; return a list"
            )
        if not callable(key):
            raise TypeError(f"key must be a callable taking the message, got {key!r}")
        if payload is not None and not callable(payload):
            raise TypeError(f"payload must be a callable taking the message, got {payload!r}")
        name = derived_name(handler, name or options.name, "consumer handler")
        _check_count(max_attempts, "max_attempts", 1)
        if on_exhausted is not None and not callable(on_exhausted):
            raise TypeError(f"on_exhausted must be a callable or None, got {on_exhausted!r}")
        self._is_async = is_coroutine_callable(handler)
        if on_exhausted is not None and is_coroutine_callable(on_exhausted) and not self._is_async:
            raise TypeError(
                "on_exhausted is a coroutine function, but the handler is not: process() "
                "cannot await it; make it a plain function"
            )
        check_store(options.store, self._is_async, f"consumer {name}'s handler")
        self.name = name
        self._handler = handler
        self._key = key
        self._payload = payload or message_payload
        self._max_attempts = max_attempts
        self._on_exhausted = on_exhausted
        self._options = options
        self._attempts = self._attempts_named(name)

    def _attempts_named(self, name: str) -> FunctionAttempts:
        options = self._options
        return FunctionAttempts(
            self._handler,
            name,
            options.store,
            options.serializer,
            options.attempt_options,
            self._is_async,
            f"consumer {name}",
            door="consumer",
        )

    def _renamed(self, name: str) -> IdempotentConsumer:
        """This consumer with keys named ``name`` (its own replay cache and renewals): how a
        door serving several handlers (FastStream's subscribers) makes one per handler from
        options it checked, and warned about, once."""
        twin = copy.copy(self)
        twin.name = name
        twin._attempts = self._attempts_named(name)
        return twin

    def __repr__(self) -> str:
        return f"IdempotentConsumer({self.name!r})"

    @property
    def is_async(self) -> bool:
        """Whether the handler is a coroutine function (use ``aprocess``, not ``process``)."""
        return self._is_async

    @property
    def max_attempts(self) -> int | None:
        """The delivery count at which a failing handler's message is given up (``dead``)."""
        return self._max_attempts

    @property
    def on_exhausted(self) -> ExhaustedHook | None:
        """What is called with a message given up (``dead``) and its error, if anything."""
        return self._on_exhausted

    @property
    def ttl_seconds(self) -> float:
        """How long a completed key is kept (its result replayed) after its completion."""
        return self._attempts.policy.ttl_seconds

    @property
    def lock_timeout_seconds(self) -> float:
        """How long a claim holds when its lease is no longer renewed (its consumer died)."""
        return self._attempts.policy.lock_timeout_seconds

    @property
    def clock_skew_seconds(self) -> float:
        """The margin past an expired lock before another delivery takes its claim over."""
        return self._attempts.policy.clock_skew_seconds

    # -- processing ----------------------------------------------------------------------

    def process(self, message: Any, delivery_count: int | None = None) -> Outcome:
        """Process one delivery of ``message`` (sync handlers); ``delivery_count`` is how
        many times it has been delivered, this time included (``None``: unknown)."""
        if self._is_async:
            raise TypeError(
                f"consumer {self.name} has a coroutine handler: use `await "
                "consumer.aprocess(message)`"
            )
        _check_count(delivery_count, "delivery_count", 0)
        try:
            attempt = self._attempt(message)
        except Exception as error:
            return self._exhaust(message, error)
        handler = self._handler
        try:
            answered = answer(self._attempts, attempt, lambda: handler(message))
        except Exception as error:
            return self._failed(message, error, delivery_count)
        verdict = self._verdict(answered)
        if isinstance(verdict, Outcome):
            return verdict
        if verdict[0] == "dead":
            return self._exhaust(message, verdict[1])
        return self._failed(message, verdict[1], delivery_count)

    async def aprocess(self, message: Any, delivery_count: int | None = None) -> Outcome:
        """``process`` for a coroutine handler."""
        if not self._is_async:
            raise TypeError(
                f"consumer {self.name} has a plain (sync) handler: use `consumer.process(message)`"
            )
        _check_count(delivery_count, "delivery_count", 0)
        try:
            attempt = self._attempt(message)
        except Exception as error:
            return await self._aexhaust(message, error)
        handler = self._handler
        try:
            answered = await aanswer(self._attempts, attempt, lambda: handler(message))
        except Exception as error:
            return await self._afailed(message, error, delivery_count)
        verdict = self._verdict(answered)
        if isinstance(verdict, Outcome):
            return verdict
        if verdict[0] == "dead":
            return await self._aexhaust(message, verdict[1])
        return await self._afailed(message, verdict[1], delivery_count)

    # -- redrive -------------------------------------------------------------------------

    def forget(self, key: str) -> bool:
        """Delete ``key``'s record whatever its state, so the next delivery with that key
        runs the handler (a redrive from a dead-letter queue); ``True`` when there was one."""
        return self._attempts.forget(key)

    async def aforget(self, key: str) -> bool:
        """``forget`` on the running event loop."""
        return await self._attempts.aforget(key)

    # -- the verdicts --------------------------------------------------------------------

    def _attempt(self, message: Any) -> decisions.Attempt | None:
        """The delivery's attempt; what the message cannot give (a key, a payload) raises.
        ``None``: no key, and ``required=False``: the handler runs unprotected."""
        key = self._key(message)
        if key is None or key == "":
            if not self._attempts.policy.required:
                return None
            raise InvalidKeyError(
                f"consumer {self.name}: the message's key is "
                f"{'missing (None)' if key is None else 'empty'}; it cannot be processed "
                "idempotently"
            )
        if not isinstance(key, str):
            raise InvalidKeyError(
                f"consumer {self.name}: the key must be a str, got {type(key).__qualname__}; "
                "convert it (key=lambda message: str(...))"
            )
        fingerprint = fingerprint_payload(self.name, self._payload(message))
        return self._attempts.attempt(key, fingerprint)

    def _verdict(self, answered: Answer) -> Outcome | tuple[Literal["dead", "failed"], Exception]:
        """The consumer door's wording of an answer: a verdict; ``("dead", error)`` when the
        message can never be processed, ``("failed", error)`` when the handler's work did not
        land."""
        if isinstance(answered, Returned):
            return Outcome("ack", answered.value, replayed=answered.replayed)
        reason, error = answered.reason, answered.error
        if reason == "not_stored":
            # Done, but its result was too large to keep: nothing to give back, nothing to run.
            return Outcome("ack", None, replayed=True)
        if reason in ("reused", "unreadable"):
            return ("dead", error)  # (a stored result that cannot be read: never re-run)
        if reason in ("transaction_conflict", "transaction_rejected"):
            return ("failed", error)  # it ran, but nothing landed: the key was released
        refusal = answered.refusal
        assert refusal is not None, answered
        if reason == "in_progress":
            return Outcome("retry", error=error, retry_after=self._until_free(refusal))
        retry_after = refusal.retry_after or getattr(error, "retry_after", None) or 1
        return Outcome("retry", error=error, retry_after=retry_after)

    def _until_free(self, refusal: decisions.Refusal) -> float:
        """Seconds until the running delivery's claim could be taken over (its lock's expiry
        plus the clock skew margin), when the store told its lock's expiry; else the short
        hint. Each redelivery counts against the broker's receive limit (SQS's
        maxReceiveCount), so a duplicate of a long run is not sent back every second."""
        if refusal.held_until is None:
            return refusals.IN_PROGRESS_RETRY_AFTER
        policy = self._attempts.policy
        left = refusal.held_until + policy.clock_skew_seconds - self._attempts.clock.now()
        return max(refusals.IN_PROGRESS_RETRY_AFTER, math.ceil(left))

    def _exhausted(self, delivery_count: int | None) -> bool:
        return (
            self._max_attempts is not None
            and delivery_count is not None
            and delivery_count >= self._max_attempts
        )

    def _failed(self, message: Any, error: Exception, delivery_count: int | None) -> Outcome:
        if self._exhausted(delivery_count):
            return self._exhaust(message, error)
        logger.warning(
            "consumer %s: the handler failed (%r); the message is to be retried",
            self.name,
            error,
            exc_info=error,
        )
        return Outcome("retry", error=error)

    async def _afailed(self, message: Any, error: Exception, delivery_count: int | None) -> Outcome:
        if self._exhausted(delivery_count):
            return await self._aexhaust(message, error)
        return self._failed(message, error, None)

    def _exhaust(self, message: Any, error: Exception) -> Outcome:
        try:
            if self._on_exhausted is not None:
                self._on_exhausted(message, error)
        except Exception as hook_error:
            return self._hook_failed(hook_error)
        return self._dead(error)

    async def _aexhaust(self, message: Any, error: Exception) -> Outcome:
        try:
            if self._on_exhausted is not None:
                called = self._on_exhausted(message, error)
                if inspect.isawaitable(called):
                    await called
        except Exception as hook_error:
            return self._hook_failed(hook_error)
        return self._dead(error)

    def _dead(self, error: Exception) -> Outcome:
        logger.error("consumer %s: giving up on the message (%r)", self.name, error, exc_info=error)
        return Outcome("dead", error=error)

    def _hook_failed(self, error: Exception) -> Outcome:
        logger.error(
            "consumer %s: on_exhausted raised (%r); the message is to be retried",
            self.name,
            error,
            exc_info=error,
        )
        return Outcome("retry", error=error)


__all__ = ["IdempotentConsumer", "Outcome", "Verdict", "message_payload"]
