"""Adapter paths no other test runs, each on both adapters through real servers.

- the replay cache (``replay_cache_size``), its cost counted by a store wrapper;
- live streaming responses (``text/event-stream``), as the README documents them;
- chunked request bodies without Content-Length (on WSGI served by Werkzeug: waitress
  de-chunks the body and sets CONTENT_LENGTH itself, so it never reaches that path);
- the ASGI ``http.response.pathsend`` / ``http.response.zerocopy`` extensions, hidden from
  the app on covered requests (a direct ASGI call: uvicorn offers neither extension).

Everything is observed from outside: HTTP responses, ``on_event`` events, handler call
counters and the calls a store receives through the public store protocol.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
import pytest
from werkzeug.serving import make_server

from idempotency_middleware import (
    IdempotencyEvent,
    IdempotencyMiddleware,
    IdempotencyRule,
    IdempotencyWSGIMiddleware,
    MemoryStore,
)
from idempotency_middleware.engine.cache import ENTRY_SECONDS
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult, Completion
from idempotency_middleware.testing import FakeClock
from tests.support.apps import (
    EVENT_STREAM,
    POST_ORDERS,
    POST_SLOW,
    POST_STREAM,
    POST_TICKER,
    STREAM_FIRST_CHUNK,
    STREAM_LAST_CHUNK,
    AppState,
    build_asgi_app,
    build_wsgi_app,
)
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, HOST, serve_asgi, serve_wsgi

HEADER = "Idempotency-Key"
ORDER = {"item": "book", "quantity": 2}
EVENT_TIMEOUT_SECONDS = 10.0
CACHE_SIZE = 16
TTL_SECONDS = 60.0
MAX_BODY_BYTES = 1000

Server = Literal["uvicorn", "waitress", "werkzeug"]


def new_key() -> str:
    return f"paths-{uuid.uuid4()}"


def keyed(key: str) -> dict[str, str]:
    return {HEADER: key}


def is_replay_of(response: httpx.Response, first: httpx.Response) -> bool:
    return (
        response.headers.get("idempotent-replayed") == "true"
        and response.status_code == first.status_code
        and response.content == first.content
        and response.headers.get("x-order") == first.headers.get("x-order")
    )


def assert_problem(response: httpx.Response, status: int, slug: str) -> None:
    """A problem response the middleware made itself, of the given kind."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status
    assert re.split("[:/]", problem["type"])[-1] == slug, problem


# --- a store that counts its calls ---------------------------------------------------------


class CountingStore:
    """A ``MemoryStore`` behind the public store protocol (sync and async), counting calls."""

    def __init__(self) -> None:
        self._inner = MemoryStore()
        self._lock = threading.Lock()
        self._calls: collections.Counter[str] = collections.Counter()

    def calls(self) -> int:
        """Calls of every operation (claim, complete, release, renew) so far."""
        with self._lock:
            return sum(self._calls.values())

    def drop(self, key_hash: str) -> bool:
        """Delete a record behind the door's back, as the command line's ``delete`` does."""
        return self._inner.delete(key_hash)

    def _count(self, operation: str) -> None:
        with self._lock:
            self._calls[operation] += 1

    def claim(self, request: ClaimRequest) -> ClaimResult:
        self._count("claim")
        return self._inner.claim(request)

    def complete(self, completion: Completion) -> bool:
        self._count("complete")
        return self._inner.complete(completion)

    def release(self, key_hash: str, owner: str) -> bool:
        self._count("release")
        return self._inner.release(key_hash, owner)

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        self._count("renew")
        return self._inner.renew(key_hash, owner, lock_expires_at)

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        return self.claim(request)

    async def acomplete(self, completion: Completion) -> bool:
        return self.complete(completion)

    async def arelease(self, key_hash: str, owner: str) -> bool:
        return self.release(key_hash, owner)

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return self.renew(key_hash, owner, lock_expires_at)


# --- events and servers --------------------------------------------------------------------


