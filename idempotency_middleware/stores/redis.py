"""``RedisStore``: Redis, Valkey or Redis Cluster, through redis-py's sync and asyncio clients.

Each operation (claim, complete, release, renew, and the deferred completions) is one Lua
script run with ``EVALSHA`` on one key, ``prefix + key_hash``: atomic, fenced by the claim's
owner token, one round trip, and at home on a cluster (see ``redis_scripts.py`` for the
record layout and the scripts). ``get`` is one ``HGETALL``, ``delete`` one ``DEL``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import deferred
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD, BreakerOwner, CircuitBreaker
from ..clock import SYSTEM_CLOCK, Clock
from ..records import Record, Status
from . import redis_scripts as lua
from .base import ClaimRequest, ClaimResult, Completion
from .kit import require_modules
from .redis_clients import RedisClients


class RedisStore(RedisClients, BreakerOwner):
    """Idempotency records in Redis (or Valkey, or a Redis Cluster), for WSGI and ASGI alike.

    ``RedisStore("redis://cache:6379/0")`` builds its own clients with redis-py's
    ``from_url``: one sync client (thread-safe, pooled) for the sync methods and one asyncio
    client per event loop for the ``a``-prefixed ones, with ``socket_timeout``,
    ``socket_connect_timeout``, ``retries`` (on a dropped connection only, without backoff:
    every script is safe to send twice) and any other ``from_url`` option in
    ``client_options``. Or pass your own ``client`` (``redis.Redis``,
    ``redis.cluster.RedisCluster``, or their ``redis.asyncio`` twins; and ``async_client``
    beside a sync one): it is used as it is (TLS, authentication, pools, retries are yours),
    never closed by the store, and must not decode responses. A store given only a sync
    client has no async methods to offer (``TypeError``), and the reverse.

    Records live at ``prefix + key_hash``. Deadlines are checked by the scripts against
    each request's own ``now``; the keys' millisecond TTLs are housekeeping, set
    ``ttl_grace_seconds`` past each deadline. A response body over ``max_response_bytes``
    (``None``: up to Redis's 512 MB value limit) completes its key without being kept.
    """

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
        self.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown_seconds, clock)
        self._clock = clock
        self._init_clients(
            url,
            client,
            async_client,
            socket_timeout,
            socket_connect_timeout,
            retries,
            client_options,
        )

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.prefix!r})"

    def _script(self, operation: str, script: str, key_hash: str, args: list[Any]) -> Any:
        keys = [self.prefix + key_hash]
        return self._call(operation, lambda _, scripts: scripts[script](keys=keys, args=args))

    async def _ascript(self, operation: str, script: str, key_hash: str, args: list[Any]) -> Any:
        keys = [self.prefix + key_hash]
        return await self._acall(
            operation, lambda _, scripts: scripts[script](keys=keys, args=args)
        )

    # -- what each operation sends ----------------------------------------------------

    def _completion(self, completion: Completion) -> list[Any]:
        blob = lua.response_blob(
            completion.response,
            completion.body_size,
            completion.streamed,
            self.max_response_bytes,
        )
        return lua.completion_args(
            completion.owner,
            "interim" if completion.deferred else "any",
            Status.DEFERRED if completion.deferred else Status.COMPLETED,
            completion.expires_at,
            completion.body_size,
            blob,
            lua.ttl_ms(completion.expires_at, completion.now, self.ttl_grace_seconds),
        )

    def _final(
        self, token: str, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes
    ) -> tuple[str, list[Any]] | None:
        now = self._clock.now()
        prepared = deferred.prepare_final(token, status, headers, body, now)
        if prepared is None:
            return None
        parsed, response = prepared
        size = len(response.body)
        blob = lua.response_blob(response, size, False, self.max_response_bytes)
        expires_at = float(parsed.expires_at)
        ttl = lua.ttl_ms(expires_at, now, self.ttl_grace_seconds)
        args = lua.completion_args(
            parsed.owner, "final", Status.COMPLETED, expires_at, size, blob, ttl
        )
        return parsed.key_hash, args

    # -- the store protocol (sync) ----------------------------------------------------

    def claim(self, request: ClaimRequest) -> ClaimResult:
        """Claim ``request.key_hash`` in one script; ``Held`` with the holding record
        (response included) in the same round trip otherwise."""
        args = lua.claim_args(request, self.ttl_grace_seconds)
        probe = self.breaker.admit()
        try:
            reply = self._script("claim", "claim", request.key_hash, args)
        finally:
            if probe:
                self.breaker.end_probe()
        return lua.claim_result(request.key_hash, reply)

    def complete(self, completion: Completion) -> bool:
        """Store the response; ``False`` when the claim is no longer ``owner``'s."""
        args = self._completion(completion)
        return bool(self._script("complete", "complete", completion.key_hash, args))

    def release(self, key_hash: str, owner: str) -> bool:
        """Delete the claim; ``False`` when it is no longer ``owner``'s."""
        return bool(self._script("release", "release", key_hash, [owner, "in_progress"]))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """Extend an in-progress claim; ``False`` when it is no longer ``owner``'s."""
        args = [owner, lua.seconds(lock_expires_at)]
        return bool(self._script("renew", "renew", key_hash, args))

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        """Store the final response of work deferred with ``defer_completion()``; ``False``
        when the token no longer applies (completed, expired, taken over)."""
        final = self._final(token, status, headers, body)
        if final is None:
            return False
        return bool(self._script("complete_deferred", "complete", *final))

    def release_deferred(self, token: str) -> bool:
        """Forget a deferred key whose work did not happen; ``False`` when the token no
        longer applies."""
        parsed = deferred.parse_token(token)
        args = [parsed.owner, "unfinished"]
        return bool(self._script("release_deferred", "release", parsed.key_hash, args))

    def get(self, key_hash: str) -> Record | None:
        """The record under ``key_hash`` as stored (expired or not)."""
        key = self.prefix + key_hash
        fields = self._call("get", lambda client, _: client.hgetall(key))
        return lua.record_from_hash(key_hash, fields)

    def delete(self, key_hash: str) -> bool:
        """Remove a record whoever owns it; ``True`` when there was one."""
        key = self.prefix + key_hash
        return bool(self._call("delete", lambda client, _: client.delete(key)))

    def create_table(self) -> None:
        """Nothing to create in Redis: checks that the server answers (``PING``)."""
        self._call("create_table", lambda client, _: client.ping())

    def warm_up(self) -> None:
        """Load the scripts now, so the first claim does not pay for it."""

        def load(client: Any, scripts: dict[str, Any]) -> None:
            for script in scripts.values():
                client.script_load(script.script)

        self._call("warm_up", load)

    # -- the store protocol (async) ---------------------------------------------------

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        """:meth:`claim` on the running loop's asyncio client."""
        args = lua.claim_args(request, self.ttl_grace_seconds)
        probe = self.breaker.admit()
        try:
            reply = await self._ascript("claim", "claim", request.key_hash, args)
        finally:
            if probe:
                self.breaker.end_probe()
        return lua.claim_result(request.key_hash, reply)

    async def acomplete(self, completion: Completion) -> bool:
        """:meth:`complete` on the running loop's asyncio client."""
        args = self._completion(completion)
        return bool(await self._ascript("complete", "complete", completion.key_hash, args))

    async def arelease(self, key_hash: str, owner: str) -> bool:
        """:meth:`release` on the running loop's asyncio client."""
        return bool(await self._ascript("release", "release", key_hash, [owner, "in_progress"]))

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """:meth:`renew` on the running loop's asyncio client."""
        args = [owner, lua.seconds(lock_expires_at)]
        return bool(await self._ascript("renew", "renew", key_hash, args))

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        """:meth:`complete_deferred` on the running loop's asyncio client."""
        final = self._final(token, status, headers, body)
        if final is None:
            return False
        return bool(await self._ascript("complete_deferred", "complete", *final))

    async def arelease_deferred(self, token: str) -> bool:
        """:meth:`release_deferred` on the running loop's asyncio client."""
        parsed = deferred.parse_token(token)
        args = [parsed.owner, "unfinished"]
        return bool(await self._ascript("release_deferred", "release", parsed.key_hash, args))

    async def aget(self, key_hash: str) -> Record | None:
        """:meth:`get` on the running loop's asyncio client."""
        key = self.prefix + key_hash
        fields = await self._acall("get", lambda client, _: client.hgetall(key))
        return lua.record_from_hash(key_hash, fields)

    async def adelete(self, key_hash: str) -> bool:
        """:meth:`delete` on the running loop's asyncio client."""
        key = self.prefix + key_hash
        return bool(await self._acall("delete", lambda client, _: client.delete(key)))

    async def acreate_table(self) -> None:
        """:meth:`create_table` on the running loop's asyncio client."""
        await self._acall("create_table", lambda client, _: client.ping())

    async def awarm_up(self) -> None:
        """Make the running loop's client and load the scripts, so the first claim pays for
        neither. ``IdempotencyMiddleware`` calls this at ASGI lifespan start-up."""

        async def load(client: Any, scripts: dict[str, Any]) -> None:
            for script in scripts.values():
                await client.script_load(script.script)

        await self._acall("warm_up", load)
