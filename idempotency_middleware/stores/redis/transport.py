"""What ``RedisStore`` sends through: redis-py's sync client, and one asyncio client per
event loop (asyncio connections belong to the loop they were made on), or the clients a
caller passed in, used as they are. Each request of a flow is a client method's name and
its arguments; a call's failures become ``StoreUnavailable`` (``errors.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..kit import Flow, LoopLocal, adrive, drive
from ..wakeups import Listen
from .errors import describe, translate
from .ops import Lapse, Replicated

logger = logging.getLogger("idempotency_middleware")

T = TypeVar("T")

DEFAULT_URL = "redis://localhost:6379/0"

# At most this many commands at once on an event loop's own client (``max_connections`` in
# the client options sets it): a burst of claims shares that many connections, each claim
# waiting (within its deadline) for a free one. redis-py's pool would open a connection per
# concurrent command, each under the connect timeout while the loop is at its busiest with
# the burst itself, and past 100 refuse with "Too many connections": 503s from a healthy
# server, counted by the circuit breaker as an outage.
ASYNC_CONNECTIONS = 16


@dataclass(frozen=True)
class RedisSettings:
    """Redis at a ``url``, with ``from_url`` ``options`` and ``retries``; or a caller's clients."""

    url: str | None
    client: Any
    async_client: Any
    options: dict[str, Any]
    retries: int


Notify = Callable[[Lapse], None]


def _log_lapse(lapse: Lapse) -> None:
    logger.warning(lapse.describe(), extra={"idempotency_event": "not_replicated"})


def _sender(client: Any, notify: Notify) -> Callable[[Any], Any]:
    """Sends a flow's requests on a sync client: a method call, a write followed by ``WAIT``
    on its connection, or a notice handed to ``notify``."""

    def send(request: Any) -> Any:
        if type(request) is tuple:
            return getattr(client, request[0])(*request[1:])
        if type(request) is Replicated:
            return _replicated(client, request)
        notify(request)
        return None

    return send


def _async_sender(client: Any, notify: Notify) -> Callable[[Any], Awaitable[Any]]:
    """:func:`_sender` for an asyncio client."""

    def send(request: Any) -> Awaitable[Any]:
        if type(request) is tuple:
            answer: Awaitable[Any] = getattr(client, request[0])(*request[1:])
            return answer
        if type(request) is Replicated:
            return _areplicated(client, request)
        notify(request)
        return _nothing()

    return send


async def _nothing() -> None:
    return None


def _replicated(client: Any, request: Replicated) -> tuple[Any, int]:
    """The request, then ``WAIT``, in one pipeline: ``WAIT`` counts the replicas that have
    every write of its own connection, so both must go on one. On a cluster, on the
    connection of the node holding the key (whose replicas are the ones that count)."""
    import redis.cluster

    target, cluster = client, None
    if isinstance(client, redis.cluster.RedisCluster):
        cluster = client
        node = client.get_node_from_key(request.key)  # type: ignore[no-untyped-call]
        target = client.get_redis_connection(node)
    try:
        pipe = target.pipeline(transaction=False)
        pipe.execute_command(*_command(request.request))
        pipe.execute_command("WAIT", request.replicas, request.timeout_ms)
        reply, acks = pipe.execute()
    except Exception:
        if cluster is not None:  # (the node may have failed over: learn the new layout)
            with contextlib.suppress(Exception):
                cluster.nodes_manager.initialize()
        raise
    return reply, int(acks)


async def _areplicated(client: Any, request: Replicated) -> tuple[Any, int]:
    """:func:`_replicated` on an asyncio client."""
    import redis.asyncio.cluster
    import redis.exceptions

    if not isinstance(client, redis.asyncio.cluster.RedisCluster):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*_command(request.request))
        pipe.execute_command("WAIT", request.replicas, request.timeout_ms)
        reply, acks = await pipe.execute()
        return reply, int(acks)
    from redis.asyncio.cluster import PipelineCommand

    try:
        await client.initialize()
        node = client.get_node_from_key(request.key)
        if node is None:  # pragma: no cover - get_node_from_key raises for an uncovered slot
            raise redis.exceptions.ClusterDownError(f"no node holds {request.key!r}")
        commands = [
            PipelineCommand(0, *_command(request.request)),
            PipelineCommand(1, "WAIT", request.replicas, request.timeout_ms),
        ]
        await node.execute_pipeline(commands)
        for command in commands:
            if isinstance(command.result, Exception):
                raise command.result
    except Exception:
        with contextlib.suppress(Exception):
            await client.nodes_manager.initialize()
        raise
    waited: Any = commands[1].result
    return commands[0].result, int(waited)


def _command(request: tuple[Any, ...]) -> tuple[Any, ...]:
    """A flow's request (``("evalsha", sha, ...)``) as a raw command."""
    return (request[0].upper(), *request[1:])


@dataclass(frozen=True)
class _LoopClient:
    """An event loop's own asyncio client, and the slots bounding its commands at once."""

    client: Any
    slots: asyncio.Semaphore

    async def run(self, flow: Flow[T], notify: Notify) -> T:
        # (Not redis-py's BlockingConnectionPool: its condition, timeout and context
        # managers on every command cost more CPU than a semaphore that is rarely full.)
        async with self.slots:
            return await adrive(flow, _async_sender(self.client, notify))


