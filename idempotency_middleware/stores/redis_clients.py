"""The clients of a ``RedisStore``: redis-py's sync client, and one asyncio client per
event loop (asyncio connections belong to the loop they were made on), or the clients a
caller passed in, used as they are. Also where each call's failures become
``StoreUnavailable`` and reach the circuit breaker."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from ..breaker import CircuitBreaker
from . import redis_scripts as lua
from .base import StoreUnavailable
from .closing import ClosingStore
from .redis_errors import describe, store_errors, translate

T = TypeVar("T")
Self = TypeVar("Self", bound="RedisClients")

DEFAULT_URL = "redis://localhost:6379/0"


class _LoopClient:
    """The asyncio client of one event loop (its connections belong to that loop)."""

    __slots__ = ("client", "loop", "scripts", "watcher")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, client: Any) -> None:
        self.loop = loop
        self.client = client
        self.scripts = {name: client.register_script(text) for name, text in lua.SCRIPTS.items()}
        self.watcher: AsyncGenerator[None, None] | None = None


def _kinds() -> tuple[tuple[type, ...], tuple[type, ...]]:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster

    return (redis.Redis, redis.cluster.RedisCluster), (
        redis.asyncio.Redis,
        redis.asyncio.cluster.RedisCluster,
    )


class RedisClients(ClosingStore):
    """What ``RedisStore`` talks through; see :class:`~.redis.RedisStore` for the options."""

    breaker: CircuitBreaker

    def _init_clients(
        self,
        url: str | None,
        client: Any,
        async_client: Any,
        socket_timeout: float | None,
        socket_connect_timeout: float | None,
        retries: int,
        client_options: dict[str, Any],
    ) -> None:
        self._errors = store_errors()
        self._loops: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._loops_lock = threading.Lock()
        self._current: _LoopClient | None = None
        self._async_client: _LoopClient | None = None
        self._owned = client is None and async_client is None
        self._call_timeout: float | None = None  # a caller's clients keep their own
        sync_kinds, async_kinds = _kinds()
        self._sync_client: Any = None
        if self._owned:
            import redis
            import redis.asyncio
            from redis.asyncio.retry import Retry as AsyncRetry
            from redis.backoff import NoBackoff
            from redis.exceptions import ConnectionError
            from redis.retry import Retry

            where = url or DEFAULT_URL
            options = {
                "socket_timeout": socket_timeout,
                "socket_connect_timeout": socket_connect_timeout,
                **client_options,
            }
            if "retry" in options:  # a sync Retry would not serve the asyncio clients
                raise ValueError(
                    "RedisStore sets its clients' retry policy from retries=; for another "
                    "policy, pass your own clients (client=, async_client=)"
                )
            sync_retry = Retry(NoBackoff(), retries, (ConnectionError,))
            async_retry = AsyncRetry(NoBackoff(), retries, (ConnectionError,))
            self._sync_client = redis.Redis.from_url(where, retry=sync_retry, **options)
            # The asyncio clients get no socket timeout of their own: redis-py wraps every
            # send in asyncio.wait_for when one is set, a task per command (a fifth of a
            # claim's CPU). The store bounds each whole call with it instead (_acall).
            self._call_timeout = options.pop("socket_timeout")
            self._new_async: Callable[[], Any] = lambda: redis.asyncio.Redis.from_url(
                where, retry=async_retry, socket_timeout=None, **options
            )
        else:
            if isinstance(client, async_kinds) and async_client is None:
                client, async_client = None, client
            if client is not None and not isinstance(client, sync_kinds):
                raise TypeError(f"client must be a redis-py client, got {type(client).__name__}")
            if async_client is not None and not isinstance(async_client, async_kinds):
                raise TypeError(
                    "async_client must be a redis.asyncio client, "
                    f"got {type(async_client).__name__}"
                )
            given: Any
            for given in (client, async_client):
                if given is not None and given.get_encoder().decode_responses:
                    raise ValueError(
                        "RedisStore needs a client with decode_responses=False: responses "
                        "are stored as bytes"
                    )
            self._sync_client = client
            if async_client is not None:
                # The caller's client, on whatever loop the caller uses it.
                self._async_client = _LoopClient(None, async_client)
        self._sync_scripts = (
            {name: self._sync_client.register_script(text) for name, text in lua.SCRIPTS.items()}
            if self._sync_client is not None
            else {}
        )
        self._where = describe(self._sync_client if self._sync_client is not None else async_client)

    # -- clients ----------------------------------------------------------------------

    def _sync(self) -> Any:
        if self._sync_client is None:
            raise TypeError(
                "this RedisStore was given a redis.asyncio client only: use its async methods "
                "(aclaim ...), or pass a sync client (client=redis.Redis(...)) too, or a url"
            )
        return self._sync_client

    async def _loop_client(self) -> _LoopClient:
        if self._async_client is not None:
            return self._async_client
        if not self._owned:
            raise TypeError(
                "this RedisStore was given a sync redis client only: use its sync methods "
                "(claim ...), or pass async_client=redis.asyncio.Redis(...) too, or a url"
            )
        loop = asyncio.get_running_loop()
        current = self._current
        if current is not None and current.loop is loop:
            return current
        with self._loops_lock:
            entry = self._loops.get(loop)
            fresh = entry is None
            if entry is None:
                entry = self._loops[loop] = _LoopClient(loop, self._new_async())
            # Clients of loops that ended without closing them: nothing can run on those
            # loops any more, so they are only forgotten.
            for ended in [other for other in self._loops if other.is_closed()]:
                del self._loops[ended]
            self._current = entry
        if fresh:
            entry.watcher = self._close_with_loop(entry)
            await entry.watcher.__anext__()
        return entry

    async def _close_with_loop(self, entry: _LoopClient) -> AsyncGenerator[None, None]:
        # Left suspended for the loop's lifetime: asyncio closes it when the loop shuts down
        # (shutdown_asyncgens, as asyncio.run does), the last moment the client's
        # connections can be closed on their own loop.
        try:
            yield
        finally:
            self._forget(entry)
            await entry.client.aclose()

    def _forget(self, entry: _LoopClient) -> None:
        with self._loops_lock:
            if entry.loop is not None and self._loops.get(entry.loop) is entry:
                del self._loops[entry.loop]
            if self._current is entry:
                self._current = None

    # -- calls ------------------------------------------------------------------------

    def _outage(self, operation: str, error: BaseException) -> StoreUnavailable:
        failure = translate(operation, error, self._where)
        self.breaker.failed(failure)
        return failure

    def _call(self, operation: str, call: Callable[[Any, dict[str, Any]], T]) -> T:
        client = self._sync()
        try:
            result = call(client, self._sync_scripts)
        except self._errors as error:
            raise self._outage(operation, error) from error
        self.breaker.succeeded()
        return result

    async def _acall(
        self, operation: str, call: Callable[[Any, dict[str, Any]], Awaitable[T]]
    ) -> T:
        entry = await self._loop_client()
        try:
            if self._call_timeout is None:
                result = await call(entry.client, entry.scripts)
            else:
                result = await _bounded(call(entry.client, entry.scripts), self._call_timeout)
        except self._errors as error:
            raise self._outage(operation, error) from error
        self.breaker.succeeded()
        return result

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close the store's own sync client's connections (a client passed in is the
        caller's to close). Using the store again reconnects."""
        if self._owned:
            self._sync_client.close()

    async def aclose(self) -> None:
        """Close the running loop's own client's connections; the next call reconnects."""
        loop = asyncio.get_running_loop()
        with self._loops_lock:
            entry = self._loops.get(loop)
        if entry is None:
            return
        if entry.watcher is not None:
            await entry.watcher.aclose()  # forgets the client and closes it
        else:  # pragma: no cover - a loop's client gets its watcher before any call returns
            self._forget(entry)
            await entry.client.aclose()


if sys.version_info >= (3, 11):

    async def _bounded(work: Awaitable[T], seconds: float) -> T:
        """``work`` within ``seconds`` (``TimeoutError`` past them): a deadline on the
        running task, no task of its own. (A cancelled redis-py call drops its connection.)"""
        async with asyncio.timeout(seconds):
            return await work

else:  # pragma: no cover - Python 3.10

    async def _bounded(work: Awaitable[T], seconds: float) -> T:
        return await asyncio.wait_for(work, seconds)
