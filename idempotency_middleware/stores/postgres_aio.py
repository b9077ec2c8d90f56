"""The async half of ``PostgresStore``'s protocol: the same flows as the sync methods, run
on the running event loop's pool (``postgres_async.AsyncPools``), never on a thread."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import deferred
from ..breaker import CircuitBreaker
from ..clock import Clock
from ..options import DEFAULT_CLOCK_SKEW_SECONDS
from ..records import Record
from . import postgres_sql as flows
from .base import ClaimRequest, ClaimResult, Completion, StoreUnavailable
from .postgres_sql import Flow, Statements

if TYPE_CHECKING:
    from .postgres_async import AsyncPools

# SQLSTATEs of a CREATE racing another session's (unique_violation on pg_type or pg_class,
# duplicate_table, duplicate_object): the other one created it, so creating again finds it.
CREATE_RACES = frozenset({"23505", "42P07", "42710"})


class AsyncMethods:
    """``aclaim``, ``acomplete`` ... for ``PostgresStore`` (which provides what is declared)."""

    _async: AsyncPools
    _sql: Statements
    _clock: Clock
    breaker: CircuitBreaker
    max_response_bytes: int | None
    purge_batch_size: int

    if TYPE_CHECKING:  # PostgresStore's, shared with its sync methods

        def purge_due(self, cutoff: float, finished_only: bool) -> Flow[int] | None: ...

        def _final_flow(
            self, token: str, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes
        ) -> Flow[bool] | None: ...

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        """:meth:`claim` on the running loop's pool."""
        purge = self.purge_due(request.stale_before, False)
        if self.breaker.admit():
            try:
                return await self._async.run("claim", flows.claim(self._sql, request), purge)
            finally:
                self.breaker.end_probe()
        return await self._async.run("claim", flows.claim(self._sql, request), purge)

    async def acomplete(self, completion: Completion) -> bool:
        """:meth:`complete` on the running loop's pool."""
        flow = flows.complete(self._sql, completion, self.max_response_bytes)
        return await self._async.run("complete", flow, self.purge_due(completion.now, True))

    async def arelease(self, key_hash: str, owner: str) -> bool:
        """:meth:`release` on the running loop's pool."""
        flow = flows.one(self._sql.release, (key_hash, owner))
        return await self._async.run("release", flow) == 1

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """:meth:`renew` on the running loop's pool."""
        params = {"key": key_hash, "owner": owner, "lock_expires_at": lock_expires_at}
        return await self._async.run("renew", flows.one(self._sql.renew, params)) == 1

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        """:meth:`complete_deferred` on the running loop's pool."""
        flow = self._final_flow(token, status, headers, body)
        return False if flow is None else await self._async.run("complete_deferred", flow)

    async def arelease_deferred(self, token: str) -> bool:
        """:meth:`release_deferred` on the running loop's pool."""
        parsed = deferred.parse_token(token)
        flow = flows.one(self._sql.release_deferred, (parsed.key_hash, parsed.owner))
        return await self._async.run("release_deferred", flow) == 1

    async def aget(self, key_hash: str) -> Record | None:
        """:meth:`get` on the running loop's pool."""
        return await self._async.run("get", flows.get(self._sql, key_hash))

    async def adelete(self, key_hash: str) -> bool:
        """:meth:`delete` on the running loop's pool."""
        return await self._async.run("delete", flows.one(self._sql.delete, (key_hash,))) > 0

    async def acreate_table(self) -> None:
        """:meth:`create_table` on the running loop's pool."""
        for attempt in range(3):
            try:
                await self._async.run("create_table", flows.create_table(self._sql), None, True)
                return
            except StoreUnavailable as error:
                if error.code not in CREATE_RACES or attempt == 2:
                    raise

    async def apurge_expired(
        self, now: float | None = None, *, clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    ) -> int:
        """:meth:`purge_expired` on the running loop's pool."""
        cutoff = (self._clock.now() if now is None else now) - clock_skew_seconds
        flow = flows.purge(self._sql.purge, cutoff, self.purge_batch_size, None)
        return await self._async.run("purge", flow)
