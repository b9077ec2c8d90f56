"""Fault injection for the reliability tests: a TCP proxy in front of DynamoDB, and one small
app served behind the middleware by both adapters.

``FaultProxy`` listens on 127.0.0.1 and forwards to the moto endpoint. It understands just
enough HTTP/1.1 (botocore and aiobotocore send one request at a time with a Content-Length)
to apply a fault per request, switched on demand from the test::

    with FaultProxy(moto_endpoint) as proxy:
        store = DynamoDBStore(table, endpoint_url=proxy.url, ...)
        proxy.set("refuse")                        # every request, until set again
        proxy.set("throttle", operations={"UpdateItem"}, count=2)  # the next two UpdateItems

Modes:

- ``pass``: forward.
- ``refuse``: reset the connection at once (new connections are reset before a byte is read;
  pooled ones when their next request arrives).
- ``hang``: accept and read the request, never forward it, never answer.
- ``swallow``: forward the request and read upstream's answer (so the write lands, and it is
  in ``answered()``), never send that answer back: a peer killed between its write landing
  and its response going out looks like this to its client.
- ``delay``: wait ``delay_ms`` before forwarding each request.
- ``cut``: forward, then send the status line, the headers and half the body, and reset.
- ``throttle``: answer HTTP 400 with DynamoDB's ``ThrottlingException`` body, as DynamoDB does.
- ``error``: answer ``error_status`` (500) with DynamoDB's error body for ``error_code``
  (``InternalServerError``), as DynamoDB does: ``{"__type": "com.amazonaws.dynamodb.
  v20120810#<code>", "message": ...}``, whose part after the ``#`` botocore takes as the
  error code. ``proxy.set("error", error_status=409, error_code=REPLICATED_WRITE_CONFLICT)``
  is a multi-Region strong-consistency table refusing a write another Region made at once.

Every request is recorded (time, DynamoDB operation, body, the fault applied), so a test can
count what reached the wire, e.g. lease renewals (``UpdateItem`` setting ``lock_expires_at``).

``Workload`` is the handler under test, written once and served as a raw ASGI app and a raw
WSGI app, with per-path run counters and gates the test opens; ``serve_workload`` serves it
behind either middleware (uvicorn or waitress, from ``tests/support/servers.py``) with an ``Events``
hook recording every ``IdempotencyEvent``; ``serve_through_proxy`` does that with a DynamoDB
store (``AsyncDynamoDBStore`` on ASGI, ``DynamoDBStore`` on WSGI) whose endpoint is the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
)
from idempotency_middleware.events import IdempotencyEvent
from idempotency_middleware.stores.protocol import AsyncStore, SyncStore
from tests.support.servers import HOST, serve_asgi, serve_wsgi

REGION = "us-east-1"

Mode = Literal["pass", "refuse", "hang", "swallow", "delay", "cut", "throttle", "error"]

THROTTLING_BODY = (
    b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate exceeded"}'
)
INTERNAL_SERVER_ERROR = "InternalServerError"
REPLICATED_WRITE_CONFLICT = "ReplicatedWriteConflictException"
# What DynamoDB says with each error code the tests inject (any other code: its own name).
_ERROR_MESSAGES = {
    INTERNAL_SERVER_ERROR: "Internal server error",
    REPLICATED_WRITE_CONFLICT: (
        "One or more items in this request are being modified by a request in another Region."
    ),
}
_REASONS = {
    400: b"Bad Request",
    409: b"Conflict",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


def error_body(code: str, message: str | None = None) -> bytes:
    """DynamoDB's JSON error body for ``code`` (botocore reads the code after the ``#``)."""
    text = message if message is not None else _ERROR_MESSAGES.get(code, code)
    return orjson.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": text})


INTERNAL_ERROR_BODY = error_body(INTERNAL_SERVER_ERROR)
_MAX_HEAD_BYTES = 256 * 1024


@dataclass(frozen=True)
class SeenRequest:
    """One request that reached the proxy."""

    at: float  # time.time() when it arrived
    operation: str  # DynamoDB operation (``PutItem``), from the X-Amz-Target header
    body: bytes
    fault: Mode  # what the proxy did with it

    @property
    def is_renewal(self) -> bool:
        """A lease renewal: the only UpdateItem that sets ``lock_expires_at``."""
        return self.operation == "UpdateItem" and b"lock_expires_at" in self.body