class EventLog:
    """The ``on_event`` hook: keeps every event; tests wait for one without polling."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.events: list[IdempotencyEvent] = []

    def __call__(self, event: IdempotencyEvent) -> None:
        with self._condition:
            self.events.append(event)
            self._condition.notify_all()

    def wait_for(self, kind: str) -> IdempotencyEvent:
        def found() -> IdempotencyEvent | None:
            return next((event for event in self.events if event.kind == kind), None)

        with self._condition:
            assert self._condition.wait_for(lambda: found() is not None, EVENT_TIMEOUT_SECONDS), (
                f"no {kind!r} event in {[event.kind for event in self.events]}"
            )
            event = found()
            assert event is not None
            return event


@contextlib.contextmanager
def serve_werkzeug(app: Any) -> Iterator[str]:
    """Serve a WSGI app with Werkzeug's threaded server on a free port of 127.0.0.1.

    Unlike waitress, it hands a chunked request body to the app as it comes: no
    CONTENT_LENGTH, ``wsgi.input_terminated`` set.
    """
    server = make_server(HOST, 0, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="werkzeug", daemon=True
    )
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class Served:
    """One running server: the app's call counters, the store, the events and a client."""

    def __init__(
        self, state: AppState, store: CountingStore, events: EventLog, client: httpx.Client
    ) -> None:
        self.state = state
        self.store = store
        self.events = events
        self.client = client

    def post_order(self, key: str) -> httpx.Response:
        return self.client.post("/orders", json=ORDER, headers=keyed(key))


class Servers:
    """Starts the test app (FastAPI on uvicorn, Flask on waitress or Werkzeug) behind the
    middleware; everything started is stopped when the test ends."""

    def __init__(self, server: Server, stack: contextlib.ExitStack) -> None:
        self.server = server
        self._stack = stack

    def start(self, **options: Any) -> Served:
        state, events, store = AppState(), EventLog(), CountingStore()
        options.setdefault("on_event", events)
        if self.server == "uvicorn":
            wrapped = IdempotencyMiddleware(build_asgi_app(state), store=store, **options)
            url = self._stack.enter_context(serve_asgi(wrapped))
        else:
            flask_app = build_wsgi_app(state)
            middleware = IdempotencyWSGIMiddleware(flask_app.wsgi_app, store=store, **options)
            self._stack.callback(middleware.close)  # its renewal thread, once the server stopped
            flask_app.wsgi_app = middleware  # type: ignore[method-assign]
            serve = serve_wsgi if self.server == "waitress" else serve_werkzeug
            url = self._stack.enter_context(serve(flask_app))
        return Served(state, store, events, self.client(url))

    def client(self, url: str) -> httpx.Client:
        client = httpx.Client(base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS)
        self._stack.callback(client.close)  # before the server stops
        return client


@pytest.fixture(params=["uvicorn", "waitress"], ids=["asgi", "wsgi"])
def servers(request: pytest.FixtureRequest) -> Iterator[Servers]:
    """Both adapters: FastAPI on uvicorn, Flask on waitress."""
    with contextlib.ExitStack() as stack:
        yield Servers(request.param, stack)


@pytest.fixture(params=["uvicorn", "werkzeug"], ids=["asgi", "wsgi-werkzeug"])
def chunked_servers(request: pytest.FixtureRequest) -> Iterator[Servers]:
    """Both adapters on servers that pass a chunked request body on without a length."""
    with contextlib.ExitStack() as stack:
        yield Servers(request.param, stack)


# --- 1. the replay cache ---------------------------------------------------------------------


def test_a_replay_served_from_the_replay_cache_costs_no_store_call(servers: Servers) -> None:
    served = servers.start(replay_cache_size=CACHE_SIZE)
    key = new_key()
    first = served.post_order(key)
    served.post_order(key)  # a replay through the store fills the cache (at the latest)

    calls_before = served.store.calls()
    cached = served.post_order(key)

    assert first.status_code == 201
    assert is_replay_of(cached, first)
    assert served.store.calls() == calls_before
    assert served.state.calls(POST_ORDERS) == 1


def test_an_in_progress_record_is_not_cached_the_completed_response_is_replayed(
    servers: Servers,
) -> None:
    served = servers.start(replay_cache_size=CACHE_SIZE)
    key = new_key()
    gate = served.state.arm_gate()
    background = servers.client(str(served.client.base_url))

    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(background.post, "/slow", json=ORDER, headers=keyed(key))
        assert served.state.wait_for_calls(POST_SLOW, 1)
        conflict = served.client.post("/slow", json=ORDER, headers=keyed(key))
        gate.set()
        first = running.result(timeout=CLIENT_TIMEOUT_SECONDS)
    after_completion = served.client.post("/slow", json=ORDER, headers=keyed(key))

    assert conflict.status_code == 409
    assert first.status_code == 201
    assert is_replay_of(after_completion, first)
    assert served.state.calls(POST_SLOW) == 1


