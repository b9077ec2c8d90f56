"""``IdempotencyMiddleware``: the pure ASGI door (FastAPI, Starlette, any ASGI app).

A translation only: read the key and the body from the ASGI messages, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

from . import core, problems
from .engine import flow
from .engine.drivers import AsyncDriver
from .engine.effects import Ran
from .options import MiddlewareOptions, Options
from .problems import Problem
from .records import BodyBuffer, StoredResponse, declared_length, is_streaming
from .renewal import LoopRenewals
from .request_view import HeaderView, RequestView
from .stores.base import AsyncStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

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
    The store must be async (``AsyncDynamoDBStore``, ``SQLiteStore`` or ``MemoryStore``).
    The options (``options.MiddlewareOptions``) are those of the README.
    """

    def __init__(
        self, app: ASGIApp, *, store: AsyncStore, **options: Unpack[MiddlewareOptions]
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise TypeError(
                f"IdempotencyMiddleware needs an async store (AsyncDynamoDBStore, SQLiteStore, "
                f"MemoryStore); {type(store).__name__} has no aclaim/acomplete/arelease/arenew. "
                "For a sync store use IdempotencyWSGIMiddleware."
            )
        self.app = app
        self.store = store
        self.options = Options.build(**options)
        self._context = flow.Context.for_options(self.options)
        self._driver = AsyncDriver(
            store,
            self.options.clock,
            LoopRenewals(store, self._context.reporter, self.options.clock),
        )

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
            now=self.options.clock.now(),
        )
        capture = _ResponseCapture(send)

        async def run() -> Ran | None:
            await self.app(_without_bypass(scope), _replaying_receive(body, receive), capture.send)
            return capture.ran()

        outcome = await self._driver.drive(flow.attempt(self._context, attempt), run)
        if type(outcome) is flow.Sent:
            if outcome.ran is not None and not outcome.ran.live:
                assert capture.start is not None
                await send(capture.start)
                await send(
                    {"type": "http.response.body", "body": outcome.ran.body, "more_body": False}
                )
        elif type(outcome) is flow.Answer:
            answer = outcome.response
            if isinstance(answer, Problem):
                await _send_problem(send, answer)
            else:
                await _send_replay(send, answer)
        else:  # the store failed and on_store_error="run"
            await self.app(scope, _replaying_receive(body, receive), send)


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

    def ran(self) -> Ran | None:
        """The app's answer once it returned (``None``: it sent nothing)."""
        start = self.start
        if start is None:
            return None
        headers = start.get("headers", [])
        if self.live:
            return Ran(start["status"], headers, b"", live=True, ended=True, size=self.size)
        return Ran(start["status"], headers, self.buffer.take())


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
