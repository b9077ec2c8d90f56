"""A protocol-blind TCP fault proxy for the partition tests: it sits on 127.0.0.1 in front of
any server (Redis, PostgreSQL, moto or DynamoDB Local) and cuts its clients off on demand.

``tests/support/faultproxy.py`` reads DynamoDB's HTTP to fault one request at a time; this one only
moves bytes, so it serves every store, and faults what a network partition does to a
connection rather than to a request::

    with TcpFaultProxy(redis_url) as proxy:
        store = RedisStore(proxy.url, ...)  # the same URL, the proxy's port
        proxy.set("swallow")                # writes land upstream, their answers are lost
        proxy.set("pass")                   # healed: connections that lost bytes are reset

Modes (what happens to bytes from now on, on new and open connections alike):

- ``pass``: forwarded both ways. Switching to it resets every connection that lost bytes
  (its stream is out of step with the server's: the client must see it die, as after a real
  partition's TCP timeout, not read a stale answer).
- ``refuse``: new connections are reset before a byte is read (a host down, a port closed);
  open ones go on.
- ``hang``: a black hole. New connections are accepted and read, never connected upstream;
  open ones are read and nothing goes either way. Clients wait for their own timeouts.
- ``swallow``: the client's bytes are forwarded, so its writes land upstream, and what comes
  back is dropped ("answer lost"): a peer cut off between its write and the answer.

``reset()`` resets every open connection at once (RST), whatever the mode. A connection that
lost an answer gets no more answers, one that lost a request forwards nothing more, until it
is reset or its client closes it. Counters say what
crossed: ``answers_dropped`` (chunks of answers dropped) lets a test wait until a write has
really reached the server under ``swallow``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from tests.support.faultproxy import _reset
from tests.support.servers import HOST

Mode = Literal["pass", "refuse", "hang", "swallow"]
_CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One client connection and, once made, its upstream connection."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    faulted: bool = False  # lost bytes one way or the other: never in step again
    black_hole: bool = False  # lost a client's bytes: nothing crosses it any more
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


class TcpFaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (``"host:port"`` or a URL whose host
    is 127.0.0.1), with switchable faults; started and stopped as a context manager."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream if "//" in upstream else f"tcp://{upstream}")
        if parts.hostname != HOST or parts.port is None:
            raise ValueError(f"the proxy only forwards to {HOST}:<port>, not {upstream!r}")
        self._upstream_url = parts
        self._upstream = (HOST, parts.port)
        self._lock = threading.Lock()
        self._mode: Mode = "pass"
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.connections = 0  # accepted so far
        self.answers_dropped = 0  # chunks from upstream never delivered
        self.requests_dropped = 0  # chunks from clients never forwarded

    # --- control, from the test's thread ---------------------------------------------------

    @property
    def url(self) -> str:
        """The upstream URL with the proxy's port: what a client connects to instead."""
        parts = self._upstream_url
        netloc = parts.netloc.rpartition("@")[0]
        netloc = f"{netloc}@{HOST}:{self.port}" if netloc else f"{HOST}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def mode(self) -> Mode:
        return self._mode

    def set(self, mode: Mode) -> None:
        """Apply ``mode`` from now on (see the module's docstring)."""
        with self._lock:
            self._mode = mode
        if mode == "pass":
            self._on_loop(self._reset_faulted)

    def reset(self) -> None:
        """Reset every open connection (the client sees ECONNRESET on its next read)."""
        self._on_loop(self._reset_all)

    def start(self) -> TcpFaultProxy:
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

        self._thread = threading.Thread(target=run, name="tcp-faults", daemon=True)
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"the TCP fault proxy did not start: {failure!r}")
        return self

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive():
                raise RuntimeError("the TCP fault proxy did not stop within 10 s")

    def __enter__(self) -> TcpFaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _on_loop(self, action: Any) -> None:
        """Run ``action`` on the proxy's loop and wait for it: when ``set``/``reset`` return,
        the connections are already reset."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        done = threading.Event()

        def call() -> None:
            try:
                action()
            finally:
                done.set()

        loop.call_soon_threadsafe(call)
        if not done.wait(10):
            raise RuntimeError("the TCP fault proxy's loop did not answer within 10 s")

    # --- the proxy, on its own event loop -------------------------------------------------

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            tasks = [task for link in self._links for task in link.tasks]
            self._reset_all()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    def _reset_all(self) -> None:
        for link in list(self._links):
            self._drop(link)

    def _reset_faulted(self) -> None:
        for link in list(self._links):
            if link.faulted:
                self._drop(link)

    def _drop(self, link: _Link) -> None:
        self._links.discard(link)
        _reset(link.client)
        if link.upstream is not None:
            _reset(link.upstream)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            mode = self._mode
            self.connections += 1
        if mode == "refuse":
            _reset(writer)
            return
        link = _Link(writer)
        self._links.add(link)
        self._adopt(link)
        try:
            if mode == "hang":
                link.faulted = link.black_hole = True  # never connected, for its whole life
                await self._discard(reader)
                return
            try:
                upstream_reader, link.upstream = await asyncio.open_connection(*self._upstream)
            except OSError:
                self._drop(link)
                return
            answers = asyncio.create_task(self._pump_answers(link, upstream_reader))
            link.tasks.add(answers)
            await self._pump_requests(link, reader)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # Stopping: end quietly (asyncio logs a connection task that ends cancelled).
            return
        finally:
            if link in self._links:
                self._drop(link)
            for task in link.tasks:
                if task is not asyncio.current_task():
                    task.cancel()

    def _adopt(self, link: _Link) -> None:
        task = asyncio.current_task()
        if task is not None:
            link.tasks.add(task)

    async def _discard(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(_CHUNK):
            with self._lock:
                self.requests_dropped += 1
            del chunk

    async def _pump_requests(self, link: _Link, reader: asyncio.StreamReader) -> None:
        """Client to upstream until the client closes (then the link is dropped)."""
        assert link.upstream is not None
        while chunk := await reader.read(_CHUNK):
            with self._lock:
                forward = self._mode in ("pass", "refuse", "swallow") and not link.black_hole
                if not forward:
                    self.requests_dropped += 1
            if not forward:
                link.faulted = link.black_hole = True
                continue
            link.upstream.write(chunk)
            await link.upstream.drain()

    async def _pump_answers(self, link: _Link, reader: asyncio.StreamReader) -> None:
        """Upstream to client. Upstream closing is passed on, unless the link is a black hole
        (a partitioned client hears nothing, not even a close)."""
        try:
            while chunk := await reader.read(_CHUNK):
                with self._lock:
                    deliver = self._mode in ("pass", "refuse") and not link.faulted
                    if not deliver:
                        self.answers_dropped += 1
                if not deliver:
                    link.faulted = True
                    continue
                link.client.write(chunk)
                await link.client.drain()
        except (ConnectionError, OSError):
            pass
        if not link.faulted and link in self._links:
            self._drop(link)
