"""``IdempotencyDjangoMiddleware``: the Django door, for the ``MIDDLEWARE`` setting.

A translation only, like the WSGI door it mirrors: read the key and the body from the
``HttpRequest``, run the rest of the middleware chain and the view, answer with an
``HttpResponse``. The attempt itself is ``engine.flow.attempt``.

Configured from the ``IDEMPOTENCY`` setting: ``{"store": ..., **options}``, the options being
those of ``IdempotencyWSGIMiddleware``. The middleware is sync (``sync_capable``): under ASGI
Django runs it, with the sync parts of the chain, in a thread of its own per request.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterator, Mapping
from functools import partial
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.utils.module_loading import import_string

from ..engine import decisions, problems
from ..engine.effects import Ran
from ..engine.problems import Problem
from ..engine.setup import FinishStream, LiveStream, SyncSetup
from ..handler.context import streams_now
from ..policy.options import DOOR_OPTIONS, Options, check_option_names
from ..stores.catalog import A_SYNC_STORE
from ..stores.protocol import SyncStore
from ..stores.records import Headers, StoredResponse
from . import wsgi_environ as wsgi_io
from .answers import Reply, answer, problem_reply, replay_reply
from .capture import UnfinishedResponse, is_complete, scan_response_headers
from .live_body import AsyncLiveBody, LiveBody

__all__ = ["SETTING", "IdempotencyDjangoMiddleware", "problem_response", "replay_response"]

SETTING = "IDEMPOTENCY"
GetResponse = Callable[[HttpRequest], HttpResponseBase]


class IdempotencyDjangoMiddleware:
    """Make covered requests (POST and PATCH by default) safe to retry.

    ``MIDDLEWARE = [..., "idempotency_middleware.django.IdempotencyDjangoMiddleware", ...]``
    with ``IDEMPOTENCY = {"store": DynamoDBStore("idempotency"), ...}`` in the settings.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        self.store, self.options = configuration()
        self._setup = SyncSetup.for_options(self.options, self.store)

    def close(self) -> None:
        """Stop the lease-renewal thread (a daemon thread; for tidy shutdowns and tests)."""
        self._setup.close()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        method = str(request.method).upper()
        # The full path (SCRIPT_NAME included), as the WSGI door matches it: rules and keys
        # stay the same whichever of the two doors a project uses.
        path = str(request.path)
        policy = self.options.policy_for(method, path)
        if policy is None:
            return self.get_response(request)
        meta = request.META
        admitted = decisions.admit_request(
            self.options,
            policy,
            path,
            wsgi_io.key_lines(meta, self.options),
            meta.get("CONTENT_LENGTH") or None,
        )
        if admitted is None:
            return self.get_response(request)
        if isinstance(admitted, decisions.Admitted):
            return self._handle(admitted, method, path, request)
        return problem_response(admitted, self.options.problem_base_url)

    def _handle(
        self, admitted: decisions.Admitted, method: str, path: str, request: HttpRequest
    ) -> HttpResponseBase:
        meta: dict[str, Any] = request.META
        try:
            # Django keeps the body it read, so the view still gets request.body / POST.
            body: bytes = request.body
        except RequestDataTooBig:
            # Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE) refused it before ours could.
            return problem_response(
                problems.body_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE),
                self.options.problem_base_url,
            )
        too_large = decisions.check_body_size(self.options, len(body))
        if too_large is not None:
            return problem_response(too_large, self.options.problem_base_url)

        attempt = decisions.begin_attempt(
            admitted,
            method=method,
            path=path,
            query_string=str(meta.get("QUERY_STRING", "")),
            content_type=meta.get("CONTENT_TYPE") or None,
            body=body,
            request_view=lambda route: wsgi_io.request_view(meta, method, path, route),
            now=self._setup.now(),
            owner=self._setup.new_owner(),
        )
        view = _View(self.get_response, request)
        try:
            outcome = self._setup.drive(attempt, view.run)
        except LiveStream as live:
            # A streaming response goes out live; the attempt finishes when it ends.
            assert view.response is not None
            _count_stream(view.response, live.finish)
            return view.response
        except UnfinishedResponse:
            # Released; the response goes out as the view left it, for the server to cut.
            assert view.response is not None
            return view.response
        except _CutStream as cut:
            return cut.response  # a held stream that failed midway, released
        return answer(outcome, view, self.options.problem_base_url)


class _View:
    """Runs the rest of the middleware chain and the view for one request (``run``), then
    answers it once its attempt ended (an ``answers.Responder``)."""

    __slots__ = ("get_response", "request", "response")

    def __init__(self, get_response: GetResponse, request: HttpRequest) -> None:
        self.get_response = get_response
        self.request = request
        self.response: HttpResponseBase | None = None  # the view's, as the client gets it

    def run(self) -> Ran:
        response = self.response = self.get_response(self.request)
        if response.streaming and not streams_now():
            response = self.response = _held(response)
        return _ran(response)

    def reply(self, reply: Reply) -> HttpResponse:
        return reply_response(reply)

    def ran(self, ran: Ran) -> HttpResponseBase:
        assert self.response is not None
        return self.response

    def unprotected(self) -> HttpResponseBase:
        return self.get_response(self.request)

    def nothing(self) -> HttpResponseBase:
        # (Unreached: Django's handler refuses a view that returns no response.)
        raise RuntimeError("the view returned no response")