def test_a_key_deleted_elsewhere_replays_from_the_cache_for_at_most_its_entry_lifetime(
    servers: Servers,
) -> None:
    clock = FakeClock()
    served = servers.start(replay_cache_size=CACHE_SIZE, clock=clock)
    key = new_key()
    first = served.post_order(key)
    served.post_order(key)  # a replay through the store fills the cache (at the latest)
    assert served.store.drop(storage_key("POST", "/orders", None, key))

    clock.advance(ENTRY_SECONDS - 1)
    cached = served.post_order(key)
    clock.advance(1)
    after_entry_lifetime = served.post_order(key)

    assert is_replay_of(cached, first)
    assert after_entry_lifetime.status_code == 201
    assert after_entry_lifetime.headers.get("idempotent-replayed") is None
    assert after_entry_lifetime.json()["call"] == 2


def test_an_expired_replay_cache_entry_is_not_served(servers: Servers) -> None:
    clock = FakeClock()
    served = servers.start(replay_cache_size=CACHE_SIZE, ttl_seconds=TTL_SECONDS, clock=clock)
    key = new_key()
    first = served.post_order(key)
    served.post_order(key)  # a replay through the store fills the cache (at the latest)

    clock.advance(TTL_SECONDS)
    after_ttl = served.post_order(key)

    assert first.json()["call"] == 1
    assert after_ttl.status_code == 201
    assert after_ttl.headers.get("idempotent-replayed") is None
    assert after_ttl.json()["call"] == 2
    assert served.state.calls(POST_ORDERS) == 2


# --- 2. live streaming responses -------------------------------------------------------------


def read_until(chunks: Iterator[bytes], marker: bytes) -> bytes:
    """Read a streamed body until ``marker`` has arrived (or the body ended)."""
    received = b""
    for chunk in chunks:
        received += chunk
        if marker in received:
            break
    return received


def read_rest(chunks: Iterator[bytes]) -> bytes:
    """The rest of a streamed body, up to where the server cut it off, if it did."""
    received = b""
    with contextlib.suppress(httpx.TransportError):
        for chunk in chunks:
            received += chunk
    return received


def test_a_streamed_response_reaches_the_client_while_the_handler_still_runs(
    servers: Servers,
) -> None:
    served = servers.start()
    gate = served.state.arm_gate()

    with served.client.stream("POST", "/stream", headers=keyed(new_key())) as response:
        chunks = response.iter_raw()
        first = read_until(chunks, STREAM_FIRST_CHUNK)
        gate.set()  # only now may the handler go on to its last chunk
        rest = read_rest(chunks)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith(EVENT_STREAM)
    assert first == STREAM_FIRST_CHUNK
    assert rest == STREAM_LAST_CHUNK


def test_a_finished_stream_completes_the_key_and_a_retry_gets_response_not_stored(
    servers: Servers,
) -> None:
    served = servers.start()
    key = new_key()

    with served.client.stream("POST", "/stream", headers=keyed(key)) as response:
        body = response.read()
    completed = served.events.wait_for("completed")
    retry = served.client.post("/stream", headers=keyed(key))

    assert body == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert completed.status == 200
    assert_problem(retry, 410, "response-not-stored")
    assert served.state.calls(POST_STREAM) == 1


def test_a_stream_that_fails_midway_releases_the_key_and_a_retry_runs_again(
    servers: Servers,
) -> None:
    served = servers.start()
    key = new_key()
    gate = served.state.arm_gate()

    with served.client.stream("POST", "/stream?fail=first", headers=keyed(key)) as response:
        chunks = response.iter_raw()
        first = read_until(chunks, STREAM_FIRST_CHUNK)
        gate.set()  # the handler raises now
        rest = read_rest(chunks)
    served.events.wait_for("released")
    with served.client.stream("POST", "/stream?fail=first", headers=keyed(key)) as retry:
        retry_body = retry.read()

    assert first == STREAM_FIRST_CHUNK
    assert STREAM_LAST_CHUNK not in rest
    assert retry.status_code == 200
    assert retry.headers.get("idempotent-replayed") is None
    assert retry_body == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert served.state.calls(POST_STREAM) == 2


def test_a_stream_with_a_5xx_status_releases_the_key_and_a_retry_runs_again(
    servers: Servers,
) -> None:
    served = servers.start()
    key = new_key()

    first = served.client.post("/stream?status=503", headers=keyed(key))
    served.events.wait_for("released")
    retry = served.client.post("/stream?status=503", headers=keyed(key))

    assert first.status_code == 503
    assert retry.status_code == 503
    assert retry.content == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert served.state.calls(POST_STREAM) == 2


