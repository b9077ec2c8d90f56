"""The attempt machinery of one named function: what ``idempotent`` functions and
``IdempotentConsumer`` share.

A function (or a consumer's handler) has a name, which namespaces its keys apart from every
HTTP route, a codec for its results, a policy and a driver. Both doors build their attempt
here and run it through ``engine.flow.attempt``: there is one attempt sequence, and this is
only the part of its translation that the two doors word alike. They differ in how they read
the key and the payload (a call's arguments, a message) and in how they word the outcome
(a result or an exception; an ack, retry or dead verdict), which ``answers.py`` gives them
in one form. Their options are ``options.py``'s.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import pickle
from collections.abc import Awaitable, Callable
from typing import Any, cast

from ..clock import Clock
from ..engine import decisions, flow
from ..engine.decisions import CALL_METHOD, FUNCTION_NAMESPACE
from ..engine.effects import Ran
from ..engine.setup import AsyncSetup, SyncSetup
from ..errors import StoredResultUnreadableError
from ..events import DoorKind
from ..handler.context import CURRENT
from ..policy.keys import storage_key
from ..policy.options import Options
from ..stores.catalog import A_SYNC_STORE, AN_ASYNC_STORE
from ..stores.protocol import AsyncStore, SyncStore
from ..stores.records import StoredResponse
from .results import ResultCodec, Serializer

# A stored result is a response to the engine: this status, no headers, the result's bytes.
RESULT_STATUS = 200


def is_coroutine_callable(function: Callable[..., Any]) -> bool:
    """A coroutine function, or a callable object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(function) or (
        not inspect.isfunction(function) and inspect.iscoroutinefunction(type(function).__call__)
    )


def is_generator_callable(function: Callable[..., Any]) -> bool:
    """A generator or async generator function: its result, an iterator, cannot be stored."""
    return inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function)


def check_store(store: object, is_async: bool, what: str) -> None:
    """``TypeError`` when ``store`` cannot serve ``what`` (a sync or a coroutine function)."""
    if is_async and not isinstance(store, AsyncStore):
        raise TypeError(
            f"{what} is a coroutine function and needs {AN_ASYNC_STORE}; "
            f"{type(store).__name__} has no aclaim/acomplete/arelease/arenew"
        )
    if not is_async and not isinstance(store, SyncStore):
        raise TypeError(
            f"{what} is a plain function and needs {A_SYNC_STORE}; "
            f"{type(store).__name__} has no claim/complete/release/renew. For a coroutine "
            "function, use async def"
        )


def unpickles(serializer: Serializer | None) -> bool:
    """Whether ``serializer``'s ``loads`` is pickle's."""
    if serializer is None:
        return False
    loads = serializer[1]
    return loads is pickle.loads or getattr(loads, "__module__", None) in ("pickle", "_pickle")


def derived_name(target: Callable[..., Any], name: str | None, what: str) -> str:
    """``name``, or the one ``target`` gives its keys: ``module.qualname`` (a callable
    object's class's; an unbound builtin method's class's module, ``builtins.str.upper``).
    ``TypeError`` asking for ``name=`` when it has none of its own to keep its keys apart:
    a partial, a lambda, a bound builtin method (``"abc".upper``: one name for every
    string), anything without a module."""
    if name is not None:
        return name
    # (A callable object has no __qualname__ of its own: its class names it.)
    qualname = getattr(target, "__qualname__", type(target).__qualname__)
    module = getattr(
        target, "__module__", getattr(getattr(target, "__objclass__", None), "__module__", None)
    )
    if (
        isinstance(target, functools.partial)
        or qualname.endswith("<lambda>")
        or not isinstance(module, str)
    ):
        raise TypeError(
            f"{what} {qualname}: a partial, a lambda or a builtin bound to an object has no "
            "name of its own to keep its keys apart from others of its kind; pass name="
        )
    return f"{module}.{qualname}"


def function_key_hash(name: str, key: str) -> str:
    """The stored (hashed) key of ``key`` for function or consumer ``name``."""
    return storage_key(FUNCTION_NAMESPACE, name, None, key)


