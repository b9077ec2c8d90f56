"""A minimal Django project built in code: settings, URLs and views, for tests/e2e/test_django.py.

Django's settings are process-global, so they are configured once, when this module is
first imported; each test builds its own handler (``WSGIHandler`` or ``ASGIHandler``) under
``override_settings(IDEMPOTENCY=...)``, which the middleware reads once, at construction.
Its middleware: Django's CommonMiddleware, then ours; no database, no installed apps.

Views (a call counter per endpoint in ``state()``, named ``"METHOD /route"``):

- ``POST orders/<int:order_id>``: 201, JSON echo of the body with the call number and the
  order id, ``X-Order`` and a session cookie; ``POST orders``: the same without an id
- ``POST slow``: blocks at the next gate the test armed, then 201
- ``POST fail?status=S``: answers S; ``POST boom``: raises
- ``POST stream?fail=1``: a ``StreamingHttpResponse`` (sync generator) of
  ``STREAM_FIRST_CHUNK``, then (after the next armed gate) ``STREAM_LAST_CHUNK``, or an
  exception with ``fail``
- ``POST file``: a ``FileResponse`` of ``FILE_CONTENT``
- ``POST async-stream?fail=1``: an async view streaming an async generator, likewise
- ``POST cut?length=N&stream=1`` (or ``fail=1``): a body that does not match its
  Content-Length, buffered or streaming (or a stream failing midway)
- ``POST txn?table=T&stream=1`` (or ``stream=async``): adds a put of ``{"id": <body's
  id>}`` (if absent) to the attempt's ``completion_transaction()`` and answers 201 JSON, or
  with ``stream`` a ``text/event-stream`` of two chunks (sync or async; ``stream=cut``: one,
  then an exception); it answers 501
  naming the exception when there is no transaction to use (no key: ``LookupError``)
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator

import django
import orjson
from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path

from idempotency_middleware import completion_transaction
from tests.support.apps import STREAM_FIRST_CHUNK, STREAM_LAST_CHUNK, AppState

MIDDLEWARE = "idempotency_middleware.django.IdempotencyDjangoMiddleware"
# Django's own limit on a body read into memory, low enough for a test to cross.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
FILE_CONTENT = b"the file the view serves\n" * 3

POST_ORDER = "POST /orders/{order_id}"
POST_ORDERS = "POST /orders"
POST_SLOW = "POST /slow"
POST_FAIL = "POST /fail"
POST_BOOM = "POST /boom"
POST_STREAM = "POST /stream"
POST_FILE = "POST /file"
POST_ASYNC_STREAM = "POST /async-stream"


class StreamFailed(Exception):
    """Raised by a stream midway (``?fail=1``)."""


_state = AppState()


def state() -> AppState:
    """The counters and gates the views use now."""
    return _state


def use_state(new: AppState) -> None:
    """Give the views fresh counters and gates (one per test)."""
    global _state
    _state = new


def _order(request: HttpRequest, endpoint: str, order_id: int | None = None) -> HttpResponse:
    call = state().record_call(endpoint)
    received = orjson.loads(request.body) if request.body else None
    payload = {"call": call, "order_id": order_id, "received": received}
    response = HttpResponse(orjson.dumps(payload), status=201, content_type="application/json")
    response["X-Order"] = str(call)
    response.set_cookie("session", f"session-{call}")
    return response


def order(request: HttpRequest, order_id: int) -> HttpResponse:
    return _order(request, POST_ORDER, order_id)


def orders(request: HttpRequest) -> HttpResponse:
    return _order(request, POST_ORDERS)


def slow(request: HttpRequest) -> HttpResponse:
    call = state().record_call(POST_SLOW)
    state().wait_at_next_gate()
    return HttpResponse(orjson.dumps({"call": call}), status=201, content_type="application/json")


def fail(request: HttpRequest) -> HttpResponse:
    call = state().record_call(POST_FAIL)
    return HttpResponse(f"call {call}", status=int(request.GET.get("status", "500")))


def boom(request: HttpRequest) -> HttpResponse:
    state().record_call(POST_BOOM)
    raise RuntimeError("the view failed")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    state().record_call(POST_STREAM)
    fails = request.GET.get("fail") == "1"

    def chunks() -> Iterator[bytes]:
        yield STREAM_FIRST_CHUNK
        state().wait_at_next_gate()
        if fails:
            raise StreamFailed("the stream failed midway")
        yield STREAM_LAST_CHUNK

    return StreamingHttpResponse(chunks(), content_type="text/event-stream")


def file(request: HttpRequest) -> FileResponse:
    state().record_call(POST_FILE)
    return FileResponse(io.BytesIO(FILE_CONTENT), content_type="text/plain")


async def async_stream(request: HttpRequest) -> StreamingHttpResponse:
    state().record_call(POST_ASYNC_STREAM)
    fails = request.GET.get("fail") == "1"

    async def chunks() -> AsyncIterator[bytes]:
        yield STREAM_FIRST_CHUNK
        if fails:
            raise StreamFailed("the stream failed midway")
        yield STREAM_LAST_CHUNK

    return StreamingHttpResponse(chunks(), content_type="text/event-stream")


POST_TXN = "POST /txn"


def txn(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    call = state().record_call(POST_TXN)
    body = orjson.loads(request.body)
    try:
        completion_transaction().put(
            request.GET["table"], {"id": body["id"]}, condition="attribute_not_exists(id)"
        )
    except LookupError as error:
        return HttpResponse(type(error).__name__, status=501)
    if request.GET.get("stream") == "async":

        async def chunks() -> AsyncIterator[bytes]:
            yield STREAM_FIRST_CHUNK
            yield STREAM_LAST_CHUNK

        return StreamingHttpResponse(chunks(), content_type="text/event-stream")
    if request.GET.get("stream") == "1":
        return StreamingHttpResponse(
            iter([STREAM_FIRST_CHUNK, STREAM_LAST_CHUNK]), content_type="text/event-stream"
        )
    if request.GET.get("stream") == "cut":

        def cut_short() -> Iterator[bytes]:
            yield STREAM_FIRST_CHUNK
            raise StreamFailed("the stream failed midway")

        return StreamingHttpResponse(cut_short(), content_type="text/event-stream")
    return HttpResponse(orjson.dumps({"call": call}), status=201, content_type="application/json")


POST_CUT = "POST /cut"


def cut(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """A response whose body does not match its Content-Length (``?length=N``), buffered
    or (``?stream=1``) streaming; or (``?fail=1``) a stream that fails midway."""
    state().record_call(POST_CUT)
    if request.GET.get("fail") == "1":

        def failing() -> Iterator[bytes]:
            yield b"part"
            raise StreamFailed("the stream failed midway")

        return StreamingHttpResponse(failing(), content_type="text/event-stream")
    response: HttpResponse | StreamingHttpResponse
    if request.GET.get("stream") == "1":
        response = StreamingHttpResponse(iter([b"part", b"ial"]), content_type="text/plain")
    else:
        response = HttpResponse(b"partial", content_type="text/plain")
    response["Content-Length"] = request.GET["length"]
    return response


urlpatterns = [
    path("cut", cut),
    path("orders/<int:order_id>", order),
    path("orders", orders),
    path("slow", slow),
    path("fail", fail),
    path("boom", boom),
    path("stream", stream),
    path("file", file),
    path("async-stream", async_stream),
    path("txn", txn),
]

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="tests-only, never deployed",
        ALLOWED_HOSTS=["127.0.0.1", "localhost"],
        ROOT_URLCONF=__name__,
        # CommonMiddleware (Content-Length) outside ours: it runs on replays too.
        MIDDLEWARE=["django.middleware.common.CommonMiddleware", MIDDLEWARE],
        INSTALLED_APPS=[],
        DATABASES={},
        DATA_UPLOAD_MAX_MEMORY_SIZE=DATA_UPLOAD_MAX_MEMORY_SIZE,
        USE_TZ=True,
    )
    django.setup()
