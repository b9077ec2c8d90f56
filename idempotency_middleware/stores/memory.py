"""``MemoryStore``: an in-process store for tests and single-process development."""

from __future__ import annotations

import threading

from ..clock import SYSTEM_CLOCK, Clock
from ..events import OnEvent
from .breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD, BreakerOwner, CircuitBreaker
from .encryption import Encryption, seal_final
from .observers import StoreObservers, observe
from .protocol import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    ClaimResult,
    Completion,
    HeaderPairs,
    Held,
    awaits_nothing,
    parse_token,
    prepare_final,
)
from .records import COMPLETED, DEFERRED, IN_PROGRESS, Record, deferred_by, handed_over

# Records are built with tuple.__new__ (every field given): calling the NamedTuple class runs
# its Python-level __new__, about twice the instructions.
_new = tuple.__new__


class MemoryStore(BreakerOwner):
    """A dict behind a lock. One instance is safe to share across threads and event loops.

    Each operation is a few dict operations under a ``threading.Lock``, never held across an
    ``await``, so the async methods call the sync ones. (Not a ``KitStore``: a flow per call
    would cost more than the dict work, and there is no failure for a breaker to count.)

    ``max_response_bytes`` mimics a backend's item limit (``None``: keep every response);
    expired records are dropped at most once per ``purge_interval_seconds``, the first purge
    due by ``clock``, later ones by the claims' own ``now``. It takes the breaker's options
    like every store, but never fails: its breaker stays closed, and ``check()`` passes.
    ``on_event`` is the store's own hooks: metrics and traces hooks time its claims,
    completions, releases and renewals (``observers.StoreObservers``).
    """

    kind = "memory"  # in metrics and traces (``idempotency.store``)

    def __init__(
        self,
        *,
        max_response_bytes: int | None = None,
        purge_interval_seconds: float = 60.0,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        on_event: OnEvent = None,
    ) -> None:
        self.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown_seconds, clock)
        self.observers = StoreObservers(self.kind, self.breaker, on_event)
        self._records: dict[str, Record] = {}
        self.lock = threading.Lock()
        self._max_response_bytes = max_response_bytes
        # Purged on a claim at most once per interval, by the claims' own clock (the hot path
        # reads none): memory stays bounded by what the TTL keeps.
        self._purge_interval = purge_interval_seconds
        self._next_purge = clock.now() + purge_interval_seconds
        self.clock = clock

    # The four calls of an attempt are timed for the store's observers, when it has any
    # (one truth test when not); the operator's get and delete are not.
    def claim(self, request: ClaimRequest) -> ClaimResult:
        if self.observers.observers:
            return observe(self.observers, "claim", self._claim, request)
        return self._claim(request)

    def complete(self, completion: Completion) -> bool:
        if self.observers.observers:
            return observe(self.observers, "complete", self._complete, completion)
        return self._complete(completion)

    def release(self, key_hash: str, owner: str) -> bool:
        if self.observers.observers:
            return observe(self.observers, "release", self._release, key_hash, owner)
        return self._release(key_hash, owner)

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        if self.observers.observers:
            return observe(self.observers, "renew", self._renew, key_hash, owner, lock_expires_at)
        return self._renew(key_hash, owner, lock_expires_at)

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        # (Unpacked at once: cheaper than six NamedTuple attribute reads.)
        key_hash, fingerprint, owner, now, lock_timeout_seconds, skew = request
        with self.lock:
            # Read before purging: a stale claim the purge drops is still taken over here,
            # and reported so.
            existing = self._records.get(key_hash)
            if now >= self._next_purge:
                self._purge(now, skew)
            if existing is not None and not existing.is_claimable(now, skew):
                return Held(existing)
            # (request.lock_expires_at, computed here: a property call costs more than the
            # sum. An in-progress claim expires with its lock.)
            lock = now + lock_timeout_seconds
            claim = (key_hash, IN_PROGRESS, fingerprint, owner, lock, lock, None, False, 0)
            self._records[key_hash] = _new(Record, claim)
            if existing is not None and existing.status is IN_PROGRESS:
                return TAKEN_OVER
            return CLAIMED

    def _complete(self, completion: Completion) -> bool:
        # (Unpacked at once, and Completion.body_size and .expires_at computed here:
        # attribute reads and property calls cost more.)
        key_hash, owner, now, ttl_seconds, response, streamed, streamed_size, _, deferred, to = (
            completion
        )
        size = streamed_size if streamed else len(response.body)
        too_large = streamed or (
            self._max_response_bytes is not None and size > self._max_response_bytes
        )
        with self.lock:
            existing = self._records.get(key_hash)
            if existing is None or existing.owner != owner:
                # (Handed over already: this interim completion again.)
                return handed_over(existing, to)
            if deferred and existing.status is not IN_PROGRESS:
                # Deferred already (this completion again), or the work's final response
                # landed first: done either way, and the final response is kept.
                return True
            # Built directly: NamedTuple._replace costs several times as much. (The key and
            # owner are those just matched; the fingerprint and the lock deadline read by
            # index, which costs less than a field name or a slice.)
            status = DEFERRED if deferred else COMPLETED
            kept, expires = None if too_large else response, now + ttl_seconds
            record = (
                key_hash,
                status,
                existing[2],  # fingerprint
                owner if to is None else to,
                existing[4],  # lock_expires_at
                expires,
                kept,
                too_large,
                size,
            )
            self._records[key_hash] = _new(Record, record)
            return True

    def _claim_of(self, key_hash: str, owner: str) -> Record | None:
        """``owner``'s claim still in progress (never a final response a deferral's worker
        stored while the handler was still running); under the lock."""
        existing = self._records.get(key_hash)
        if existing is None or existing.owner != owner or existing.status is not IN_PROGRESS:
            return None
        return existing

    def _release(self, key_hash: str, owner: str) -> bool:
        with self.lock:
            if self._claim_of(key_hash, owner) is None:
                return False
            del self._records[key_hash]
            return True

    def _renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        with self.lock:
            existing = self._claim_of(key_hash, owner)
            if existing is None:
                return False
            self._records[key_hash] = existing._replace(
                lock_expires_at=lock_expires_at, expires_at=lock_expires_at
            )
            return True

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: HeaderPairs = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool:
        prepared = prepare_final(token, status, headers, body, self.clock.now(), encryption)
        if prepared is None:
            return False
        parsed = prepared[0]
        with self.lock:
            existing = self._records.get(parsed.key_hash)
            response = seal_final(existing, *prepared, encryption)
            if response is None or existing is None:
                return False
            size = len(response.body)
            too_large = self._max_response_bytes is not None and size > self._max_response_bytes
            self._records[parsed.key_hash] = existing._replace(
                status=COMPLETED,
                expires_at=float(parsed.expires_at),
                response=None if too_large else response,
                response_not_stored=too_large,
                response_size=size,
            )
            return True

    def release_deferred(self, token: str) -> bool:
        parsed = parse_token(token)
        with self.lock:
            if not deferred_by(self._records.get(parsed.key_hash), parsed.owner):
                return False
            del self._records[parsed.key_hash]
            return True

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: HeaderPairs = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool:
        return self.complete_deferred(token, status, headers, body, encryption=encryption)

    async def arelease_deferred(self, token: str) -> bool:
        return self.release_deferred(token)

    def _purge(self, now: float, skew: float) -> None:
        self._next_purge = now + self._purge_interval
        for key_hash in [
            k for k, record in self._records.items() if record.is_claimable(now, skew)
        ]:
            del self._records[key_hash]

    def get(self, key_hash: str) -> Record | None:
        with self.lock:
            return self._records.get(key_hash)

    def delete(self, key_hash: str) -> bool:
        with self.lock:
            return self._records.pop(key_hash, None) is not None

    def create_table(self) -> None:
        """Nothing to create."""

    def check(self) -> None:
        """Nothing to check: a dict is always usable."""

    def __len__(self) -> int:
        with self.lock:
            return len(self._records)

    # (Marked: the async driver calls the sync methods directly, one coroutine less each.)
    @awaits_nothing("claim")
    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        return self.claim(request)

    @awaits_nothing("complete")
    async def acomplete(self, completion: Completion) -> bool:
        return self.complete(completion)

    @awaits_nothing("release")
    async def arelease(self, key_hash: str, owner: str) -> bool:
        return self.release(key_hash, owner)

    @awaits_nothing("renew")
    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return self.renew(key_hash, owner, lock_expires_at)

    async def aget(self, key_hash: str) -> Record | None:
        return self.get(key_hash)

    async def adelete(self, key_hash: str) -> bool:
        return self.delete(key_hash)

    async def acreate_table(self) -> None:
        """Nothing to create."""

    async def acheck(self) -> None:
        """Nothing to check."""