class FunctionAttempts:
    """One named function's attempts: its policy, result codec, store and driver.
    ``label`` names it in messages ("idempotent function orders.charge"), ``door`` in its
    events (``"function"``, or ``"consumer"`` for a consumer's handler)."""

    def __init__(
        self,
        function: Callable[..., Any],
        name: str,
        store: SyncStore | AsyncStore,
        serializer: Serializer | None,
        options: Options,
        is_async: bool,
        label: str,
        door: DoorKind = "function",
    ) -> None:
        self.function = function
        self.name = name
        self.label = label  # how messages name it: "idempotent function NAME", "consumer NAME"
        self.store = store
        self.codec = ResultCodec(function, serializer, name)
        self.policy = options.default_policy._replace(route=name)
        self.clock: Clock = options.clock
        # Encryption authenticates what this door wrote; a plain record may be anyone's,
        # and unpickling it could run their code: read back encrypted records only.
        sealed_only = options.encryption is not None and unpickles(serializer)
        self.setup: SyncSetup | AsyncSetup
        if is_async:
            self.setup = AsyncSetup.for_options(
                options, cast(AsyncStore, store), http=False, sealed_only=sealed_only, door=door
            )
        else:
            self.setup = SyncSetup.for_options(
                options, cast(SyncStore, store), http=False, sealed_only=sealed_only, door=door
            )
        self.context = self.setup.context

    def attempt(self, key: str, fingerprint: str) -> decisions.Attempt:
        """The attempt of one call (or delivery) with ``key`` and ``fingerprint``."""
        return decisions.call_attempt(
            self.policy,
            self.name,
            key,
            fingerprint,
            self.clock.now(),
            self.context.entropy.owner(),
        )

    def drive(self, attempt: decisions.Attempt, call: Callable[[], Any]) -> tuple[flow.Ending, Any]:
        """Run ``attempt``, calling ``call()`` if it is claimed: the flow's outcome, and what
        ``call`` returned (``None`` unless the outcome is ``Ran``). What ``call`` raised
        propagates, with the key released."""
        results: list[Any] = []

        def run() -> Ran:
            result = call()
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if close is not None:
                    close()  # never awaited: no "was never awaited" warning on top
                raise TypeError(
                    f"{self.label} returned an awaitable: decorate the async def itself "
                    "(it then needs an async store)"
                )
            body = self.codec.encode(result)
            results.append(result)
            return Ran(RESULT_STATUS, [], body)

        assert isinstance(self.setup, SyncSetup)
        outcome = self.setup.drive(attempt, run)
        return outcome, results[0] if results else None

    async def adrive(
        self, attempt: decisions.Attempt, call: Callable[[], Awaitable[Any]]
    ) -> tuple[flow.Ending, Any]:
        """``drive`` for a coroutine function."""
        results: list[Any] = []

        async def run() -> Ran:
            result = await call()
            body = self.codec.encode(result)
            results.append(result)
            return Ran(RESULT_STATUS, [], body)

        assert isinstance(self.setup, AsyncSetup)
        outcome = await self.setup.drive(attempt, run)
        return outcome, results[0] if results else None

    def replayed(self, attempt: decisions.Attempt, stored: StoredResponse) -> Any:
        """The result a stored response gives back; ``StoredResultUnreadableError`` (with an
        ``unreadable`` event) when its bytes do not decode: never run again."""
        try:
            return self.codec.decode(stored.body)
        except Exception as error:
            reporter = self.context.reporter
            reason = f"the stored result does not decode: {error!r}"
            if reporter.wants("unreadable"):
                reporter.report(attempt, "unreadable", error=reason)
            unreadable = StoredResultUnreadableError(
                f"{self.label}: the call with this key completed, but its stored result "
                f"cannot be read ({reason}); it will not run again under this key: forget "
                "the key to run it again"
            )
            raise unreadable from error

    # A call run without a claim is no attempt: inside a covered request's handler it must
    # not take the request's attempt for its own (its writes, a deferral).
    def unprotected(self, call: Callable[[], Any]) -> Any:
        entered = CURRENT.set(None)
        try:
            return call()
        finally:
            CURRENT.reset(entered)

    async def aunprotected(self, call: Callable[[], Awaitable[Any]]) -> Any:
        entered = CURRENT.set(None)
        try:
            return await call()
        finally:
            CURRENT.reset(entered)

    # -- redrive -------------------------------------------------------------------------

    def forget(self, key: str) -> bool:
        """Delete ``key``'s record whatever its state, and drop it from this door's replay
        cache; ``True`` when there was one. The next call (or delivery) with that key runs
        again."""
        key_hash = function_key_hash(self.name, self._checked(key))
        delete = getattr(self.store, "delete", None)
        if delete is None:
            raise TypeError(
                f"{self.label}: {type(self.store).__name__} has no sync delete; "
                f"use `await ....aforget({key!r})`"
            )
        try:
            return bool(delete(key_hash))
        finally:
            self._evict(key_hash)

    async def aforget(self, key: str) -> bool:
        """``forget`` on the running event loop."""
        key_hash = function_key_hash(self.name, self._checked(key))
        adelete = getattr(self.store, "adelete", None)
        delete = getattr(self.store, "delete", None)
        if adelete is None and delete is None:
            raise TypeError(f"{self.label}: {type(self.store).__name__} has no delete or adelete")
        try:
            if adelete is not None:
                return bool(await adelete(key_hash))
            # A sync-only store (DynamoDBStore): its blocking call off the loop.
            assert delete is not None
            return bool(await asyncio.to_thread(delete, key_hash))
        finally:
            self._evict(key_hash)

    def _evict(self, key_hash: str) -> None:
        """Drop the key from this door's replay cache, after the delete (evicted before, a
        replay in between could cache the record again): the next call asks the store.
        Also when the delete failed: the cache only saves store reads, dropping is safe."""
        if self.context.cache is not None:
            self.context.cache.discard(key_hash)

    def _checked(self, key: object) -> str:
        if not isinstance(key, str) or not key:
            raise TypeError(f"{self.label}: forget takes the key (a non-empty str), got {key!r}")
        return key


__all__ = [
    "CALL_METHOD",
    "RESULT_STATUS",
    "FunctionAttempts",
    "check_store",
    "function_key_hash",
    "is_coroutine_callable",
    "unpickles",
]