def configuration() -> tuple[SyncStore, Options]:
    """The store and options the ``IDEMPOTENCY`` setting describes; ``ImproperlyConfigured``
    saying what to fix otherwise."""
    config = getattr(settings, SETTING, None)
    if not isinstance(config, Mapping) or "store" not in config:
        raise ImproperlyConfigured(
            f"IdempotencyDjangoMiddleware needs the {SETTING} setting, a dict with a store: "
            f'{SETTING} = {{"store": "myproject.idempotency.store"}} (a sync store, or the '
            "dotted path of one or of a function returning one), plus any options of "
            "IdempotencyWSGIMiddleware"
        )
    options = dict(config)
    try:
        check_option_names(f"the {SETTING} setting", options, DOOR_OPTIONS)
    except TypeError as error:
        raise UnknownOptionError(str(error)) from None
    store = _store(options.pop("store"))
    try:
        built = Options.build(**options)
    except (TypeError, ValueError) as error:
        raise ImproperlyConfigured(f"{SETTING}: {error}") from error
    if built.check_store:
        decisions.store_check(store, "check")()  # StoreUnavailableError: the project does not start
    return store, built


class UnknownOptionError(ImproperlyConfigured, TypeError):  # type: ignore[misc]  # (untyped)
    """A misspelled option in the setting: Django's ``ImproperlyConfigured``, and the
    ``TypeError`` every other door raises for one."""


def _store(value: object) -> SyncStore:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as error:
            raise ImproperlyConfigured(f'{SETTING}["store"]: {error}') from error
    if isinstance(value, type) or (callable(value) and not isinstance(value, SyncStore)):
        value = value()  # a store class or a zero-argument factory
    if not isinstance(value, SyncStore):
        raise ImproperlyConfigured(
            f'{SETTING}["store"] must be {A_SYNC_STORE}; '
            f"{type(value).__name__} has no claim/complete/release/renew. An async store "
            "(AsyncDynamoDBStore) goes with IdempotencyMiddleware around Django's ASGI "
            "application instead."
        )
    return value


def _headers(response: HttpResponseBase) -> Headers:
    """A Django response's headers as the engine and the stores take them."""
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    ]


def _ran(response: HttpResponseBase) -> Ran:
    headers = _headers(response)
    if response.streaming:  # StreamingHttpResponse, FileResponse: sent live, not kept
        return Ran(response.status_code, headers, b"", live=True, ended=False)
    body = response.content
    if not is_complete(response.status_code, scan_response_headers(headers)[1], len(body)):
        raise UnfinishedResponse
    return Ran(response.status_code, headers, body)


class _CutStream(Exception):
    """A held stream failed midway: ``response`` streams what it sent, then its error."""

    def __init__(self, response: StreamingHttpResponse) -> None:
        super().__init__("the held stream failed midway")
        self.response = response


def _cut(streaming: Any, chunks: list[bytes], error: Exception) -> _CutStream:
    """A held stream that failed, to be sent as it went: what it yielded, then its error,
    so the server cuts it as it would have without the middleware."""

    def replay() -> Iterator[bytes]:
        yield from chunks
        raise error

    cut = StreamingHttpResponse(replay(), status=streaming.status_code)
    del cut["Content-Type"]
    for name, value in streaming.items():
        cut[name] = value
    return _CutStream(cut)


def _held(streaming: Any) -> HttpResponse:
    """A streaming response read whole, to be sent once the attempt's transaction landed
    (its writes must land before the first byte)."""
    chunks: list[bytes] = []
    try:
        if streaming.is_async:
            from asgiref.sync import async_to_sync

            async def read(content: AsyncIterable[bytes]) -> None:
                async for chunk in content:
                    chunks.append(chunk)

            # The door runs in a thread of its own (Django's sync middleware), with no loop.
            async_to_sync(read)(streaming.streaming_content)
        else:
            for chunk in streaming.streaming_content:
                chunks.append(chunk)
    except Exception as error:
        raise _cut(streaming, chunks, error) from error
    finally:
        streaming.close()
    body = b"".join(chunks)
    headers = _headers(streaming)
    if not is_complete(streaming.status_code, scan_response_headers(headers)[1], len(body)):
        raise _cut(streaming, chunks, UnfinishedResponse())
    return _response(streaming.status_code, headers, body)


def replay_response(stored: StoredResponse) -> HttpResponse:
    """A stored response sent again, marked as a replay."""
    return reply_response(replay_reply(stored))


def problem_response(problem: Problem, base_url: str | None = None) -> HttpResponse:
    """The middleware's own answer (400, 409, 410, 413, 422, 503) as problem+json;
    ``base_url`` is the ``problem_base_url`` option."""
    return reply_response(problem_reply(problem, base_url))


def reply_response(reply: Reply) -> HttpResponse:
    """An answer the middleware made (``answers.Reply``) as a Django response."""
    return _response(reply.status, reply.headers, reply.body)


def _response(status: int, headers: Headers, body: bytes) -> HttpResponse:
    response = HttpResponse(body, status=status)
    del response["Content-Type"]  # Django's default: the headers given say what it is
    for raw_name, raw_value in headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        # A Django response holds one value per name: repeated ones are joined, as RFC 9110
        # allows (Set-Cookie, the exception, is never stored).
        response[name] = f"{response[name]}, {value}" if name in response else value
    return response


def _count_stream(response: Any, finish: FinishStream) -> None:
    """Pass a streaming response's content through a ``LiveBody`` that finishes the attempt
    once: at its end, when it fails, or when Django closes the response (a client gone
    early). Setting ``streaming_content`` also keeps a ``FileResponse`` off
    ``wsgi.file_wrapper``, which would bypass the count."""
    content = response.streaming_content
    declared = scan_response_headers(_headers(response))[1]
    complete = partial(is_complete, response.status_code, declared)
    if response.is_async:
        response.streaming_content = AsyncLiveBody(content, finish, complete)
    else:
        # Django closes the view's own content itself, with the response.
        response.streaming_content = LiveBody(b"", content, finish, complete, closes_chunks=False)
