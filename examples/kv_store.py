"""A whole store in 100 lines on the store kit, over a backend with only ``get`` and
compare-and-set (etcd, Consul, FoundationDB; here a dict behind a lock). ``KitStore`` writes
the public methods, ``check()`` included. Its contract:
``tests/contract/test_store_contract.py -k kv``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from idempotency_middleware.clock import SYSTEM_CLOCK, Clock
from idempotency_middleware.stores import CLAIMED, TAKEN_OVER, ClaimRequest, Completion, Held
from idempotency_middleware.stores.kit import Flow, KitStore, drive
from idempotency_middleware.stores.protocol import ClaimResult, DeferredToken
from idempotency_middleware.stores.records import Record, Status, StoredResponse

IN_PROGRESS, DEFERRED, COMPLETED = Status.IN_PROGRESS, Status.DEFERRED, Status.COMPLETED


class KeyValueTransport:
    """Stands in for a network client: ``("get", key)``, ``("cas", key, old, new)``, atomic."""

    def __init__(self) -> None:
        self.data: dict[str, Record] = {}
        self.lock = threading.Lock()

    def send(self, request: tuple[Any, ...]) -> Any:
        with self.lock:
            if request[0] == "get":
                return self.data.get(request[1])
            _, key, old, new = request
            if self.data.get(key) != old:
                return False
            self.data.pop(key, None) if new is None else self.data.__setitem__(key, new)
            return True

    def run(self, operation: str, flow: Flow[Any]) -> Any:
        return drive(flow, self.send)

    async def arun(self, operation: str, flow: Flow[Any]) -> Any:
        return drive(flow, self.send)

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


def owned(owner: str, *states: Status) -> Callable[[Record], bool]:
    return lambda old: old.owner == owner and old.status in states


class KeyValueOps:
    """Each operation reads, decides and compares-and-sets; again when another writer won."""

    supports_deferral = True

    def __init__(self, max_response_bytes: int | None) -> None:
        self.limit = max_response_bytes  # like a backend's item limit

    def _too_large(self, size: int) -> bool:
        return self.limit is not None and size > self.limit

    def claim(self, request: ClaimRequest) -> Flow[ClaimResult]:
        key, lock = request.key_hash, request.lock_expires_at
        while True:
            old = yield ("get", key)
            if old is not None and not old.is_claimable(request.now, request.clock_skew_seconds):
                return Held(old)
            new = Record(key, IN_PROGRESS, request.fingerprint, request.owner, lock, lock)
            if (yield ("cas", key, old, new)):
                return TAKEN_OVER if old is not None and old.status is IN_PROGRESS else CLAIMED

    def _write(self, key: str, may: Callable[[Record], bool], **fields: Any) -> Flow[bool]:
        """Change (or, without fields, delete) the record when ``may`` allows it."""
        while True:
            old = yield ("get", key)
            if old is None or not may(old):
                return False
            if (yield ("cas", key, old, old._replace(**fields) if fields else None)):
                return True

    def complete(self, done: Completion) -> Flow[bool]:
        if done.deferred:  # deferred already, or its final response came first: done
            old = yield ("get", done.key_hash)
            if old is not None and owned(done.owner, DEFERRED, COMPLETED)(old):
                return True
        # The owner's completion again: the last wins (an interim one never replaces a final).
        again, status = ((), DEFERRED) if done.deferred else ((DEFERRED, COMPLETED), COMPLETED)
        dropped = done.streamed or self._too_large(done.body_size)  # completed, body not kept
        return (
            yield from self._write(
                done.key_hash, owned(done.owner, IN_PROGRESS, *again), status=status,
                expires_at=done.expires_at, response=None if dropped else done.response,
                response_not_stored=dropped, response_size=done.body_size)
        )  # fmt: skip

    def release(self, key_hash: str, owner: str) -> Flow[bool]:
        return (yield from self._write(key_hash, owned(owner, IN_PROGRESS)))

    def renew(self, key_hash: str, owner: str, at: float) -> Flow[bool]:
        may = owned(owner, IN_PROGRESS)
        return (yield from self._write(key_hash, may, lock_expires_at=at, expires_at=at))

    def complete_final(self, token: DeferredToken, reply: StoredResponse, now: float) -> Flow[bool]:
        may, size = owned(token.owner, IN_PROGRESS, DEFERRED), len(reply.body)
        dropped = self._too_large(size)
        return (
            yield from self._write(token.key_hash, may, status=COMPLETED,
                expires_at=float(token.expires_at), response=None if dropped else reply,
                response_not_stored=dropped, response_size=size)
        )  # fmt: skip

    def release_unfinished(self, token: DeferredToken) -> Flow[bool]:
        return (yield from self._write(token.key_hash, owned(token.owner, IN_PROGRESS, DEFERRED)))

    def get(self, key_hash: str) -> Flow[Record | None]:
        record: Record | None = yield ("get", key_hash)
        return record

    def delete(self, key_hash: str) -> Flow[bool]:
        return (yield from self._write(key_hash, lambda old: True))

    def create_table(self) -> Flow[None]:
        return None
        yield  # a flow that sends nothing


class KeyValueStore(KitStore):
    """The public class: configuration only."""

    def __init__(self, *, max_response_bytes: int | None = None, clock: Clock = SYSTEM_CLOCK):
        super().__init__(KeyValueOps(max_response_bytes), KeyValueTransport(), clock=clock)