def test_a_client_that_leaves_mid_stream_completes_the_key_and_a_retry_gets_not_stored(
    servers: Servers,
) -> None:
    served = servers.start()
    key = new_key()

    with served.client.stream("POST", "/ticker", headers=keyed(key)) as response:
        first = read_until(response.iter_raw(), b"\n\n")
    # Leaving the block closes the unfinished response, and with it the connection.
    completed = served.events.wait_for("completed")
    retry = served.client.post("/ticker", headers=keyed(key))

    assert first.startswith(b"data: tick 0\n\n")
    assert completed.status == 200
    assert_problem(retry, 410, "response-not-stored")
    assert served.state.calls(POST_TICKER) == 1


# --- 3. chunked request bodies without Content-Length --------------------------------------


def in_chunks(body: bytes, size: int) -> Iterator[bytes]:
    """A request body httpx sends chunked, without Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def post_chunked(served: Served, body: bytes, key: str, size: int = 5) -> httpx.Response:
    request = served.client.build_request(
        "POST",
        "/orders",
        content=in_chunks(body, size),
        headers={**keyed(key), "content-type": "application/json"},
    )
    assert request.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in request.headers
    return served.client.send(request)


def test_a_chunked_body_reaches_the_handler_and_its_retry_is_replayed(
    chunked_servers: Servers,
) -> None:
    served = chunked_servers.start(max_body_bytes=MAX_BODY_BYTES)
    key = new_key()

    first = post_chunked(served, orjson.dumps(ORDER), key)
    retry = post_chunked(served, orjson.dumps(ORDER), key, size=3)

    assert first.status_code == 201
    assert first.json()["received"] == ORDER
    assert is_replay_of(retry, first)
    assert served.state.calls(POST_ORDERS) == 1


def test_a_different_chunked_body_under_the_same_key_is_refused(
    chunked_servers: Servers,
) -> None:
    served = chunked_servers.start(max_body_bytes=MAX_BODY_BYTES)
    key = new_key()

    first = post_chunked(served, orjson.dumps(ORDER), key)
    other = post_chunked(served, orjson.dumps({**ORDER, "quantity": 3}), key)

    assert first.status_code == 201
    assert_problem(other, 422, "key-reused")
    assert served.state.calls(POST_ORDERS) == 1


def test_a_chunked_body_and_the_same_body_with_content_length_are_one_request(
    chunked_servers: Servers,
) -> None:
    served = chunked_servers.start(max_body_bytes=MAX_BODY_BYTES)
    key = new_key()

    first = post_chunked(served, orjson.dumps(ORDER), key)
    retry = served.client.post(
        "/orders",
        content=orjson.dumps(ORDER),
        headers={**keyed(key), "content-type": "application/json"},
    )

    assert first.status_code == 201
    assert is_replay_of(retry, first)
    assert served.state.calls(POST_ORDERS) == 1


def test_a_chunked_body_over_max_body_bytes_is_413_and_the_handler_does_not_run(
    chunked_servers: Servers,
) -> None:
    served = chunked_servers.start(max_body_bytes=MAX_BODY_BYTES)

    response = post_chunked(served, b"x" * (MAX_BODY_BYTES + 1), new_key(), size=100)

    assert_problem(response, 413, "body-too-large")
    assert served.state.calls(POST_ORDERS) == 0


# --- 4. ASGI pathsend / zerocopy -------------------------------------------------------------
# uvicorn offers neither extension, so the middleware is called directly with the scope a
# server offering them would build; what matters is the scope the app receives.

Message = MutableMapping[str, Any]
BYPASS_EXTENSIONS = {"http.response.pathsend", "http.response.zerocopy"}
OTHER_EXTENSION = "http.response.trailers"
FILE_CONTENT = b"the file the app serves\n"


class FileApp:
    """An ASGI app serving a file: through ``http.response.pathsend`` when the server offers
    it, as Starlette's ``FileResponse`` does, else as ordinary body messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offered: list[set[str]] = []  # the extensions each call was offered

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        extensions = scope.get("extensions") or {}
        self.offered.append(set(extensions))
        while (await receive()).get("more_body", False):
            pass
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if "http.response.pathsend" in extensions:
            await send({"type": "http.response.pathsend", "path": str(self.path)})
        else:
            await send({"type": "http.response.body", "body": self.path.read_bytes()})


