"""``RedisStore``: Redis, Valkey or Redis Cluster, through redis-py's sync and asyncio clients.

What it sends is in ``ops.py`` (one Lua script per operation, on one key), what it sends
through in ``transport.py``; the kit writes every public method once over those.
"""

from __future__ import annotations

import logging
from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...events import OnEvent
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD
from ..kit import KitStore, require_modules
from ..protocol import StoreUnavailable
from ..wakeups import Wakeups
from .ops import Lapse, RedisOps, load_scripts
from .transport import RedisSettings, RedisTransport

logger = logging.getLogger("idempotency_middleware")


class RedisStore(KitStore):
    """Idempotency records in Redis (or Valkey, or a Redis Cluster), for WSGI and ASGI alike,
    at ``prefix + key_hash`` (the Redis page of the documentation says the rest).

    ``RedisStore("redis://cache:6379/0")`` builds its own clients with redis-py's
    ``from_url`` (a sync one, and one asyncio client per event loop), with
    ``socket_timeout``, ``socket_connect_timeout``, ``retries`` (on a dropped connection)
    and ``client_options``; an asyncio client runs at most 16 commands at once (its
    connections: ``max_connections=n``), a burst's claims waiting for a free one. Or pass
    your own ``client`` and/or ``async_client``: used as they are, never closed by the
    store, and they must not decode responses (a Sentinel client,
    ``Sentinel(...).master_for(name)``, and a ``RedisCluster`` are such clients). With
    ``replicas=N``, each claim and completion waits (``WAIT``, at most
    ``replica_timeout_seconds``) for ``N`` replicas to acknowledge it, so a failover cannot
    lose it: a claim not acknowledged in time is released and refused (cause
    ``"not_replicated"``); a completion is kept, logged and reported as ``not_replicated``,
    its response still sent. The keys' TTLs are housekeeping,
    ``ttl_grace_seconds`` past each deadline; a body over ``max_response_bytes`` completes
    its key without being kept.
    """

    kind = "redis"  # in metrics and traces (``idempotency.store``)

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        async_client: Any = None,
        prefix: str = "idempotency:",
        socket_timeout: float | None = 2.0,
        socket_connect_timeout: float | None = 1.0,
        retries: int = 1,
        ttl_grace_seconds: float = 60.0,
        max_response_bytes: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        on_event: OnEvent = None,
        replicas: int = 0,
        replica_timeout_seconds: float = 0.5,
        **client_options: Any,
    ) -> None:
        require_modules(type(self).__name__, ("redis",), "redis")
        if url is not None and (client is not None or async_client is not None):
            raise ValueError("RedisStore takes a url or a client, not both")
        if ttl_grace_seconds < 0:
            raise ValueError(f"ttl_grace_seconds must not be negative, got {ttl_grace_seconds!r}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be a non-negative integer, got {replicas!r}")
        if (
            isinstance(replica_timeout_seconds, bool)
            or not isinstance(replica_timeout_seconds, (int, float))
            or not 0 < replica_timeout_seconds < 3600
        ):
            raise ValueError(
                "replica_timeout_seconds must be a positive number of seconds (under an "
                f"hour), got {replica_timeout_seconds!r}"
            )
        self.prefix = prefix
        self.replicas, self.replica_timeout_seconds = replicas, float(replica_timeout_seconds)
        self.max_response_bytes = max_response_bytes
        self.ttl_grace_seconds = float(ttl_grace_seconds)
        options = dict(client_options, socket_timeout=socket_timeout)
        options.update(socket_connect_timeout=socket_connect_timeout)
        transport = RedisTransport(RedisSettings(url, client, async_client, options, retries))
        self._where = transport.where
        breaker = (clock, breaker_threshold, breaker_cooldown_seconds)
        ops = RedisOps(
            prefix, self.ttl_grace_seconds, max_response_bytes, replicas, replica_timeout_seconds
        )
        super().__init__(ops, transport, *breaker, on_event)
        transport.on_lapse = self._not_replicated
        listen = transport.listener(ops.channel, prefix)
        self.wakeups = None if listen is None else Wakeups(listen, ops.channel, repr(self))

    def _not_replicated(self, lapse: Lapse) -> None:
        """A completion landed on the primary only: logged, and told to the doors' hooks."""
        reason = lapse.describe()
        logger.warning(
            "idempotency store: %s",
            reason,
            extra={"idempotency_event": "not_replicated", "idempotency_key_hash": lapse.key_hash},
        )
        failure = StoreUnavailable(
            f"Redis {lapse.operation} not replicated",
            code="WAIT",
            cause="not_replicated",
            reason=reason,
        )
        self.breaker.tell("not_replicated", failure, lapse.key_hash, lapse.operation)

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.prefix!r})"

    def warm_up(self) -> None:
        """Load the scripts now, so the first claim does not pay for it."""
        self.run_flow("warm_up", load_scripts())

    async def awarm_up(self) -> None:
        """Make the running loop's client and load the scripts, so the first claim pays for
        neither. ``IdempotencyMiddleware`` calls this at ASGI lifespan start-up."""
        await self.arun_flow("warm_up", load_scripts())
