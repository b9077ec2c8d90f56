"""``IdempotencyMiddleware``: the pure ASGI adapter (FastAPI, Starlette, any ASGI app)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from . import core, problems
from .options import (
    DEFAULT_HEADER_NAME,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_METHODS,
    DEFAULT_TTL_SECONDS,
    Options,
)
from .problems import Problem
from .records import StoredResponse
from .request_view import HeaderView, RequestView
from .rules import IdempotencyRule, ScopeFunction
from .stores.base import AsyncStore, Claimed, ClaimRequest, StoreUnavailable

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("idempotency_middleware")

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
    The store must be async (``AsyncDynamoDBStore`` or ``MemoryStore``).
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
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise TypeError(
                f"IdempotencyMiddleware needs an async store (AsyncDynamoDBStore, MemoryStore); "
                f"{type(store).__name__} has no aclaim/acomplete/arelease. "
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
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        path: str = scope["path"]
        header_key = self.options.header_key
        values = [value for name, value in scope["headers"] if name == header_key]
        admitted = core.admit(self.options, method, path, values)
        if admitted is None:
            await self.app(scope, receive, send)
            return
        if isinstance(admitted, Problem):
            await _send_problem(send, admitted)
            return
        await self._handle(admitted, scope, receive, send)

    async def _handle(
        self, admitted: core.Admitted, scope: Scope, receive: Receive, send: Send
    ) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        too_large = core.check_declared_length(self.options, _header(headers, b"content-length"))
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

        method: str = scope["method"]
        content_type_raw = _header(headers, b"content-type")
        claim = core.claim_request_for(
            admitted,
            method=method,
            path=scope["path"],
            query_string=scope.get("query_string", b""),
            content_type=content_type_raw,
            body=body,
            request_view=lambda: _request_view(scope, admitted.policy.route),
            now=time.time(),
        )
        try:
            result = await self.store.aclaim(claim)
        except StoreUnavailable as error:
            logger.error(
                "idempotency store unavailable on claim; answering 503",
                extra={"idempotency_key_hash": claim.key, "error": repr(error)},
            )
            await _send_problem(send, core.store_unavailable())
            return
        if not isinstance(result, Claimed):
            answer = core.answer_held(result.record, claim.fingerprint, time.time())
            if isinstance(answer, Problem):
                await _send_problem(send, answer)
            else:
                await _send_replay(send, answer)
            return
        await self._run_and_store(admitted, claim, scope, body, receive, send)

    async def _run_and_store(
        self,
        admitted: core.Admitted,
        claim: ClaimRequest,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        response = _BufferedResponse()
        try:
            await self.app(_without_bypass(scope), _replaying_receive(body, receive), response.send)
        except BaseException:
            # Raised (or cancelled): nothing is kept, so a retry runs the handler again.
            await self._release(claim)
            raise
        if response.start is None:
            await self._release(claim)
            return  # the app sent nothing; the server answers 500 itself
        status: int = response.start["status"]
        response_body = response.body()
        if core.keeps_response(status):
            completion = core.completion_for(
                claim,
                admitted.policy,
                status,
                response.start.get("headers", []),
                response_body,
                time.time(),
            )
            try:
                if not await self.store.acomplete(completion):
                    logger.warning(
                        "idempotency claim was taken over while the handler ran; "
                        "its response was sent but not stored",
                        extra={"idempotency_key_hash": claim.key},
                    )
            except StoreUnavailable as error:
                logger.error(
                    "could not store the response of a completed request; a retry after the "
                    "lock timeout will run the handler again",
                    extra={"idempotency_key_hash": claim.key, "error": repr(error)},
                )
        else:
            await self._release(claim)
        await send(dict(response.start))
        await send({"type": "http.response.body", "body": response_body, "more_body": False})

    async def _release(self, claim: ClaimRequest) -> None:
        try:
            await self.store.arelease(claim.key, claim.owner)
        except StoreUnavailable as error:
            logger.error(
                "could not release an idempotency claim; the key stays locked until its "
                "lock timeout",
                extra={"idempotency_key_hash": claim.key, "error": repr(error)},
            )


class _BufferedResponse:
    """Collects the app's response instead of sending it."""

    __slots__ = ("chunks", "start")

    def __init__(self) -> None:
        self.start: Message | None = None
        self.chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.start = message
        elif kind == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                self.chunks.append(chunk)

    def body(self) -> bytes:
        chunks, self.chunks = self.chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


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
            return b"".join(chunks)


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
