"""The ASGI side of the ASGI door: reading a request's messages, capturing the app's
response, and sending answers. No idempotency decisions here (those are the engine's)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..clock import Clock
from ..engine.effects import Ran
from ..events import logger
from ..handler.context import streams_now
from ..policy.request_view import HeaderView, RequestView
from ..stores.records import with_content_length
from .answers import Reply
from .capture import BodyBuffer, UnfinishedResponse, is_complete, scan_response_headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Extensions that let an app send a file outside http.response.body; hidden from the app on
# covered requests so every byte of the response passes through the buffer.
_BYPASS_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopy")


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


class ResponseCapture:
    """Runs the app (``run``) with its response buffered instead of sent, except a streaming
    one (see ``records.STREAMING_MEDIA_TYPES``), which goes to the client live as it comes;
    then answers the request, once its attempt ended (an ``answers.Responder``)."""

    __slots__ = (
        "_app",
        "_body",
        "_receive",
        "_replayed",
        "_scope",
        "_send",
        "buffer",
        "ended",
        "expected_size",
        "failed",
        "first",
        "gone",
        "held",
        "live",
        "size",
        "start",
    )

    def __init__(
        self,
        send: Send,
        body: bytes = b"",
        receive: Receive | None = None,
        app: ASGIApp | None = None,
        scope: Scope | None = None,
    ) -> None:
        self._app = app
        self._scope = scope
        self._send = send
        # The request body already read, replayed to the app by ``receive`` (a method: no
        # closure per request), then whatever the server sends next.
        self._body = body
        self._receive = receive
        self._replayed = False
        self.start: Message | None = None
        # Most bodies come in one chunk, kept as it is: the buffer is made at a second one.
        self.first = b""
        self.buffer: BodyBuffer | None = None
        self.expected_size: int | None = None
        self.live = False
        self.held = False  # a stream held back until its transaction's writes land
        self.size = 0  # bytes of the body, buffered or sent live
        self.ended = False  # a body message with more_body=False came
        self.failed = False  # the app raised
        self.gone = False  # the app was told its client disconnected

    async def run(self) -> Ran | None:
        """Run the app on the scope (without the bypass extensions), the body replayed to
        it; its answer, once it returned. (A method: the door passes it on as its ``Run``'s
        callable, with no closure built per request.)"""
        assert self._app is not None and self._scope is not None, "built without an app"
        scope = self._scope
        if "extensions" in scope:
            scope = without_bypass(scope)
        try:
            await self._app(scope, self.receive, self.send)
        except Exception:
            self.failed = True
            raise
        # The app's answer once it returned (``None``: it sent nothing);
        # ``UnfinishedResponse`` when it did not finish it. (Here, not in a method of its
        # own: one call less on every new key.)
        start = self.start
        if start is None:
            return None
        headers = start.get("headers", [])
        if self.live and self.gone and not self.ended:
            # A stream its app stopped because its client went away (Starlette's does):
            # done, as a WSGI stream closed early is; the handler started a success.
            return Ran(start["status"], headers, b"", live=True, ended=True, size=self.size)
        declared = self.expected_size
        if not self.ended or (
            declared is not None
            and declared != self.size  # (the common case decided without a call)
            and not is_complete(start["status"], declared, self.size)
        ):
            raise UnfinishedResponse
        if self.live:
            return Ran(start["status"], headers, b"", live=True, ended=True, size=self.size)
        body = self.first if self.buffer is None else self.buffer.take()
        if self.held:
            # A stream declares no length; sent whole, it gets one (as a replay does).
            headers = with_content_length(headers, len(body))
            self.start = {**start, "headers": headers}
        # (Built with tuple.__new__, every field given: calling the class costs twice as much.)
        return tuple.__new__(Ran, (start["status"], headers, body, False, True, 0, (), False, None))

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.start = message
            self.live, self.expected_size = scan_response_headers(message.get("headers", []))
            if self.live:
                self.live = streams_now()
                self.held = not self.live
            if self.live:
                await self._send(message)
        elif kind == "http.response.body":
            if not message.get("more_body", False):
                self.ended = True
            if self.live:
                self.size += len(message.get("body", b""))
                await self._send(message)
                return
            chunk = message.get("body", b"")
            if not chunk:
                return
            self.size += len(chunk)
            if self.buffer is not None:
                self.buffer.add(chunk)
            elif not self.first:
                self.first = chunk
            else:
                self.buffer = BodyBuffer()
                self.buffer.expected_size = self.expected_size
                self.buffer.add(self.first)
                self.buffer.add(chunk)
                self.first = b""
        elif self.live:
            await self._send(message)

    async def send_cut(self) -> None:
        """Once the key is released, send an unfinished response as the app sent it, so the
        server cuts it as it would have without the middleware (a live one went already)."""
        start = self.start
        if start is None or self.live:
            return
        body = self.first if self.buffer is None else self.buffer.take()
        await self._send(start)
        await self._send({"type": "http.response.body", "body": body, "more_body": not self.ended})

    # -- answering (answers.Responder) ------------------------------------------------------

    async def reply(self, reply: Reply) -> None:
        """Send an answer the middleware made (a replay, a problem)."""
        await send_reply(self._send, reply)

    async def ran(self, ran: Ran) -> None:
        """Send the app's buffered response (a live one went out already)."""
        if not ran.live:
            start = self.start
            assert start is not None
            await self._send(start)
            await self._send({"type": "http.response.body", "body": ran.body, "more_body": False})

    async def unprotected(self) -> None:
        """Run the app with no claim, the body replayed to it, its response sent as it comes."""
        assert self._app is not None and self._scope is not None, "built without an app"
        assert self._receive is not None, "built without receive"
        await self._app(self._scope, replaying_receive(self._body, self._receive), self._send)

    async def nothing(self) -> None:
        """The app sent nothing: the server answers 500 itself."""

    async def receive(self) -> Message:
        """``replaying_receive(body, receive)`` as a method of the capture."""
        if not self._replayed:
            self._replayed = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        assert self._receive is not None, "a capture built without receive replays nothing"
        message = await self._receive()
        if message.get("type") == "http.disconnect":
            self.gone = True
        return message


