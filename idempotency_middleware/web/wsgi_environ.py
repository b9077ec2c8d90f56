"""The WSGI side of the WSGI door: reading a request from the environ, capturing the
app's response (buffered or live), and answering. No idempotency decisions here (those are
the engine's)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from types import TracebackType
from typing import Any

from ..engine.effects import Ran
from ..engine.setup import FinishStream
from ..handler.context import streams_now
from ..policy.options import Options
from ..policy.request_view import HeaderView, RequestView
from ..stores.records import Headers
from .answers import Reply
from .capture import BodyBuffer, UnfinishedResponse, is_complete, scan_response_headers
from .live_body import LiveBody

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_READ_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    pass


class CapturedResponse:
    """Runs the app (``run``), collecting ``start_response`` and the body instead of sending
    them, except a streaming response's (``send_live``); then answers the request, once its
    attempt ended (an ``answers.Responder``)."""

    def __init__(self, app: WSGIApp, environ: Environ, start_response: StartResponse) -> None:
        self._app = app
        self._environ = environ
        self._send_start = start_response  # the server's
        self.status_line: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.encoded_headers: Headers = []  # as the core and the stores take them
        self.exc_info: ExcInfo | None = None
        self.buffer = BodyBuffer()
        self.streaming = False  # its media type streams (records.STREAMING_MEDIA_TYPES)
        self.live: Iterable[bytes] | None = None  # a streaming response's iterable
        self.failed = False  # the app (or its iterable) raised
        self.body = b""  # the body of an unfinished response, for ``send_cut``

    def run(self) -> Ran | None:
        """Run the app, buffering its body unless it streams; ``UnfinishedResponse`` when
        the body does not match its Content-Length."""
        try:
            iterable = self._app(self._environ, self.start_response)
            if self.status_line is not None and self.streaming:
                self.live = iterable
                return Ran(status_code(self.status_line), self.encoded_headers, b"", True, False)
            try:
                for chunk in iterable:
                    self.buffer.add(chunk)
            finally:
                close = getattr(iterable, "close", None)
                if close is not None:
                    close()
        except Exception:
            self.failed = True
            raise
        if self.status_line is None:
            return None
        status, body = status_code(self.status_line), self.buffer.take()
        if not is_complete(status, self.buffer.expected_size, len(body)):
            self.body = body
            raise UnfinishedResponse
        return Ran(status, self.encoded_headers, body)

    def complete(self, size: int) -> bool:
        """Whether a live body of ``size`` bytes is the one its headers declared."""
        assert self.status_line is not None
        return is_complete(status_code(self.status_line), self.buffer.expected_size, size)

    def send_cut(self, error: Exception | None) -> Iterable[bytes]:
        """Once the key is released, an unfinished response as the app gave it: its body,
        or what it yielded before ``error``, then ``error`` raised, so the server cuts it
        (or answers 500, with no byte sent) as it would have without the middleware."""
        assert self.status_line is not None
        self._send_start(self.status_line, self.headers, self.exc_info)
        if error is None:
            return [self.body]
        return _failing(self.buffer.take(), error)

    def send_live(self, finish: FinishStream) -> Iterable[bytes]:
        """A streaming response, sent as it comes (what the app already gave first), and
        counted: its attempt finishes (``finish``) when it ends."""
        assert self.status_line is not None and self.live is not None
        try:
            self._send_start(self.status_line, self.headers, self.exc_info)
        except BaseException:
            # The server refused the headers: the stream never starts; nothing is kept.
            close = getattr(self.live, "close", None)
            if close is not None:
                close()
            finish(0, True)
            raise
        return LiveBody(self.buffer.take(), self.live, finish, self.complete)

    # -- answering (answers.Responder) ------------------------------------------------------

    def reply(self, reply: Reply) -> list[bytes]:
        """Send an answer the middleware made (a replay, a problem)."""
        return send_reply(self._send_start, reply)

    def ran(self, ran: Ran) -> list[bytes]:
        """Send the app's buffered response."""
        assert self.status_line is not None
        self._send_start(self.status_line, self.headers, self.exc_info)
        return [ran.body]

    def unprotected(self) -> Iterable[bytes]:
        """Run the app with no claim, its response sent as it comes."""
        return self._app(self._environ, self._send_start)

    def nothing(self) -> list[bytes]:
        raise RuntimeError("the WSGI application returned without calling start_response")

    def start_response(
        self,
        status: str,
        headers: list[tuple[str, str]],
        exc_info: ExcInfo | None = None,
    ) -> Callable[[bytes], object]:
        if exc_info is not None and self.status_line is not None:
            if not self.buffer.empty:
                # PEP 3333: a server sends the headers with the first body bytes, so past
                # them the headers count as sent and the error is re-raised.
                raise exc_info[1].with_traceback(exc_info[2])
            # Replacing headers is allowed until they are sent; we have sent none.
            exc_info = None
        elif self.status_line is not None:
            raise AssertionError("start_response called twice without exc_info")
        self.status_line = status
        self.headers = list(headers)
        self.encoded_headers = _encode_headers(self.headers)
        self.exc_info = exc_info
        self.streaming, self.buffer.expected_size = scan_response_headers(self.encoded_headers)
        if self.streaming:
            self.streaming = streams_now()
        return self.buffer.add  # the legacy write() callable