class RedisTransport:
    """Runs ``RedisStore``'s flows on its clients; ``where`` names the server, for messages."""

    def __init__(self, settings: RedisSettings) -> None:
        import redis
        import redis.asyncio
        import redis.asyncio.cluster
        import redis.cluster

        # What a call may raise that means the store did not answer usefully (translate()
        # raises a RuntimeError that is not about event loops again, as the bug it is).
        self._errors = (redis.RedisError, OSError, asyncio.TimeoutError, RuntimeError)
        self._loops: LoopLocal[_LoopClient] | None = None  # the store's own asyncio clients
        self._async_client: Any = None  # the caller's, on whatever loop the caller uses it
        self._call_timeout: float | None = None  # a caller's clients keep their own
        # Told of a write the replicas did not acknowledge in time (the store reports it).
        self.on_lapse: Notify = _log_lapse
        client, async_client = settings.client, settings.async_client
        self._owned = client is None and async_client is None
        if self._owned:
            from redis.asyncio.retry import Retry as AsyncRetry
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            where = settings.url or DEFAULT_URL
            options = dict(settings.options)
            if "retry" in options:  # a sync Retry would not serve the asyncio clients
                raise ValueError(
                    "RedisStore sets its clients' retry policy from retries=; for another "
                    "policy, pass your own clients (client=, async_client=)"
                )
            sync_retry = Retry(NoBackoff(), settings.retries, (redis.ConnectionError,))
            async_retry = AsyncRetry(NoBackoff(), settings.retries, (redis.ConnectionError,))
            client = redis.Redis.from_url(where, retry=sync_retry, **options)
            # The asyncio clients get no socket timeout of their own: redis-py wraps every
            # send in asyncio.wait_for when one is set, a task per command (a fifth of a
            # claim's CPU). Each whole call is bounded by it instead (arun).
            self._call_timeout = options.pop("socket_timeout")
            limit: int = options.get("max_connections") or ASYNC_CONNECTIONS
            options["max_connections"] = limit  # (the pool then never refuses: see above)

            async def make() -> _LoopClient:
                client = redis.asyncio.Redis.from_url(
                    where, retry=async_retry, socket_timeout=None, **options
                )
                return _LoopClient(client, asyncio.Semaphore(limit))

            # A loop closed without closing its client: nothing can run on it any more, so
            # the client is only forgotten.
            self._loops = LoopLocal(make, lambda own: own.client.aclose())
        else:
            sync_kinds = (redis.Redis, redis.cluster.RedisCluster)
            async_kinds = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)
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
            self._async_client = async_client
        self._sync_client: Any = client
        self.where = describe(client if client is not None else async_client)

    def run(self, operation: str, flow: Flow[T]) -> T:
        if self._sync_client is None:
            raise TypeError(
                "this RedisStore was given a redis.asyncio client only: use its async methods "
                "(aclaim ...), or pass a sync client (client=redis.Redis(...)) too, or a url"
            )
        try:
            return drive(flow, _sender(self._sync_client, self.on_lapse))
        except self._errors as error:
            raise translate(operation, error, self.where) from error

    async def arun(self, operation: str, flow: Flow[T]) -> T:
        if self._async_client is not None:
            # (bounded by the caller's pool)
            work = adrive(flow, _async_sender(self._async_client, self.on_lapse))
        elif self._loops is not None:
            work = (await self._loops.get()).run(flow, self.on_lapse)
        else:
            raise TypeError(
                "this RedisStore was given a sync redis client only: use its sync methods "
                "(claim ...), or pass async_client=redis.asyncio.Redis(...) too, or a url"
            )
        try:
            if self._call_timeout is None:
                return await work
            return await _bounded(work, self._call_timeout)
        except self._errors as error:
            raise translate(operation, error, self.where) from error

    def listener(self, channel: str, prefix: str) -> Listen | None:
        """The ``Listen`` of ``RedisStore.wakeups``: plain ``SUBSCRIBE`` on one connection of
        the sync client (a cluster's pub/sub reaches every node: see the store's docstring);
        ``None`` without a sync client (its waiters poll)."""
        client = self._sync_client
        if client is None:
            return None

        def listen(
            ready: Callable[[], None], changed: Callable[[str], None], stopping: threading.Event
        ) -> None:
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(channel)
                while not stopping.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":  # also after redis-py reconnected it
                        ready()
                    elif message["type"] == "message":
                        changed(message["data"].decode()[len(prefix) :])
            finally:
                pubsub.close()

        return listen

    def close(self) -> None:
        """Close the own sync client's connections (a client passed in is the caller's to
        close). Using it again reconnects."""
        if self._owned:
            self._sync_client.close()

    async def aclose(self) -> None:
        """Close the running loop's own client's connections; the next call reconnects."""
        if self._loops is not None:
            await self._loops.aclose()


if sys.version_info >= (3, 11):

    async def _bounded(work: Awaitable[T], seconds: float) -> T:
        """``work`` within ``seconds`` (``TimeoutError`` past them): a deadline on the
        running task, no task of its own. (A cancelled redis-py call drops its connection.)"""
        async with asyncio.timeout(seconds):
            return await work

else:  # pragma: no cover - Python 3.10

    async def _bounded(work: Awaitable[T], seconds: float) -> T:
        return await asyncio.wait_for(work, seconds)
