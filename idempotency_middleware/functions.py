"""``idempotent``: the function door. The same attempt as the middlewares' for any function:
a queue consumer, a Lambda handler, a Celery task, a service method; sync or async.

A translation only: the key and the payload come from the call's arguments, the inner
thing is the function, its result is stored as bytes (``results.py``) and the engine's
refusals become exceptions (``errors.py``). The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast, overload

from . import core, refusals
from .attempt_context import CURRENT
from .clock import SYSTEM_CLOCK, Clock
from .core import CALL_METHOD
from .engine import flow
from .engine.drivers import AsyncDriver, SyncDriver
from .engine.effects import Ran
from .engine.renewal import LoopRenewals, ThreadRenewals
from .errors import InvalidKeyError
from .events import EventHook
from .options import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TTL_SECONDS,
    Options,
    named_options,
)
from .payloads import fingerprint_arguments, fingerprint_payload
from .records import StoredResponse
from .results import ResultCodec, Serializer
from .stores.protocol import AsyncStore, SyncStore

P = ParamSpec("P")
R = TypeVar("R")

# Parameters that are the instance or the class of a method, never part of the payload.
_BOUND_PARAMETERS = frozenset({"self", "cls"})
# A stored result is a response to the engine: this status, no headers, the result's bytes.
_RESULT_STATUS = 200

KeyFunction = Callable[..., Any]
PayloadFunction = Callable[..., Any]


@named_options("idempotent()")
def idempotent(
    *,
    store: SyncStore | AsyncStore,
    key: str | KeyFunction,
    payload: PayloadFunction | None = None,
    name: str | None = None,
    required: bool = True,
    ttl_seconds: float = DEFAULT_TTL_SECONDS,
    lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    wait_seconds: float = 0,
    serializer: Serializer | None = None,
    on_store_error: str = "fail",
    replay_cache_size: int = 0,
    on_event: EventHook | None = None,
    clock: Clock = SYSTEM_CLOCK,
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS,
) -> _Decorator:
    """Run the decorated function once per key; calls with a completed key get its result.

    ``key`` names the parameter whose value is the key, or is a callable taking the
    function's arguments and returning it. The documentation's "Functions and consumers"
    page is the whole contract.
    """
    options = Options.build(
        required=required,
        ttl_seconds=ttl_seconds,
        lock_timeout_seconds=lock_timeout_seconds,
        wait_seconds=wait_seconds,
        on_store_error=on_store_error,
        replay_cache_size=replay_cache_size,
        on_event=on_event,
        clock=clock,
        clock_skew_seconds=clock_skew_seconds,
    )
    if not (isinstance(key, str) and key) and not callable(key):
        raise TypeError(
            f"key must be a parameter name or a callable taking the arguments, got {key!r}"
        )
    if payload is not None and not callable(payload):
        raise TypeError(f"payload must be a callable taking the arguments, got {payload!r}")
    if name is not None and not (isinstance(name, str) and name):
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if serializer is not None and not (
        isinstance(serializer, tuple) and len(serializer) == 2 and all(map(callable, serializer))
    ):
        raise TypeError("serializer must be a (dumps, loads) pair of callables")
    return _Decorator(store, key, payload, name, serializer, options)


class _Decorator:
    """What ``idempotent(...)`` returns: applied to a function, its idempotent twin."""

    __slots__ = ("_key", "_name", "_options", "_payload", "_serializer", "_store")

    def __init__(
        self,
        store: SyncStore | AsyncStore,
        key: str | KeyFunction,
        payload: PayloadFunction | None,
        name: str | None,
        serializer: Serializer | None,
        options: Options,
    ) -> None:
        self._store = store
        self._key = key
        self._payload = payload
        self._name = name
        self._serializer = serializer
        self._options = options

    @overload
    def __call__(self, function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...

    @overload
    def __call__(self, function: Callable[P, R]) -> Callable[P, R]: ...

    def __call__(self, function: Callable[P, Any]) -> Callable[P, Any]:
        if not callable(function):
            raise TypeError(f"idempotent decorates a function, got {function!r}")
        # (A callable object has no __qualname__ of its own: its class names it.)
        qualname = getattr(function, "__qualname__", type(function).__qualname__)
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            raise TypeError(
                f"idempotent cannot make generator function {qualname} "
                "idempotent: its result is an iterator that cannot be stored; return a list"
            )
        unnamed = isinstance(function, functools.partial) or qualname.endswith("<lambda>")
        if unnamed and self._name is None:
            raise TypeError(
                f"idempotent {qualname}: a partial or a lambda has no name of its own to "
                "keep its keys apart from others of its kind; pass name="
            )
        is_async = inspect.iscoroutinefunction(function) or (
            not inspect.isfunction(function)
            and inspect.iscoroutinefunction(type(function).__call__)
        )
        store = self._store
        if is_async and not isinstance(store, AsyncStore):
            raise TypeError(
                f"idempotent async function {qualname} needs an async store "
                f"(AsyncDynamoDBStore, SQLiteStore, MemoryStore); {type(store).__name__} has "
                "no aclaim/acomplete/arelease/arenew"
            )
        if not is_async and not isinstance(store, SyncStore):
            raise TypeError(
                f"idempotent function {qualname} needs a sync store "
                f"(DynamoDBStore, SQLiteStore, MemoryStore); {type(store).__name__} has no "
                "claim/complete/release/renew. For a coroutine function, use async def"
            )
        signature = inspect.signature(function)
        if isinstance(self._key, str) and self._key not in signature.parameters:
            raise TypeError(
                f"idempotent function {qualname} has no parameter "
                f"{self._key!r} to take the key from; its parameters are "
                f"{list(signature.parameters)}"
            )
        name = self._name or f"{function.__module__}.{qualname}"
        door = _FunctionDoor(function, signature, name, self, is_async)
        if is_async:

            @functools.wraps(function)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await door.acall(args, kwargs)

            return call_async

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            return door.call(args, kwargs)

        return call


class _FunctionDoor:
    """One decorated function: its namespace, codec, policy and driver."""

    def __init__(
        self,
        function: Callable[..., Any],
        signature: inspect.Signature,
        name: str,
        decorator: _Decorator,
        is_async: bool,
    ) -> None:
        options = decorator._options
        self.function = function
        self.signature = signature
        self.name = name
        self.key = decorator._key
        self.payload = decorator._payload
        self.codec = ResultCodec(function, decorator._serializer, name)
        self.policy = options.default_policy._replace(route=self.name)
        self.clock = options.clock
        store = decorator._store
        self.context = flow.Context.for_options(options, store, http=False)
        self.async_driver: AsyncDriver | None = None
        self.sync_driver: SyncDriver | None = None
        if is_async:
            async_store = cast(AsyncStore, store)
            self.async_driver = AsyncDriver(
                async_store,
                options.clock,
                LoopRenewals(async_store, self.context.reporter, options.clock),
            )
        else:
            sync_store = cast(SyncStore, store)
            self.sync_driver = SyncDriver(
                sync_store,
                options.clock,
                ThreadRenewals(sync_store, self.context.reporter, options.clock),
            )

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        attempt = self._attempt(args, kwargs)
        if attempt is None:
            return self._unprotected(args, kwargs)
        results: list[Any] = []

        def run() -> Ran:
            result = self.function(*args, **kwargs)
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if close is not None:
                    close()  # never awaited: no "was never awaited" warning on top
                raise TypeError(
                    f"idempotent function {self.name} returned an awaitable: decorate the "
                    "async def itself (it then needs an async store)"
                )
            body = self.codec.encode(result)
            results.append(result)
            return Ran(_RESULT_STATUS, [], body)

        assert self.sync_driver is not None
        outcome = self.sync_driver.drive(flow.attempt(self.context, attempt), run)
        if outcome is flow.RUN_UNPROTECTED:
            return self._unprotected(args, kwargs)
        return self._result(outcome, results)

    async def acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        attempt = self._attempt(args, kwargs)
        if attempt is None:
            return await self._aunprotected(args, kwargs)
        results: list[Any] = []

        async def run() -> Ran:
            result = await self.function(*args, **kwargs)
            body = self.codec.encode(result)
            results.append(result)
            return Ran(_RESULT_STATUS, [], body)

        assert self.async_driver is not None
        outcome = await self.async_driver.drive(flow.attempt(self.context, attempt), run)
        if outcome is flow.RUN_UNPROTECTED:
            return await self._aunprotected(args, kwargs)
        return self._result(outcome, results)

    # A call run without a claim is no attempt: inside a covered request's handler it must
    # not take the request's attempt for its own (its writes, a deferral).
    def _unprotected(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entered = CURRENT.set(None)
        try:
            return self.function(*args, **kwargs)
        finally:
            CURRENT.reset(entered)

    async def _aunprotected(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entered = CURRENT.set(None)
        try:
            return await self.function(*args, **kwargs)
        finally:
            CURRENT.reset(entered)

    def _attempt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> core.Attempt | None:
        """The call's attempt; ``None`` when it runs unprotected (no key, not required)."""
        bound = self.signature.bind(*args, **kwargs)  # a wrong call fails as it would anyway
        bound.apply_defaults()
        arguments = bound.arguments
        key = arguments[self.key] if isinstance(self.key, str) else self.key(*args, **kwargs)
        if key is None or key == "":
            if self.policy.required:
                raise InvalidKeyError(
                    f"idempotent function {self.name}: the key is "
                    f"{'missing (None)' if key is None else 'empty'}; pass one, or decorate "
                    "with required=False to run such calls unprotected"
                )
            return None
        if not isinstance(key, str):
            raise TypeError(
                f"idempotent function {self.name}: the key must be a str, got "
                f"{type(key).__qualname__}; convert it (key=lambda ...: str(...))"
            )
        if self.payload is None:
            fingerprint = fingerprint_arguments(
                self.name,
                {name: value for name, value in arguments.items() if name not in _BOUND_PARAMETERS},
            )
        else:
            fingerprint = fingerprint_payload(self.name, self.payload(*args, **kwargs))
        return core.call_attempt(
            self.policy,
            self.name,
            key,
            fingerprint,
            self.clock.now(),
            self.context.entropy.owner(),
        )

    def _result(self, outcome: flow.Outcome, results: list[Any]) -> Any:
        if type(outcome) is Ran:
            return results[0]
        if type(outcome) is StoredResponse:
            return self.codec.decode(outcome.body)
        assert type(outcome) is core.Refusal, outcome
        raise refusals.error_for(outcome, self.name)


__all__ = ["CALL_METHOD", "idempotent"]
