"""``IdempotencyWSGIMiddleware``: the WSGI door (Flask, Django, any WSGI app).

A translation only: read the key and the body from the environ, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import core, problems
from .engine import flow
from .engine.drivers import Suspended, SyncDriver
from .engine.effects import Ran, StreamEnd
from .options import MiddlewareOptions, Options
from .problems import Problem
from .records import BodyBuffer, Headers, StoredResponse, declared_length, is_streaming
from .renewal import ThreadRenewals
from .request_view import HeaderView, RequestView
from .stores.base import SyncStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_READ_CHUNK = 64 * 1024


class _BodyTooLarge(Exception):
    pass


class IdempotencyWSGIMiddleware:
    """Make covered requests (POST and PATCH by default) safe to retry.

    Flask: ``app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=DynamoDBStore(...))``.
    The store must be sync (``DynamoDBStore``, ``SQLiteStore`` or ``MemoryStore``).
    """

    def __init__(
        self, wsgi_app: WSGIApp, *, store: SyncStore, **options: Unpack[MiddlewareOptions]
    ) -> None:
        if not isinstance(store, SyncStore):
            raise TypeError(
                f"IdempotencyWSGIMiddleware needs a sync store (DynamoDBStore, SQLiteStore, "
                f"MemoryStore); {type(store).__name__} has no claim/complete/release/renew. "
                "For an async store use IdempotencyMiddleware."
            )
        self.app = wsgi_app
        self.store = store
        self.options = Options.build(**options)
        self._context = flow.Context.for_options(self.options)
        self._renewals = ThreadRenewals(store, self._context.reporter, self.options.clock)
        self._driver = SyncDriver(store, self.options.clock, self._renewals)

    def close(self) -> None:
        """Stop the lease-renewal thread (it is a daemon thread; this is for tidy shutdowns
        and tests). The store is yours to close."""
        self._renewals.close()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        path = _path(environ)
        policy = self.options.policy_for(method, path)
        if policy is None:
            return self.app(environ, start_response)
        admitted = core.admit(self.options, policy, path, _key_lines(environ, self.options))
        if admitted is None:
            return self.app(environ, start_response)
        if isinstance(admitted, Problem):
            return _problem(start_response, admitted)
        return self._handle(admitted, method, path, environ, start_response)

    def _handle(
        self,
        admitted: core.Admitted,
        method: str,
        path: str,
        environ: Environ,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        too_large = core.check_declared_length(self.options, environ.get("CONTENT_LENGTH") or None)
        if too_large is not None:
            return _problem(start_response, too_large)
        try:
            body = _read_body(environ, self.options.max_body_bytes)
        except _BodyTooLarge:
            return _problem(start_response, problems.body_too_large(self.options.max_body_bytes))
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))

        attempt = core.begin_attempt(
            admitted,
            method=method,
            path=path,
            query_string=str(environ.get("QUERY_STRING", "")),
            content_type=environ.get("CONTENT_TYPE") or None,
            body=body,
            request_view=lambda route: _request_view(environ, method, path, route),
            now=self.options.clock.now(),
        )
        captured = _CapturedResponse()
        running = flow.attempt(self._context, attempt)
        try:
            outcome = self._driver.drive(running, lambda: captured.run(self.app, environ))
        except Suspended:
            # A live stream: it goes out as it comes; the attempt finishes when it ends.
            assert captured.status_line is not None and captured.live is not None
            start_response(captured.status_line, captured.headers, captured.exc_info)

            def finish(size: int, failed: bool) -> None:
                self._driver.resume(running, StreamEnd(size, failed))

            return _LiveBody(captured.buffer.take(), captured.live, finish)
        if type(outcome) is flow.Sent:
            if outcome.ran is None:
                raise RuntimeError("the WSGI application returned without calling start_response")
            assert captured.status_line is not None
            start_response(captured.status_line, captured.headers, captured.exc_info)
            return [outcome.ran.body]
        if type(outcome) is flow.Answer:
            answer = outcome.response
            if isinstance(answer, Problem):
                return _problem(start_response, answer)
            return _replay(start_response, answer)
        return self.app(environ, start_response)  # the store failed; on_store_error="run"


class _LiveBody:
    """The WSGI iterable of a live stream: passes chunks through, counts them, and calls
    ``finish(size, failed)`` exactly once, when the stream ends, fails or is closed."""

    def __init__(
        self, prefix: bytes, iterable: Iterable[bytes], finish: Callable[[int, bool], None]
    ) -> None:
        self._prefix = prefix
        self._iterable = iterable
        self._finish: Callable[[int, bool], None] | None = finish
        self._size = 0

    def __iter__(self) -> Iterator[bytes]:
        try:
            if self._prefix:
                self._size += len(self._prefix)
                yield self._prefix
            for chunk in self._iterable:
                self._size += len(chunk)
                yield chunk
        except Exception:
            self._end(failed=True)
            raise

    def close(self) -> None:
        try:
            close = getattr(self._iterable, "close", None)
            if close is not None:
                close()
        finally:
            # Closed early (client gone) counts as done: the handler started a success.
            self._end(failed=False)

    def _end(self, *, failed: bool) -> None:
        finish, self._finish = self._finish, None
        if finish is not None:
            finish(self._size, failed)


class _CapturedResponse:
    """Collects ``start_response`` and the body instead of sending them."""

    def __init__(self) -> None:
        self.status_line: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.encoded_headers: Headers = []  # as the core and the stores take them
        self.exc_info: ExcInfo | None = None
        self.buffer = BodyBuffer()
        self.live: Iterable[bytes] | None = None  # a streaming response's iterable

    def run(self, app: WSGIApp, environ: Environ) -> Ran | None:
        """Run the app, buffering its body unless it streams (``records.is_streaming``)."""
        iterable = app(environ, self.start_response)
        if self.status_line is not None and is_streaming(self.encoded_headers):
            self.live = iterable
            return Ran(_status_code(self.status_line), self.encoded_headers, b"", True, False)
        try:
            for chunk in iterable:
                self.buffer.add(chunk)
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        if self.status_line is None:
            return None
        return Ran(_status_code(self.status_line), self.encoded_headers, self.buffer.take())

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
        self.buffer.expected_size = declared_length(self.encoded_headers)
        return self.buffer.add  # the legacy write() callable


def _key_lines(environ: Environ, options: Options) -> list[bytes]:
    # WSGI servers fold repeated header lines into one, joined with commas; the key parser
    # treats a comma outside a quoted string as a second value.
    raw = environ.get(options.environ_key)
    return [] if raw is None else [str(raw).encode("latin-1")]


def _path(environ: Environ) -> str:
    # PEP 3333 strings are latin-1 decoded bytes; re-decode as UTF-8 to match ASGI's path.
    raw = str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", ""))
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return raw


def _read_body(environ: Environ, limit: int) -> bytes:
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
            raise _BodyTooLarge
        chunks.append(chunk)


def _status_code(status_line: str) -> int:
    return int(status_line.split(" ", 1)[0])


def _encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def _decode_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def _request_view(environ: Environ, method: str, path: str, route: str) -> RequestView:
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


def _problem(start_response: StartResponse, problem: Problem) -> list[bytes]:
    body = problem.body()
    start_response(
        f"{problem.status} {_reason(problem.status)}", _decode_headers(problem.headers(body))
    )
    return [body]


def _replay(start_response: StartResponse, response: StoredResponse) -> list[bytes]:
    start_response(
        f"{response.status} {_reason(response.status)}", _decode_headers(response.replay_headers())
    )
    return [response.body]
