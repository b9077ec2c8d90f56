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
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast, overload

from ..clock import SYSTEM_CLOCK, Clock
from ..engine import decisions
from ..engine.decisions import CALL_METHOD
from ..errors import InvalidKeyError
from ..events import OnEvent
from ..policy.options import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TTL_SECONDS,
    named_options,
)
from ..stores.encryption import Encryption
from ..stores.protocol import AsyncStore, SyncStore
from .answers import Answer, Returned, aanswer, answer
from .attempts import (
    FunctionAttempts,
    check_store,
    derived_name,
    is_coroutine_callable,
    is_generator_callable,
)
from .options import CallableOptions
from .payloads import fingerprint_arguments, fingerprint_payload
from .results import Serializer

if TYPE_CHECKING:
    from typing_extensions import Self

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

# Parameters that are the instance or the class of a method, never part of the payload.
_BOUND_PARAMETERS = frozenset({"self", "cls"})

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
    on_event: OnEvent = None,
    clock: Clock = SYSTEM_CLOCK,
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS,
    encryption: Encryption | None = None,
) -> _Decorator:
    """Run the decorated function once per key; calls with a completed key get its result.

    ``key`` names the parameter whose value is the key, or is a callable taking the
    function's arguments and returning it. The documentation's "Functions and consumers"
    page is the whole contract.
    """
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
    if not (isinstance(key, str) and key) and not callable(key):
        raise TypeError(
            f"key must be a parameter name or a callable taking the arguments, got {key!r}"
        )
    if payload is not None and not callable(payload):
        raise TypeError(f"payload must be a callable taking the arguments, got {payload!r}")
    return _Decorator(key, payload, options)


class _Decorator:
    """What ``idempotent(...)`` returns: applied to a function, its idempotent twin."""

    __slots__ = ("_key", "_options", "_payload")

    def __init__(
        self, key: str | KeyFunction, payload: PayloadFunction | None, options: CallableOptions
    ) -> None:
        self._key = key
        self._payload = payload
        self._options = options

    @overload
    def __call__(
        self, function: Callable[P, Awaitable[R]]
    ) -> IdempotentFunction[P, Awaitable[R]]: ...

    @overload
    def __call__(self, function: Callable[P, R]) -> IdempotentFunction[P, R]: ...

    def __call__(self, function: Callable[P, Any]) -> IdempotentFunction[P, Any]:
        if not callable(function):
            raise TypeError(f"idempotent decorates a function, got {function!r}")
        # (A callable object has no __qualname__ of its own: its class names it.)
        qualname = getattr(function, "__qualname__", type(function).__qualname__)
        if is_generator_callable(function):
            raise TypeError(
                f"idempotent cannot make generator function {qualname} "
                "idempotent: its result is an iterator that cannot be stored; return a list"
            )
        options = self._options
        name = derived_name(function, options.name, "idempotent")
        is_async = is_coroutine_callable(function)
        check_store(options.store, is_async, f"idempotent function {qualname}")
        signature = inspect.signature(function)
        if isinstance(self._key, str) and self._key not in signature.parameters:
            raise TypeError(
                f"idempotent function {qualname} has no parameter "
                f"{self._key!r} to take the key from; its parameters are "
                f"{list(signature.parameters)}"
            )
        attempts = FunctionAttempts(
            function,
            name,
            options.store,
            options.serializer,
            options.attempt_options,
            is_async,
            f"idempotent function {name}",
        )
        door = _FunctionDoor(function, signature, self._key, self._payload, attempts)
        if is_async:

            @functools.wraps(function)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await door.acall(args, kwargs)

            wrapper: Any = call_async
        else:

            @functools.wraps(function)
            def call(*args: Any, **kwargs: Any) -> Any:
                return door.call(args, kwargs)

            wrapper = call
        # Redrive: clear a key so the next call with it runs again.
        wrapper.forget = attempts.forget
        wrapper.aforget = attempts.aforget
        return cast("IdempotentFunction[P, Any]", wrapper)


class IdempotentFunction(Protocol[P, R_co]):
    """What ``idempotent`` returns: the function, called as before, and the redrive pair."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    # A decorated method is still a function: looked up on an instance, it binds.
    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> Self: ...

    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> Callable[..., R_co]: ...

    def __get__(self, instance: object, owner: type[Any] | None = None) -> Any: ...

    def forget(self, key: str) -> bool:
        """Delete ``key``'s record whatever its state (completed, running, abandoned), so the
        next call with that key runs the function again; ``True`` when there was one. Needs a
        store with a sync ``delete`` (every store but ``AsyncDynamoDBStore``)."""
        ...

    async def aforget(self, key: str) -> bool:
        """``forget`` on the running event loop (every store)."""
        ...


class _FunctionDoor:
    """One decorated function: how its key and payload are read from a call's arguments."""

    __slots__ = ("attempts", "function", "key", "name", "payload", "signature")

    def __init__(
        self,
        function: Callable[..., Any],
        signature: inspect.Signature,
        key: str | KeyFunction,
        payload: PayloadFunction | None,
        attempts: FunctionAttempts,
    ) -> None:
        self.function = function
        self.signature = signature
        self.key = key
        self.payload = payload
        self.attempts = attempts
        self.name = attempts.name

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        function = self.function
        attempt = self._attempt(args, kwargs)
        return _returned(answer(self.attempts, attempt, lambda: function(*args, **kwargs)))

    async def acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        function = self.function
        attempt = self._attempt(args, kwargs)
        return _returned(await aanswer(self.attempts, attempt, lambda: function(*args, **kwargs)))

    def _attempt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> decisions.Attempt | None:
        """The call's attempt; ``None`` when it runs unprotected (no key, not required)."""
        bound = self.signature.bind(*args, **kwargs)  # a wrong call fails as it would anyway
        bound.apply_defaults()
        arguments = bound.arguments
        key = arguments[self.key] if isinstance(self.key, str) else self.key(*args, **kwargs)
        if key is None or key == "":
            if self.attempts.policy.required:
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
        return self.attempts.attempt(key, fingerprint)


def _returned(answer: Answer) -> Any:
    """The function door's wording: the result, or the refusal's exception raised."""
    if isinstance(answer, Returned):
        return answer.value
    raise answer.error


__all__ = ["CALL_METHOD", "IdempotentFunction", "idempotent"]