@dataclass
class _Fault:
    mode: Mode
    operations: frozenset[str] | None  # None: every operation
    remaining: int | None  # None: until the next set()
    delay_ms: float
    error_status: int
    error_body: bytes = INTERNAL_ERROR_BODY


_PASS = _Fault("pass", None, None, 0.0, 500)


class _Message:
    """An HTTP/1.1 message as raw bytes: the head (start line and headers) and the body."""

    def __init__(self, head: bytes, body: bytes) -> None:
        self.head = head
        self.body = body

    def header(self, name: bytes) -> bytes | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name:
                return value.strip()
        return None

    @property
    def closes(self) -> bool:
        return (self.header(b"connection") or b"").lower() == b"close"

    def raw(self) -> bytes:
        return self.head + self.body


async def _read_message(reader: asyncio.StreamReader) -> _Message | None:
    """One message with its body (Content-Length or chunked); ``None`` at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise ConnectionError("connection closed mid-message") from error
        return None
    except asyncio.LimitOverrunError as error:
        raise ConnectionError("message head too large") from error
    message = _Message(head, b"")
    length = message.header(b"content-length")
    if length is not None:
        message.body = await reader.readexactly(int(length))
    elif b"chunked" in (message.header(b"transfer-encoding") or b"").lower():
        message.body = await _read_chunked(reader)
    return message


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        parts.append(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers, then the blank line
                line = await reader.readuntil(b"\r\n")
                parts.append(line)
                if line == b"\r\n":
                    return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))


def _operation(request: _Message) -> str:
    target = request.header(b"x-amz-target") or b""
    return target.rpartition(b".")[2].decode("latin-1") or "?"


def _canned(status: int, body: bytes) -> bytes:
    head = (
        b"HTTP/1.1 %d %s\r\n"
        b"Content-Type: application/x-amz-json-1.0\r\n"
        b"x-amzn-RequestId: FAULTPROXY0000000000000000000000000000000000000000000\r\n"
        b"Content-Length: %d\r\n\r\n" % (status, _REASONS.get(status, b"Error"), len(body))
    )
    return head + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a refusing or crashing peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_url``, with switchable faults."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname != HOST or parts.port is None:
            raise ValueError(f"the proxy only forwards to {HOST}:<port>, not {upstream_url!r}")
        self._upstream = (parts.hostname, parts.port)
        self._lock = threading.Lock()
        self._fault = _PASS
        self._seen: list[SeenRequest] = []
        self._answered: list[str] = []  # operations the upstream answered, in order
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._stopping: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- control, from the test's thread ---------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def set(
        self,
        mode: Mode,
        *,
        operations: Iterable[str] | None = None,
        count: int | None = None,
        delay_ms: float = 0.0,
        error_status: int = 500,
        error_code: str = INTERNAL_SERVER_ERROR,
        error_message: str | None = None,
    ) -> None:
        """Apply ``mode`` to the requests for ``operations`` (all by default), for the next
        ``count`` of them (until the next ``set`` by default); others pass. ``error``
        answers ``error_status`` with DynamoDB's body for ``error_code`` (``error_message``:
        DynamoDB's own wording by default)."""
        with self._lock:
            self._fault = _Fault(
                mode,
                frozenset(operations) if operations is not None else None,
                count,
                delay_ms,
                error_status,
                error_body(error_code, error_message),
            )

    def seen(self) -> list[SeenRequest]:
        with self._lock:
            return list(self._seen)

    def forget(self) -> None:
        """Drop the requests seen so far (after a warm-up, say)."""
        with self._lock:
            self._seen.clear()
            self._answered.clear()

    def operations(self) -> list[str]:
        return [request.operation for request in self.seen()]

    def answered(self) -> list[str]:
        """The operations upstream has answered (whether or not their client still listened):
        a delayed write has landed once it is here."""
        with self._lock:
            return list(self._answered)

    def renewals(self) -> list[SeenRequest]:
        return [request for request in self.seen() if request.is_renewal]

    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(ready))
            except BaseException as error:  # reported to the starting thread
                failure.append(error)
                ready.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="faultproxy", daemon=True)
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"the fault proxy did not start: {failure!r}")
        return self

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- the proxy, on its own event loop -------------------------------------------------

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        self._server = await asyncio.start_server(self._connection, HOST, 0, limit=_MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        await self._stopping.wait()
        self._server.close()
        for writer in list(self._writers):
            _reset(writer)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _take_fault(self, operation: str | None) -> _Fault:
        """The fault for one request (``operation`` None: a connection not yet read)."""
        with self._lock:
            fault = self._fault
            if fault.mode == "pass":
                return fault
            if fault.operations is not None and (
                operation is None or operation not in fault.operations
            ):
                return _PASS
            if operation is None:
                return fault  # only an unfiltered refuse acts before the request
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._fault = _PASS
            return fault

    def _record(self, operation: str, body: bytes, mode: Mode) -> None:
        with self._lock:
            self._seen.append(SeenRequest(time.time(), operation, body, mode))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            with self._lock:
                refuse_at_once = (
                    self._fault.mode == "refuse"
                    and self._fault.operations is None
                    and self._fault.remaining is None
                )
            if refuse_at_once:
                _reset(writer)
                return
            while True:
                request = await _read_message(reader)
                if request is None:
                    return
                operation = _operation(request)
                fault = self._take_fault(operation)
                self._record(operation, request.body, fault.mode)
                if fault.mode == "refuse":
                    _reset(writer)
                    return
                if fault.mode == "hang":
                    while await reader.read(65536):
                        pass  # never answer; wait for the client to give up
                    return
                if fault.mode == "throttle":
                    writer.write(_canned(400, THROTTLING_BODY))
                    await writer.drain()
                    continue
                if fault.mode == "error":
                    writer.write(_canned(fault.error_status, fault.error_body))
                    await writer.drain()
                    continue
                if fault.mode == "delay":
                    await asyncio.sleep(fault.delay_ms / 1000)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self._upstream)
                upstream[1].write(request.raw())
                await upstream[1].drain()
                response = await _read_message(upstream[0])
                if response is None:
                    raise ConnectionError("upstream closed the connection")
                with self._lock:
                    self._answered.append(operation)
                if fault.mode == "swallow":
                    while await reader.read(65536):
                        pass  # the answer is dropped; wait for the client to give up
                    return
                if fault.mode == "cut":
                    writer.write(response.head + response.body[: len(response.body) // 2])
                    await writer.drain()
                    _reset(writer)
                    return
                writer.write(response.raw())
                await writer.drain()
                if response.closes:
                    upstream[1].close()
                    upstream = None
                if request.closes:
                    return
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError):
            _reset(writer)
        finally:
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            if upstream is not None:
                upstream[1].close()
            with contextlib.suppress(Exception):
                writer.close()


# --- the app under test: one handler, both adapters -----------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
StartResponse = Callable[..., Any]

GATE_TIMEOUT_SECONDS = 15.0


class Workload:
    """Handlers chosen by path, the same on both adapters; every run is counted per path.

    - ``/ok``: 201 ``{"path", "run"}``
    - ``/gate``: waits for the next gate the test armed (``arm_gate``), if any, then 201
    - ``/gate-fail``: the same, then 500
    - ``/sleep?seconds=S``: sleeps (``asyncio.sleep`` on ASGI), then 201
    - ``/block?seconds=S``: ASGI: ``time.sleep`` inside ``async def``, blocking the loop
    - ``/raise?seconds=S``: sleeps, then raises ``RuntimeError``
    - ``/first-block?seconds=S``: the first run blocks like ``/block``; later runs answer at once
    - ``/first-sleep?seconds=S``: the first run sleeps like ``/sleep``; later runs answer at once

    Every response body is JSON with the path and the run number, so a replay is told apart
    from a fresh run by its body.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._runs: Counter[str] = Counter()
        self._finished: Counter[str] = Counter()
        self._gates: list[threading.Event] = []
        self.finished_at: dict[str, float] = {}

    # --- for the test ---

    def runs(self, path: str) -> int:
        with self._condition:
            return self._runs[path]

    def finished(self, path: str) -> int:
        with self._condition:
            return self._finished[path]

    def wait_for_runs(self, path: str, count: int, timeout: float = 10.0) -> None:
        with self._condition:
            if not self._condition.wait_for(lambda: self._runs[path] >= count, timeout):
                raise TimeoutError(f"{path} did not run {count} times within {timeout} s")

    def wait_for_finished(self, path: str, count: int, timeout: float = 10.0) -> None:
        with self._condition:
            if not self._condition.wait_for(lambda: self._finished[path] >= count, timeout):
                raise TimeoutError(f"{path} did not finish {count} times within {timeout} s")

    def arm_gate(self) -> threading.Event:
        """The next gated handler waits until the returned event is set."""
        gate = threading.Event()
        with self._condition:
            self._gates.append(gate)
        return gate

    # --- shared by both adapters ---

    def _start(self, path: str) -> int:
        with self._condition:
            self._runs[path] += 1
            self._condition.notify_all()
            return self._runs[path]

    def _finish(self, path: str) -> None:
        with self._condition:
            self._finished[path] += 1
            self.finished_at[path] = time.time()
            self._condition.notify_all()

    def _next_gate(self) -> threading.Event:
        """The next armed gate; an open one when the test armed none."""
        with self._condition:
            if self._gates:
                return self._gates.pop(0)
        opened = threading.Event()
        opened.set()
        return opened

    @staticmethod
    def _seconds(query: str) -> float:
        return float(parse_qs(query).get("seconds", ["0"])[0])

    @staticmethod
    def _reply(path: str, run: int) -> bytes:
        return orjson.dumps({"path": path, "run": run})

    # --- ASGI ---

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False) and message["type"] == "http.request"
        path: str = scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        run = self._start(path)
        status = 201
        try:
            if path in ("/gate", "/gate-fail"):
                gate = self._next_gate()
                deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
                # Polled, not awaited in a thread: a cancelled handler must stop waiting.
                while not gate.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                status = 500 if path == "/gate-fail" else 201
            elif path == "/sleep" or (path == "/first-sleep" and run == 1):
                await asyncio.sleep(self._seconds(query))
            elif path == "/block" or (path == "/first-block" and run == 1):
                time.sleep(self._seconds(query))  # noqa: ASYNC251 - blocking on purpose
            elif path == "/raise":
                await asyncio.sleep(self._seconds(query))
                raise RuntimeError("the handler raised")
        finally:
            self._finish(path)
        body = self._reply(path, run)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    # --- WSGI ---

    def wsgi(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(length)
        path: str = environ.get("PATH_INFO", "")
        query: str = environ.get("QUERY_STRING", "")
        run = self._start(path)
        status = "201 Created"
        try:
            if path in ("/gate", "/gate-fail"):
                self._next_gate().wait(GATE_TIMEOUT_SECONDS)
                status = "500 Internal Server Error" if path == "/gate-fail" else status
            elif path in ("/sleep", "/block") or (
                path in ("/first-block", "/first-sleep") and run == 1
            ):
                time.sleep(self._seconds(query))
            elif path == "/raise":
                time.sleep(self._seconds(query))
                raise RuntimeError("the handler raised")
        finally:
            self._finish(path)
        body = self._reply(path, run)
        start_response(
            status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return [body]


def wait_until(condition: Callable[[], bool], timeout: float, message: str) -> None:
    """Poll ``condition`` every 20 ms; ``TimeoutError(message)`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.02)


# --- serving the workload behind the middleware -----------------------------------------------

Adapter = Literal["asgi", "wsgi"]
CLIENT_TIMEOUT_SECONDS = 30.0
JSON_BODY = b'{"amount": 100}'


class Events:
    """An ``on_event`` hook that keeps every event, with the time it arrived."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[tuple[float, IdempotencyEvent]] = []

    def __call__(self, event: IdempotencyEvent) -> None:
        with self._lock:
            self._events.append((time.time(), event))

    def of(self, kind: str, operation: str | None = None) -> list[IdempotencyEvent]:
        return [event for _, event in self.timed(kind, operation)]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()

    def timed(
        self, kind: str, operation: str | None = None
    ) -> list[tuple[float, IdempotencyEvent]]:
        with self._lock:
            return [
                (at, event)
                for at, event in self._events
                if event.kind == kind and (operation is None or event.operation == operation)
            ]


@dataclass
class Served:
    """One server with the middleware in front of a ``Workload``."""

    url: str
    workload: Workload
    events: Events
    client: httpx.Client

    def post(self, path: str, key: str, body: bytes = JSON_BODY) -> httpx.Response:
        return self.client.post(
            path, content=body, headers={"Idempotency-Key": key, "Content-Type": "application/json"}
        )

    def post_in_background(
        self, pool: ThreadPoolExecutor, path: str, key: str, body: bytes = JSON_BODY
    ) -> Future[httpx.Response]:
        """The same request on its own connection, from a pool thread."""

        def request() -> httpx.Response:
            with httpx.Client(
                base_url=self.url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False
            ) as client:
                return client.post(
                    path,
                    content=body,
                    headers={"Idempotency-Key": key, "Content-Type": "application/json"},
                )

        return pool.submit(request)


@contextlib.contextmanager
def serve_workload(
    adapter: Adapter,
    store: AsyncStore | SyncStore,
    *,
    workload: Workload | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    warm_up: bool = True,
    **options: Any,
) -> Iterator[Served]:
    """Serve a ``Workload`` behind the adapter's middleware: uvicorn (ASGI, ``store`` async)
    or waitress (WSGI, ``store`` sync). ``on_shutdown`` runs on uvicorn's loop at the end.

    ``warm_up`` first sends one request (``/warm-up``, its own key) so that the store's client
    exists before the test starts: creating it can take a second on a loaded machine, and a
    claim's lock deadline is counted from before the claim is sent. Its events are dropped.
    """
    workload = workload or Workload()
    events = Events()
    with contextlib.ExitStack() as stack:
        if adapter == "asgi":
            assert isinstance(store, AsyncStore)
            app = IdempotencyMiddleware(workload.asgi, store=store, on_event=events, **options)
            url = stack.enter_context(serve_asgi(app, on_shutdown=on_shutdown))
        else:
            assert isinstance(store, SyncStore)
            wsgi_app = IdempotencyWSGIMiddleware(
                workload.wsgi, store=store, on_event=events, **options
            )
            url = stack.enter_context(serve_wsgi(wsgi_app))
        client = stack.enter_context(
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False)
        )
        served = Served(url, workload, events, client)
        if warm_up:
            # Up to three tries, each its own key: on a loaded machine the first claim's
            # answer (connection, TLS-free handshake, moto's first table read) once took
            # longer than the store's read timeout, a 503 that ran nothing. The test's own
            # requests come after, on a warm client.
            for _ in range(3):
                warm = served.post("/warm-up", f"warm-up-{time.time_ns()}")
                if warm.status_code != 503:
                    break
            if warm.status_code != 201:
                raise RuntimeError(f"the warm-up request failed: {warm.status_code} {warm.text}")
            events.clear()
        yield served


@contextlib.contextmanager
def serve_through_proxy(
    adapter: Adapter,
    table: str,
    proxy: FaultProxy,
    *,
    store_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> Iterator[Served]:
    """``serve_workload`` with the adapter's DynamoDB store on ``proxy`` (the store's own
    defaults, such as ``max_attempts=2``, unless ``store_kwargs`` says otherwise); the proxy
    forgets the warm-up request."""
    store_arguments: dict[str, Any] = {"endpoint_url": proxy.url, "region_name": REGION}
    store_arguments.update(store_kwargs or {})
    if adapter == "asgi":
        async_store = AsyncDynamoDBStore(table, **store_arguments)
        with serve_workload(adapter, async_store, on_shutdown=async_store.aclose, **options) as s:
            proxy.forget()
            yield s
    else:
        with (
            DynamoDBStore(table, **store_arguments) as sync_store,
            serve_workload(adapter, sync_store, **options) as served,
        ):
            proxy.forget()
            yield served