async def read_body(receive: Receive, limit: int, message: Message | None = None) -> bytes:
    """The request body, read whole; ``message``: the first message, already received.
    ``BodyTooLarge`` past ``limit`` bytes, ``ClientGone`` when the client disconnected."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if message is None:
            message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = None


def warming_receive(receive: Receive, warm_up: Callable[[], Awaitable[None]]) -> Receive:
    """Warm the store up when the server announces start-up, before the app sees it; a
    store that cannot warm up (a missing extra, bad settings) is logged, not fatal here:
    its first claim reports the same error per request."""

    async def startup_then_message() -> Message:
        message = await receive()
        if message.get("type") == "lifespan.startup":
            try:
                await warm_up()
            except Exception:
                logger.exception("idempotency store could not be warmed up at start-up")
        return message

    return startup_then_message


async def start_lifespan(
    receive: Receive,
    send: Send,
    read_routes: Callable[[], None] | None,
    check: Callable[[], Awaitable[None]] | None,
) -> Receive | None:
    """A door's start-up steps as the lifespan starts: ``read_routes`` (``ValueError``: a
    route that cannot be covered) then ``check`` (the store), each when given. The receive
    to give the app, or ``None`` when a step failed, which is said as ASGI asks, with
    ``lifespan.startup.failed``: an exception from a lifespan scope would only make
    uvicorn's default ``--lifespan auto`` serve on without the app's lifespan."""
    failure = None
    if read_routes is not None:
        try:
            read_routes()
        except ValueError as error:
            failure = str(error)
    if failure is None and check is None:
        return receive
    startup = await receive()  # lifespan.startup
    if check is not None and failure is None:
        try:
            await check()
        except Exception as error:  # StoreUnavailableError, or any other failure of it
            failure = str(error)
    if failure is not None:
        await send({"type": "lifespan.startup.failed", "message": failure})
        return None
    return replaying_message(startup, receive)


def replaying_message(message: Message, receive: Receive) -> Receive:
    """Give the app ``message``, already read, then whatever the server sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return message
        return await receive()

    return replay


def replaying_receive(body: bytes, receive: Receive) -> Receive:
    """Give the app the body already read, then whatever the server sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def without_bypass(scope: Scope) -> Scope:
    extensions = scope.get("extensions")
    if not extensions or not any(name in extensions for name in _BYPASS_EXTENSIONS):
        return scope
    trimmed = dict(scope)
    trimmed["extensions"] = {
        name: value for name, value in extensions.items() if name not in _BYPASS_EXTENSIONS
    }
    return trimmed


def request_view(scope: Scope, route: str) -> RequestView:
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


async def send_reply(send: Send, reply: Reply) -> None:
    """Answer with ``reply`` (a replay, a problem)."""
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


def disconnect_waiter(receive: Receive, clock: Clock) -> Callable[[float], Awaitable[bool]]:
    """How a duplicate waits between polls (``wait_seconds``): a sleep on ``clock`` that
    ends early, answering ``False``, when its client disconnects. The request body has been
    read by then, so the next message a server delivers is ``http.disconnect``; a pending
    ``receive()`` is cancelled when the sleep ends first (servers keep their state outside
    the call, so nothing is lost)."""

    async def wait(seconds: float) -> bool:
        listening = asyncio.ensure_future(receive())
        sleeping = asyncio.ensure_future(clock.asleep(seconds))
        try:
            await asyncio.wait((listening, sleeping), return_when=asyncio.FIRST_COMPLETED)
            if listening.done():
                gone = listening.exception() is not None
                if gone or listening.result().get("type") == "http.disconnect":
                    return False
                await sleeping  # some other message: the client is still there
            return True
        finally:
            for task in (listening, sleeping):
                task.cancel()

    return wait
