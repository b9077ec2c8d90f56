"""``IdempotencyWSGIMiddleware``: the WSGI adapter (Flask, any WSGI app), same core."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
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
from .stores.base import Claimed, ClaimRequest, StoreUnavailable, SyncStore

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

logger = logging.getLogger("idempotency_middleware")

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
    ) -> None:
        if not isinstance(store, SyncStore):
            raise TypeError(
                f"IdempotencyWSGIMiddleware needs a sync store (DynamoDBStore, MemoryStore); "
                f"{type(store).__name__} has no claim/complete/release. "
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
        )

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        path = _path(environ)
        raw = environ.get(self.options.environ_key)
        # WSGI servers fold repeated header lines into one, joined with commas; the key
        # parser treats a comma outside a quoted string as a second value.
        values = [] if raw is None else [str(raw).encode("latin-1")]
        admitted = core.admit(self.options, method, path, values)
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

        claim = core.claim_request_for(
            admitted,
            method=method,
            path=path,
            query_string=str(environ.get("QUERY_STRING", "")),
            content_type=environ.get("CONTENT_TYPE") or None,
            body=body,
            request_view=lambda: _request_view(environ, method, path, admitted.policy.route),
            now=time.time(),
        )
        try:
            result = self.store.claim(claim)
        except StoreUnavailable as error:
            logger.error(
                "idempotency store unavailable on claim; answering 503",
                extra={"idempotency_key_hash": claim.key, "error": repr(error)},
            )
            return _problem(start_response, core.store_unavailable())
        if not isinstance(result, Claimed):
            answer = core.answer_held(result.record, claim.fingerprint, time.time())
            if isinstance(answer, Problem):
                return _problem(start_response, answer)
            return _replay(start_response, answer)
        return self._run_and_store(admitted, claim, environ, start_response)

    def _run_and_store(
        self,
        admitted: core.Admitted,
        claim: ClaimRequest,
        environ: Environ,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        captured = _CapturedResponse()
        try:
            iterable = self.app(environ, captured.start_response)
            try:
                for chunk in iterable:
                    captured.write(chunk)
            finally:
                close = getattr(iterable, "close", None)
                if close is not None:
                    close()
        except BaseException:
            self._release(claim)
            raise
        if captured.status_line is None:
            self._release(claim)
            raise RuntimeError("the WSGI application returned without calling start_response")
        status = _status_code(captured.status_line)
        body = captured.body()
        if core.keeps_response(status):
            completion = core.completion_for(
                claim, admitted.policy, status, _encode_headers(captured.headers), body, time.time()
            )
            try:
                if not self.store.complete(completion):
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
            self._release(claim)
        start_response(captured.status_line, captured.headers, captured.exc_info)
        return [body]

    def _release(self, claim: ClaimRequest) -> None:
        try:
            self.store.release(claim.key, claim.owner)
        except StoreUnavailable as error:
            logger.error(
                "could not release an idempotency claim; the key stays locked until its "
                "lock timeout",
                extra={"idempotency_key_hash": claim.key, "error": repr(error)},
            )


class _CapturedResponse:
    """Collects ``start_response`` and the body instead of sending them."""

    def __init__(self) -> None:
        self.status_line: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.exc_info: ExcInfo | None = None
        self.chunks: list[bytes] = []

    def start_response(
        self,
        status: str,
        headers: list[tuple[str, str]],
        exc_info: ExcInfo | None = None,
    ) -> Callable[[bytes], object]:
        if exc_info is not None and self.status_line is not None:
            # PEP 3333: replacing headers is allowed until they are sent; we have sent none.
            exc_info = None
        elif self.status_line is not None:
            raise AssertionError("start_response called twice without exc_info")
        self.status_line = status
        self.headers = list(headers)
        self.exc_info = exc_info
        return self.write

    def write(self, chunk: bytes) -> None:
        if chunk:
            self.chunks.append(chunk)

    def body(self) -> bytes:
        chunks, self.chunks = self.chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


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
