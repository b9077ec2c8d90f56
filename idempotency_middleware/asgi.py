"""``IdempotencyMiddleware``: the pure ASGI adapter (FastAPI, Starlette, any ASGI app)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from . import core, problems
from .cache import ReplayCache
from .events import EventHook, EventKind, Reporter
from .options import (
    DEFAULT_HEADER_NAME,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_METHODS,
    DEFAULT_TTL_SECONDS,
    Options,
)
from .problems import Problem
from .records import BodyBuffer, StoredResponse, declared_length, is_streaming
from .renewal import LoopRenewals
from .request_view import HeaderView, RequestView
from .rules import IdempotencyRule, ScopeFunction
from .stores.base import AsyncStore, Claimed, StoreUnavailable

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Extensions that let an app send a file outside http.response.body; hidden from the app on
# covered requests so every byte of the response passes through the buffer.
_BYPASS_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopy")


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class IdempotencyMiddleware:
    """Make covered requests (POST and PATCH by default) safe to retry.

    ``app.add_middleware(IdempotencyMiddleware, store=AsyncDynamoDBStore("idempotency"))``.
    The store must be async (``AsyncDynamoDBStore`` or ``MemoryStore``). Options are those of
    SPEC.md; ``on_store_error``, ``replay_cache_size`` and ``on_event`` are described in the
    README.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: AsyncStore,
        header_name: str = DEFAULT_HEADER_NAME,
        methods: Iterable[str] = DEFAULT_METHODS,
        required: bool = False,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
        rules: Sequence[IdempotencyRule] = (),
        scope: ScopeFunction | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        on_store_error: str = "fail",
        replay_cache_size: int = 0,
        on_event: EventHook | None = None,
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise TypeError(
                f"IdempotencyMiddleware needs an async store (AsyncDynamoDBStore, MemoryStore); "
                f"{type(store).__name__} has no aclaim/acomplete/arelease/arenew. "
                "For a sync store use IdempotencyWSGIMiddleware."
            )
        self.app = app
        self.store = store
        self.options = Options.build(
            header_name=header_name,
            methods=methods,
            required=required,
            ttl_seconds=ttl_seconds,
            lock_timeout_seconds=lock_timeout_seconds,
            rules=rules,
            scope=scope,
            max_body_bytes=max_body_bytes,
            on_store_error=on_store_error,
            replay_cache_size=replay_cache_size,
            on_event=on_event,
        )
        self._reporter = Reporter(on_event)
        self._cache = ReplayCache(replay_cache_size) if replay_cache_size else None
        self._renewals = LoopRenewals(store, self._reporter)
        self._background: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.options.policy_for(scope["method"], scope["path"])
        if policy is None:
            await self.app(scope, receive, send)
            return
        key_lines, content_length, content_type = _read_headers(
            scope["headers"], self.options.header_key
        )
        admitted = core.admit(self.options, policy, scope["path"], key_lines)
        if admitted is None:
            await self.app(scope, receive, send)
        elif isinstance(admitted, Problem):
            await _send_problem(send, admitted)
        else:
            await self._handle(admitted, content_length, content_type, scope, receive, send)

    async def _handle(
        self,
        admitted: core.Admitted,
        content_length: bytes | None,
        content_type: bytes | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        too_large = core.check_declared_length(self.options, content_length)
        if too_large is not None:
            await _send_problem(send, too_large)
            return
        try:
            body = await _read_body(receive, self.options.max_body_bytes)
        except _BodyTooLarge:
            await _send_problem(send, problems.body_too_large(self.options.max_body_bytes))
            return
        except _ClientGone:
            return  # nobody to answer and nothing claimed

        attempt = core.begin_attempt(
            admitted,
            method=scope["method"],
            path=scope["path"],
            query_string=scope.get("query_string", b""),
            content_type=content_type,
            body=body,
            request_view=lambda route: _request_view(scope, route),
            now=time.time(),
        )
        if self._cache is not None:
            cached = self._cache.get(attempt.key_hash, attempt.claim.now)
            if cached is not None:
                answer = core.answer_held(cached, attempt.claim.fingerprint)
                await self._answer_held(attempt, answer, send, None)
                return
        started = time.perf_counter()
        try:
            result = await self.store.aclaim(attempt.claim)
        except StoreUnavailable as error:
            await self._claim_failed(attempt, error, scope, body, receive, send)
            return
        except asyncio.CancelledError:
            # Cancelled (a deadline, a shutdown) with the put possibly on the wire.
            self._undo_lost_claim(attempt)
            raise
        latency_ms = (time.perf_counter() - started) * 1000
        if isinstance(result, Claimed):
            kind: EventKind = "taken_over" if result.taken_over else "claimed"
            self._reporter.report(attempt, kind, store_latency_ms=latency_ms)
            await self._run_and_store(attempt, scope, body, receive, send)
            return
        if self._cache is not None:
            self._cache.put(result.record)
        answer = core.answer_held(result.record, attempt.claim.fingerprint)
        await self._answer_held(attempt, answer, send, latency_ms)

    async def _answer_held(
        self,
        attempt: core.Attempt,
        answer: StoredResponse | Problem,
        send: Send,
        latency_ms: float | None,
    ) -> None:
        self._reporter.report(
            attempt,
            core.held_event_kind(answer),
            status=answer.status,
            store_latency_ms=latency_ms,
        )
        if isinstance(answer, Problem):
            await _send_problem(send, answer)
        else:
            await _send_replay(send, answer)

    async def _claim_failed(
        self,
        attempt: core.Attempt,
        error: StoreUnavailable,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        self._reporter.report(attempt, "store_error", operation="claim", error=repr(error))
        self._undo_lost_claim(attempt)
        if self.options.on_store_error == "run":
            self._reporter.report(attempt, "fail_open")
            await self.app(scope, _replaying_receive(body, receive), send)
            return
        await _send_problem(send, core.store_unavailable())

    def _undo_lost_claim(self, attempt: core.Attempt) -> None:
        """The claim's put may have landed (or still land) with its answer lost: release our
        own claim in the background, fenced by our owner token, so a retry is not held off
        for a whole lock timeout."""
        task = asyncio.get_running_loop().create_task(self._release_lost_claim(attempt))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release_lost_claim(self, attempt: core.Attempt) -> None:
        for delay in core.LOST_CLAIM_RELEASE_DELAYS:
            await asyncio.sleep(delay)
            with contextlib.suppress(StoreUnavailable):
                if await self.store.arelease(attempt.claim.key_hash, attempt.claim.owner):
                    return

    async def _run_and_store(
        self, attempt: core.Attempt, scope: Scope, body: bytes, receive: Receive, send: Send
    ) -> None:
        response = _ResponseCapture(send)
        self._renewals.start(attempt)
        try:
            await self.app(_without_bypass(scope), _replaying_receive(body, receive), response.send)
        except BaseException:
            # Raised or cancelled: nothing is kept, so a retry runs the handler again.
            self._renewals.stop(attempt)
            await self._release(attempt)
            raise
        self._renewals.stop(attempt)
        start = response.start
        if start is None:
            await self._release(attempt)
            return  # the app sent nothing; the server answers 500 itself
        status: int = start["status"]
        if response.live:
            # Already sent as it came; the key is completed without a body to replay.
            if core.keeps_response(status):
                await self._complete(attempt, status, start.get("headers", []), b"", response.size)
            else:
                await self._release(attempt)
            return
        response_body = response.buffer.take()
        if core.keeps_response(status):
            await self._complete(attempt, status, start.get("headers", []), response_body, None)
        else:
            await self._release(attempt)
        await send(start)
        await send({"type": "http.response.body", "body": response_body, "more_body": False})

    async def _complete(
        self,
        attempt: core.Attempt,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        streamed_size: int | None,
    ) -> None:
        completion = core.completion_for(
            attempt, status, headers, body, time.time(), streamed_size=streamed_size
        )
        try:
            stored: bool | None = await self.store.acomplete(completion)
        except StoreUnavailable as error:
            stored = await self._retry_finish(
                attempt, "complete", error, lambda: self.store.acomplete(completion)
            )
        if stored is not None:
            self._reporter.report(attempt, "completed" if stored else "lost", status=status)

    async def _release(self, attempt: core.Attempt) -> None:
        key, owner = attempt.claim.key_hash, attempt.claim.owner
        try:
            released: bool | None = await self.store.arelease(key, owner)
        except StoreUnavailable as error:
            released = await self._retry_finish(
                attempt, "release", error, lambda: self.store.arelease(key, owner)
            )
        if released is not None:
            self._reporter.report(attempt, "released")

    async def _retry_finish(
        self,
        attempt: core.Attempt,
        operation: str,
        error: StoreUnavailable,
        call: Callable[[], Awaitable[bool]],
    ) -> bool | None:
        """Retry a failed finishing write with backoff; ``None`` (and an ERROR event) if it
        never lands."""
        for number in range(1, core.FINISH_ATTEMPTS):
            await asyncio.sleep(core.finish_delay(number))
            try:
                return await call()
            except StoreUnavailable as next_error:
                error = next_error
        self._reporter.report(
            attempt,
            "store_error",
            operation=operation,
            error=core.gave_up(error, core.FINISH_ATTEMPTS),
        )
        return None


class _ResponseCapture:
    """Buffers the app's response instead of sending it, except a streaming one (see
    ``records.STREAMING_MEDIA_TYPES``), which goes to the client live as it comes."""

    __slots__ = ("_send", "buffer", "live", "size", "start")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.start: Message | None = None
        self.buffer = BodyBuffer()
        self.live = False
        self.size = 0

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.start = message
            headers = message.get("headers", [])
            if is_streaming(headers):
                self.live = True
                await self._send(message)
            else:
                self.buffer.expected_size = declared_length(headers)
        elif kind == "http.response.body":
            if self.live:
                self.size += len(message.get("body", b""))
                await self._send(message)
                return
            self.buffer.add(message.get("body", b""))
        elif self.live:
            await self._send(message)


def _read_headers(
    headers: Iterable[tuple[bytes, bytes]], key_name: bytes
) -> tuple[list[bytes], bytes | None, bytes | None]:
    """The key header's lines, Content-Length and Content-Type, in one pass over the headers
    (ASGI gives names lower-cased)."""
    key_lines: list[bytes] = []
    length = content_type = None
    for name, value in headers:
        if name == key_name:
            key_lines.append(value)
        elif name == b"content-length":
            length = value
        elif name == b"content-type":
            content_type = value
    return key_lines, length, content_type


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replaying_receive(body: bytes, receive: Receive) -> Receive:
    """Give the app the body already read, then whatever the server sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _without_bypass(scope: Scope) -> Scope:
    extensions = scope.get("extensions")
    if not extensions or not any(name in extensions for name in _BYPASS_EXTENSIONS):
        return scope
    trimmed = dict(scope)
    trimmed["extensions"] = {
        name: value for name, value in extensions.items() if name not in _BYPASS_EXTENSIONS
    }
    return trimmed


def _request_view(scope: Scope, route: str) -> RequestView:
    client = scope.get("client")
    return RequestView(
        method=scope["method"],
        path=scope["path"],
        route=route,
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=HeaderView(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]
        ),
        client=(str(client[0]), int(client[1])) if client else None,
    )


async def _send_problem(send: Send, problem: Problem) -> None:
    body = problem.body()
    await send(
        {"type": "http.response.start", "status": problem.status, "headers": problem.headers(body)}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_replay(send: Send, response: StoredResponse) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": response.replay_headers(),
        }
    )
    await send({"type": "http.response.body", "body": response.body, "more_body": False})
