"""``IdempotencyWSGIMiddleware``: the WSGI adapter (Flask, any WSGI app), same core."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from http import HTTPStatus
from types import TracebackType
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
from .records import BodyBuffer, Headers, StoredResponse, declared_length, is_streaming
from .renewal import ThreadRenewals
from .request_view import HeaderView, RequestView
from .rules import IdempotencyRule, ScopeFunction
from .stores.base import Claimed, StoreUnavailable, SyncStore

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
    The store must be sync (``DynamoDBStore`` or ``MemoryStore``).
    """

    def __init__(
        self,
        wsgi_app: WSGIApp,
        *,
        store: SyncStore,
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
        if not isinstance(store, SyncStore):
            raise TypeError(
                f"IdempotencyWSGIMiddleware needs a sync store (DynamoDBStore, MemoryStore); "
                f"{type(store).__name__} has no claim/complete/release/renew. "
                "For an async store use IdempotencyMiddleware."
            )
        self.app = wsgi_app
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
        self._renewals = ThreadRenewals(store, self._reporter)

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
            now=time.time(),
        )
        cached = self._cache.get(attempt.key_hash, attempt.claim.now) if self._cache else None
        if cached is not None:
            return self._answer_held(
                attempt, core.answer_held(cached, attempt.claim.fingerprint), start_response
            )
        started = time.perf_counter()
        try:
            result = self.store.claim(attempt.claim)
        except StoreUnavailable as error:
            self._reporter.report(attempt, "store_error", operation="claim", error=repr(error))
            # The put may have landed with its answer lost: undo our own claim (fenced by our
            # owner token) off the request thread, so the retry is not held off for a whole
            # lock timeout and this answer is not delayed by a second timeout.
            threading.Thread(target=self._undo_lost_claim, args=(attempt,), daemon=True).start()
            if self.options.on_store_error == "run":
                self._reporter.report(attempt, "fail_open")
                return self.app(environ, start_response)
            return _problem(start_response, core.store_unavailable())
        latency_ms = (time.perf_counter() - started) * 1000
        if isinstance(result, Claimed):
            kind: EventKind = "taken_over" if result.taken_over else "claimed"
            self._reporter.report(attempt, kind, store_latency_ms=latency_ms)
            return self._run_and_store(attempt, environ, start_response)
        if self._cache is not None:
            self._cache.put(result.record)
        answer = core.answer_held(result.record, attempt.claim.fingerprint)
        return self._answer_held(attempt, answer, start_response, latency_ms)

    def _undo_lost_claim(self, attempt: core.Attempt) -> None:
        for delay in core.LOST_CLAIM_RELEASE_DELAYS:
            time.sleep(delay)
            with contextlib.suppress(StoreUnavailable):
                if self.store.release(attempt.claim.key_hash, attempt.claim.owner):
                    return

    def _answer_held(
        self,
        attempt: core.Attempt,
        answer: StoredResponse | Problem,
        start_response: StartResponse,
        latency_ms: float | None = None,
    ) -> list[bytes]:
        self._reporter.report(
            attempt, core.held_event_kind(answer), status=answer.status, store_latency_ms=latency_ms
        )
        if isinstance(answer, Problem):
            return _problem(start_response, answer)
        return _replay(start_response, answer)

    def _run_and_store(
        self, attempt: core.Attempt, environ: Environ, start_response: StartResponse
    ) -> Iterable[bytes]:
        captured = _CapturedResponse()
        self._renewals.start(attempt)
        try:
            iterable = self.app(environ, captured.start_response)
            if captured.status_line is not None and is_streaming(captured.encoded_headers):
                return self._stream_live(attempt, captured, iterable, start_response)
            try:
                for chunk in iterable:
                    captured.buffer.add(chunk)
            finally:
                close = getattr(iterable, "close", None)
                if close is not None:
                    close()
        except BaseException:
            # Raised: nothing is kept, so a retry runs the handler again.
            self._renewals.stop(attempt)
            self._release(attempt)
            raise
        self._renewals.stop(attempt)
        if captured.status_line is None:
            self._release(attempt)
            raise RuntimeError("the WSGI application returned without calling start_response")
        status = _status_code(captured.status_line)
        body = captured.buffer.take()
        if core.keeps_response(status):
            self._complete(attempt, status, captured.encoded_headers, body)
        else:
            self._release(attempt)
        start_response(captured.status_line, captured.headers, captured.exc_info)
        return [body]

    def _stream_live(
        self,
        attempt: core.Attempt,
        captured: _CapturedResponse,
        iterable: Iterable[bytes],
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        """Send a streaming response as it comes; finish the key when the stream ends.

        Needs ``start_response`` called before the first chunk (Flask/Werkzeug do so).
        """
        assert captured.status_line is not None
        status_line = captured.status_line
        headers = captured.encoded_headers
        start_response(status_line, captured.headers, captured.exc_info)

        def finish(size: int, failed: bool) -> None:
            self._renewals.stop(attempt)
            status = _status_code(status_line)
            if failed or not core.keeps_response(status):
                self._release(attempt)
            else:
                self._complete(attempt, status, headers, b"", streamed_size=size)

        return _LiveBody(captured.buffer.take(), iterable, finish)

    def _complete(
        self,
        attempt: core.Attempt,
        status: int,
        headers: Headers,
        body: bytes,
        *,
        streamed_size: int | None = None,
    ) -> None:
        completion = core.completion_for(
            attempt, status, headers, body, time.time(), streamed_size=streamed_size
        )
        try:
            stored: bool | None = self.store.complete(completion)
        except StoreUnavailable as error:
            stored = self._retry_finish(
                attempt, "complete", error, lambda: self.store.complete(completion)
            )
        if stored is not None:
            self._reporter.report(attempt, "completed" if stored else "lost", status=status)

    def _release(self, attempt: core.Attempt) -> None:
        key, owner = attempt.claim.key_hash, attempt.claim.owner
        try:
            released: bool | None = self.store.release(key, owner)
        except StoreUnavailable as error:
            released = self._retry_finish(
                attempt, "release", error, lambda: self.store.release(key, owner)
            )
        if released is not None:
            self._reporter.report(attempt, "released")

    def _retry_finish(
        self,
        attempt: core.Attempt,
        operation: str,
        error: StoreUnavailable,
        call: Callable[[], bool],
    ) -> bool | None:
        """Retry a failed finishing write with backoff; ``None`` (and an ERROR event) if it
        never lands."""
        for number in range(1, core.FINISH_ATTEMPTS):
            time.sleep(core.finish_delay(number))
            try:
                return call()
            except StoreUnavailable as next_error:
                error = next_error
        self._reporter.report(
            attempt,
            "store_error",
            operation=operation,
            error=core.gave_up(error, core.FINISH_ATTEMPTS),
        )
        return None


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