def call_asgi(app: IdempotencyMiddleware, method: str, path: str, key: str) -> list[Message]:
    """One request from a server that offers pathsend and zerocopy; the messages sent."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (HEADER.lower().encode(), key.encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "extensions": {name: {} for name in (*BYPASS_EXTENSIONS, OTHER_EXTENSION)},
    }
    sent: list[Message] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Message:
        return requests.pop() if requests else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def file_middleware(tmp_path: Path) -> tuple[FileApp, IdempotencyMiddleware]:
    served_file = tmp_path / "served.txt"
    served_file.write_bytes(FILE_CONTENT)
    app = FileApp(served_file)
    rules = [IdempotencyRule("/internal/{name}", enabled=False)]
    return app, IdempotencyMiddleware(app, store=MemoryStore(), rules=rules)


def sent_body(messages: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def test_pathsend_and_zerocopy_are_hidden_from_the_app_on_a_covered_request(
    tmp_path: Path,
) -> None:
    app, middleware = file_middleware(tmp_path)

    sent = call_asgi(middleware, "POST", "/files", new_key())

    assert app.offered == [{OTHER_EXTENSION}]
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]
    assert sent_body(sent) == FILE_CONTENT


def test_a_file_response_on_a_covered_request_is_stored_and_replayed(tmp_path: Path) -> None:
    app, middleware = file_middleware(tmp_path)
    key = new_key()

    call_asgi(middleware, "POST", "/files", key)
    replay = call_asgi(middleware, "POST", "/files", key)

    assert len(app.offered) == 1
    assert (b"idempotent-replayed", b"true") in replay[0]["headers"]
    assert sent_body(replay) == FILE_CONTENT


@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", "/files"), ("POST", "/internal/report")],
    ids=["uncovered-method", "disabled-rule"],
)
def test_pathsend_and_zerocopy_are_left_alone_on_an_uncovered_request(
    tmp_path: Path, method: str, path: str
) -> None:
    app, middleware = file_middleware(tmp_path)

    sent = call_asgi(middleware, method, path, new_key())

    assert app.offered == [BYPASS_EXTENSIONS | {OTHER_EXTENSION}]
    assert sent[-1] == {"type": "http.response.pathsend", "path": str(app.path)}


# --- 5. The request body as the ASGI door reads it ------------------------------------------
# Direct calls, so the door meets messages no HTTP client sends on purpose: a body with no
# Content-Length in one message over the limit, and a client gone before its body came.


class BodyApp:
    """Answers 201 with the body it received (read whole)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})


def send_body(app: IdempotencyMiddleware, key: str, requests: list[Message]) -> list[Message]:
    """One keyed POST with no Content-Length whose messages are ``requests``; what was sent."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/orders",
        "raw_path": b"/orders",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (HEADER.lower().encode(), key.encode())],
    }
    sent: list[Message] = []
    pending = list(reversed(requests))

    async def receive() -> Message:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_a_body_over_max_body_bytes_in_one_undeclared_message_is_413() -> None:
    app, store = BodyApp(), MemoryStore()
    middleware = IdempotencyMiddleware(app, store=store, max_body_bytes=MAX_BODY_BYTES)
    over: Message = {
        "type": "http.request",
        "body": b"x" * (MAX_BODY_BYTES + 1),
        "more_body": False,
    }
    exact: Message = {"type": "http.request", "body": b"x" * MAX_BODY_BYTES, "more_body": False}

    refused = send_body(middleware, new_key(), [over])
    accepted = send_body(middleware, new_key(), [exact])

    assert refused[0]["status"] == 413 and app.bodies == [b"x" * MAX_BODY_BYTES]
    assert accepted[0]["status"] == 201 and len(store) == 1  # only the accepted one claimed


def test_a_body_in_several_messages_reaches_the_app_whole() -> None:
    app = BodyApp()
    middleware = IdempotencyMiddleware(app, store=MemoryStore(), max_body_bytes=MAX_BODY_BYTES)
    parts = [b'{"item": ', b'"book"}']
    requests: list[Message] = [
        {"type": "http.request", "body": parts[0], "more_body": True},
        {"type": "http.request", "body": parts[1], "more_body": False},
    ]

    sent = send_body(middleware, new_key(), requests)

    assert sent[0]["status"] == 201 and app.bodies == [b"".join(parts)]


@pytest.mark.parametrize("after_a_part", [False, True])
def test_a_client_gone_before_its_body_came_gets_nothing_and_claims_nothing(
    after_a_part: bool,
) -> None:
    app, store = BodyApp(), MemoryStore()
    middleware = IdempotencyMiddleware(app, store=store)
    part: Message = {"type": "http.request", "body": b"{", "more_body": True}

    sent = send_body(middleware, new_key(), [part] if after_a_part else [])

    assert sent == [] and app.bodies == [] and len(store) == 0
