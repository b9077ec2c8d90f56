"""Small apps and store wrappers for the ``wait_seconds`` tests (tests/e2e/test_wait.py).

``Handler`` is one endpoint's behaviour shared by a raw ASGI app and a raw WSGI app: every
call is numbered, a call can be held at a gate the test opens, and a call can be told to
answer another status. The answer is JSON ``{"call": N, "received": body}``.

``CountingStore`` and ``CountingAsyncStore`` delegate to a real store and record every claim
(when, by which owner, what it answered) in a ``ClaimLog``, so a test can see a waiter poll
and wait until it has. ``before_claim`` lets a test script what the first attempt does
between two polls (complete, release) or make one claim fail, without touching the store.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

import orjson

from idempotency_middleware.clock import Clock
from idempotency_middleware.stores.protocol import (
    AsyncStore,
    ClaimRequest,
    ClaimResult,
    Completion,
    Held,
    SyncStore,
)
from idempotency_middleware.web.asgi import ASGIApp, Receive, Scope, Send
from idempotency_middleware.web.wsgi import Environ, StartResponse, WSGIApp

GATE_TIMEOUT_SECONDS = 10.0


class Handler:
    """Thread-safe: numbered calls, gates, statuses (201 unless told otherwise)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._calls = 0
        self._returned = 0
        self._gates: dict[int, threading.Event] = {}
        self._statuses: dict[int, int] = {}

    def hold(self, call: int) -> threading.Event:
        """Call number ``call`` blocks until the returned event is set."""
        gate = threading.Event()
        with self._condition:
            self._gates[call] = gate
        return gate

    def answer(self, call: int, status: int) -> None:
        with self._condition:
            self._statuses[call] = status

    @property
    def calls(self) -> int:
        with self._condition:
            return self._calls

    @property
    def returned(self) -> int:
        with self._condition:
            return self._returned

    def wait_for_calls(self, count: int, timeout: float = 5.0) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: self._calls >= count, timeout)

    def enter(self) -> tuple[int, threading.Event | None]:
        with self._condition:
            self._calls += 1
            self._condition.notify_all()
            return self._calls, self._gates.get(self._calls)

    def leave(self, call: int, body: bytes) -> tuple[int, bytes]:
        with self._condition:
            self._returned += 1
            self._condition.notify_all()
            status = self._statuses.get(call, 201)
        return status, orjson.dumps({"call": call, "received": body.decode("latin-1")})


def asgi_app(handler: Handler) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        call, gate = handler.enter()
        if gate is not None:
            await asyncio.to_thread(gate.wait, GATE_TIMEOUT_SECONDS)
        status, body = handler.leave(call, b"".join(chunks))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


def wsgi_app(handler: Handler) -> WSGIApp:
    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        received = environ["wsgi.input"].read(length)
        call, gate = handler.enter()
        if gate is not None:
            gate.wait(GATE_TIMEOUT_SECONDS)
        status, body = handler.leave(call, received)
        start_response(f"{status} X", [("Content-Type", "application/json")])
        return [body]

    return app


# --- counting store wrappers ---------------------------------------------------------------


class SeenClaim(NamedTuple):
    at: float  # the clock's time when the claim was made
    owner: str
    held: bool | None  # None: the claim raised


class ClaimLog:
    """Every claim a wrapper passed on, in order; thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._condition = threading.Condition()
        self._claims: list[SeenClaim] = []
        self.other_calls: list[tuple[str, str]] = []  # (operation, owner)

    def add(self, request: ClaimRequest, held: bool | None) -> None:
        with self._condition:
            self._claims.append(SeenClaim(self._clock.now(), request.owner, held))
            self._condition.notify_all()

    def add_other(self, operation: str, owner: str) -> None:
        with self._condition:
            self.other_calls.append((operation, owner))
            self._condition.notify_all()

    @property
    def claims(self) -> list[SeenClaim]:
        with self._condition:
            return list(self._claims)

    def owners(self) -> list[str]:
        """Owners in the order of their first claim."""
        seen: list[str] = []
        for claim in self.claims:
            if claim.owner not in seen:
                seen.append(claim.owner)
        return seen

    def by(self, owner: str) -> list[SeenClaim]:
        return [claim for claim in self.claims if claim.owner == owner]

    def waiter_claims(self) -> list[SeenClaim]:
        """The claims of every owner but the first one to claim."""
        claims = self.claims
        if not claims:
            return []
        first = claims[0].owner
        return [claim for claim in claims if claim.owner != first]

    def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> bool:
        with self._condition:
            return self._condition.wait_for(condition, timeout)


BeforeClaim = Callable[[int, ClaimRequest], None]


class _Both(SyncStore, AsyncStore, Protocol):
    """A store with both flavours (``MemoryStore``, ``SQLiteStore``)."""


class CountingAsyncStore:
    """An async store delegating to ``inner``, logging every call (``AsyncDynamoDBStore``)."""

    def __init__(self, inner: AsyncStore, clock: Clock) -> None:
        self.async_inner = inner
        self.log = ClaimLog(clock)

    def _prepare(self, request: ClaimRequest) -> None:
        """Runs before a claim is passed on (``CountingStore``'s hook)."""

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        self._prepare(request)
        result = await self.async_inner.aclaim(request)
        self.log.add(request, isinstance(result, Held))
        return result

    async def acomplete(self, completion: Completion) -> bool:
        self.log.add_other("complete", completion.owner)
        return await self.async_inner.acomplete(completion)

    async def arelease(self, key_hash: str, owner: str) -> bool:
        self.log.add_other("release", owner)
        return await self.async_inner.arelease(key_hash, owner)

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        self.log.add_other("renew", owner)
        return await self.async_inner.arenew(key_hash, owner, lock_expires_at)


class CountingStore(CountingAsyncStore):
    """A sync and async store delegating to ``inner``, logging claims. ``before_claim(n,
    request)`` runs before the ``n``-th claim (1+) is passed on; it may raise."""

    def __init__(self, inner: _Both, clock: Clock, before_claim: BeforeClaim | None = None) -> None:
        super().__init__(inner, clock)
        self.inner = inner
        self.before_claim = before_claim
        self._count = 0
        self._lock = threading.Lock()

    def _prepare(self, request: ClaimRequest) -> None:
        with self._lock:
            self._count += 1
            number = self._count
        if self.before_claim is not None:
            try:
                self.before_claim(number, request)
            except BaseException:
                self.log.add(request, None)
                raise

    def claim(self, request: ClaimRequest) -> ClaimResult:
        self._prepare(request)
        result = self.inner.claim(request)
        self.log.add(request, isinstance(result, Held))
        return result

    def complete(self, completion: Completion) -> bool:
        self.log.add_other("complete", completion.owner)
        return self.inner.complete(completion)

    def release(self, key_hash: str, owner: str) -> bool:
        self.log.add_other("release", owner)
        return self.inner.release(key_hash, owner)

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        self.log.add_other("renew", owner)
        return self.inner.renew(key_hash, owner, lock_expires_at)
