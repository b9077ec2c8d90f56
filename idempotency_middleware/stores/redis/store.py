"""``RedisStore``: Redis, Valkey or Redis Cluster, through redis-py's sync and asyncio clients.

What it sends is in ``ops.py`` (one Lua script per operation, on one key), what it sends
through in ``transport.py``; the kit writes every public method once over those.
"""

from __future__ import annotations

from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...events import OnEvent
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD
from ..kit import KitStore, require_modules
from ..wakeups import Wakeups
from .ops import RedisOps, load_scripts
from .transport import RedisSettings, RedisTransport


class RedisStore(KitStore):
    """Idempotency records in Redis (or Valkey, or a Redis Cluster), for WSGI and ASGI alike,
    at ``prefix + key_hash`` (the Redis page of the documentation says the rest).

    ``RedisStore("redis://cache:6379/0")`` builds its own clients with redis-py's
    ``from_url`` (a sync one, and one asyncio client per event loop), with
    ``socket_timeout``, ``socket_connect_timeout``, ``retries`` (on a dropped connection)
    and ``client_options``; an asyncio client runs at most 16 commands at once (its
    connections: ``max_connections=n``), a burst's claims waiting for a free one. Or pass
    your own ``client`` and/or ``async_client``: used as they are, never closed by the
    store, and they must not decode responses. The keys' TTLs are housekeeping,
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
        **client_options: Any,
    ) -> None:
        require_modules(type(self).__name__, ("redis",), "redis")
        if url is not None and (client is not None or async_client is not None):
            raise ValueError("RedisStore takes a url or a client, not both")
        if ttl_grace_seconds < 0:
            raise ValueError(f"ttl_grace_seconds must not be negative, got {ttl_grace_seconds!r}")
        self.prefix = prefix
        self.max_response_bytes = max_response_bytes
        self.ttl_grace_seconds = float(ttl_grace_seconds)
        options = dict(client_options, socket_timeout=socket_timeout)
        options.update(socket_connect_timeout=socket_connect_timeout)
        transport = RedisTransport(RedisSettings(url, client, async_client, options, retries))
        self._where = transport.where
        breaker = (clock, breaker_threshold, breaker_cooldown_seconds)
        ops = RedisOps(prefix, self.ttl_grace_seconds, max_response_bytes)
        super().__init__(ops, transport, *breaker, on_event)
        listen = transport.listener(ops.channel, prefix)
        self.wakeups = None if listen is None else Wakeups(listen, ops.channel, repr(self))

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.prefix!r})"

    def warm_up(self) -> None:
        """Load the scripts now, so the first claim does not pay for it."""
        self.run_flow("warm_up", load_scripts())

    async def awarm_up(self) -> None:
        """Make the running loop's client and load the scripts, so the first claim pays for
        neither. ``IdempotencyMiddleware`` calls this at ASGI lifespan start-up."""
        await self.arun_flow("warm_up", load_scripts())