def _failing(prefix: bytes, error: Exception) -> Iterator[bytes]:
    if prefix:
        yield prefix
    raise error


def key_lines(environ: Environ, options: Options) -> list[bytes]:
    # WSGI servers fold repeated header lines into one, joined with commas; the key parser
    # treats a comma outside a quoted string as a second value.
    raw = environ.get(options.environ_key)
    return [] if raw is None else [str(raw).encode("latin-1")]


def request_path(environ: Environ) -> str:
    # PEP 3333 strings are latin-1 decoded bytes; re-decode as UTF-8 to match ASGI's path.
    raw = str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", ""))
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return raw


def read_body(environ: Environ, limit: int) -> bytes:
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    length_text = environ.get("CONTENT_LENGTH") or ""
    if length_text.strip():
        try:
            remaining = int(length_text)
        except ValueError:
            remaining = 0
        chunks: list[bytes] = []
        while remaining > 0:
            chunk = stream.read(min(remaining, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    # No Content-Length: read to the end only where the server says the stream ends there
    # (chunked input); otherwise reading could block on the open connection.
    if (
        not environ.get("wsgi.input_terminated")
        and "chunked" not in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower()
    ):
        return b""
    chunks = []
    size = 0
    while True:
        chunk = stream.read(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)


def status_code(status_line: str) -> int:
    return int(status_line.split(" ", 1)[0])


def _encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def _decode_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def request_view(environ: Environ, method: str, path: str, route: str) -> RequestView:
    raw_headers = [
        (name[5:].replace("_", "-"), str(value))
        for name, value in environ.items()
        if name.startswith("HTTP_")
    ]
    if environ.get("CONTENT_TYPE"):
        raw_headers.append(("Content-Type", str(environ["CONTENT_TYPE"])))
    if environ.get("CONTENT_LENGTH"):
        raw_headers.append(("Content-Length", str(environ["CONTENT_LENGTH"])))
    address = environ.get("REMOTE_ADDR")
    port = environ.get("REMOTE_PORT")
    return RequestView(
        method=method,
        path=path,
        route=route,
        query=str(environ.get("QUERY_STRING", "")),
        headers=HeaderView(raw_headers),
        client=(str(address), int(port)) if address and port else None,
    )


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status, "")


def send_reply(start_response: StartResponse, reply: Reply) -> list[bytes]:
    """Answer with ``reply`` (a replay, a problem)."""
    start_response(f"{reply.status} {_reason(reply.status)}", _decode_headers(reply.headers))
    return [reply.body]
