"""Ours on PostgreSQL next to fastidempotent's PostgreSQL backend, on one server.

Both middlewares wrap the same Starlette app (benchmarks/_apps.py) and are driven in-process
through the raw ASGI interface (benchmarks/_common.py), against one PostgreSQL server this
benchmark starts (tests/support/db_servers.run_postgres; or ``--dsn``), each in a table of its own.
Every round runs every contender's new-key and replay batches, in an order that rotates from
round to round; a figure is the median over rounds of the batch's mean per request.

- wall time per request: the whole request, store round trips included;
- CPU per request: this process's CPU time (middleware, driver, event loop), not the
  server's;
- round trips per request: counted on the wire by a small TCP relay in front of the server,
  in a separate pass (never timed): every client message that waits for the server's answer
  (``Sync`` ending an extended-protocol exchange, or a simple ``Query``) is one round trip,
  whatever the driver (psycopg for ours, asyncpg under SQLAlchemy for fastidempotent).

    python -m benchmarks.postgres_peers [--rounds 15] [--requests 200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.metadata
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp

from benchmarks._apps import order_app
from benchmarks._common import (
    HOST,
    Exchange,
    call_once,
    heading,
    http_scope,
    load,
    machine_summary,
    median,
    order_headers,
    table,
    us,
)
from idempotency_middleware import IdempotencyMiddleware

# Untyped startup-phase requests (no type byte): SSL and GSS encryption requests, after which
# the client sends its real startup message.
_ENCRYPTION_REQUESTS = (80877103, 80877104)


class RoundTripCounter:
    """A TCP relay to a PostgreSQL server that counts the round trips clients start."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.round_trips = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="pg-relay")

    def __enter__(self) -> RoundTripCounter:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        """End the relays still open (a client's pool may keep connections)."""
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._relay, HOST, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _relay(self, client_in: asyncio.StreamReader, client_out: Any) -> None:
        server_in, server_out = await asyncio.open_connection(HOST, self.target_port)

        async def downstream() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await server_in.read(65536):
                    client_out.write(data)
                    await client_out.drain()
            client_out.close()

        copying = asyncio.ensure_future(downstream())
        try:
            await self._upstream(client_in, server_out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            server_out.close()
            await copying

    async def _upstream(self, client_in: asyncio.StreamReader, server_out: Any) -> None:
        typed = False
        while True:
            if typed:
                kind = await client_in.readexactly(1)
                head = await client_in.readexactly(4)
                (length,) = struct.unpack("!I", head)
                body = await client_in.readexactly(length - 4)
                if kind in (b"S", b"Q"):
                    self.round_trips += 1
                server_out.write(kind + head + body)
            else:
                head = await client_in.readexactly(4)
                (length,) = struct.unpack("!I", head)
                body = await client_in.readexactly(length - 4)
                (code,) = struct.unpack("!I", body[:4])
                typed = code not in _ENCRYPTION_REQUESTS
                server_out.write(head + body)
            await server_out.drain()


@dataclass
class Contender:
    name: str
    version: str
    store: str
    build: Callable[[str], Any] | None  # dsn -> (app, async set-up, async tear-down)
    error: str = ""
    new: list[float] = field(default_factory=list)
    replay: list[float] = field(default_factory=list)
    new_cpu: list[float] = field(default_factory=list)
    replay_cpu: list[float] = field(default_factory=list)
    new_trips: float = float("nan")
    replay_trips: float = float("nan")


class Built:
    """A contender's app on one server, and how to set up and tear down its store."""

    def __init__(self, app: ASGIApp, setup: Any, teardown: Any) -> None:
        self.app = app
        self.setup = setup
        self.teardown = teardown


def _ours(dsn: str) -> Built:
    from idempotency_middleware.stores.postgres import PostgresStore

    store = PostgresStore(dsn, table=f"bench_ours_{uuid.uuid4().hex[:8]}")
    app = order_app([Middleware(IdempotencyMiddleware, store=store)])
    return Built(app, store.acreate_table, store.aclose)


def _contenders() -> list[Contender]:
    ours = Contender(
        "idempotency-middleware (ours)",
        importlib.metadata.version("idempotency-middleware"),
        "PostgresStore (psycopg 3, one statement per claim)",
        _ours,
    )
    fast = load(
        "fastidempotent",
        {
            "middleware": ("fastidempotent", "IdempotencyMiddleware"),
            "backend": ("fastidempotent.backends.postgres", "PostgresBackend"),
        },
    )

    def _fast(dsn: str) -> Built:
        url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
        backend = fast.attributes["backend"](
            url=url, table_name=f"bench_fast_{uuid.uuid4().hex[:8]}"
        )
        app = order_app([Middleware(fast.attributes["middleware"], backend=backend)])
        return Built(app, backend.init, backend.close)

    peer = Contender(
        "fastidempotent",
        fast.version,
        "PostgresBackend (SQLAlchemy async + asyncpg)",
        _fast if fast.available else None,
        fast.error,
    )
    return [ours, peer]


async def _batch(app: ASGIApp, keys: Sequence[bytes], expected: int) -> tuple[float, float]:
    """Mean wall and CPU seconds per request over ``keys``."""
    gc.collect()
    wrong = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for key in keys:
        exchange = Exchange()
        await app(http_scope(order_headers(key)), exchange.receive, exchange.send)
        wrong += exchange.status != expected
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    if wrong:
        raise RuntimeError(f"{wrong} of {len(keys)} responses were not {expected}")
    return elapsed / len(keys), cpu / len(keys)


async def _replay_batch(app: ASGIApp, requests: int) -> tuple[float, float]:
    key = f"replay-{uuid.uuid4().hex}".encode()
    first = await call_once(app, key)
    if first.status != 201:
        raise RuntimeError(f"the first request got {first.status}")
    return await _batch(app, [key] * requests, 201)


def _new_keys(requests: int) -> list[bytes]:
    return [f"new-{uuid.uuid4().hex}".encode() for _ in range(requests)]


async def _count_round_trips(contender: Contender, relay_dsn: str, counter: Any) -> None:
    """Round trips per request on the relay: new keys, then replays (after a warm-up)."""
    assert contender.build is not None
    built = contender.build(relay_dsn)
    await built.setup()
    try:
        # Connections made, statements prepared (psycopg prepares on a statement's 5th use:
        # one extra round trip, once per connection and statement).
        await _batch(built.app, _new_keys(10), 201)
        requests = 20
        before = counter.round_trips
        await _batch(built.app, _new_keys(requests), 201)
        contender.new_trips = (counter.round_trips - before) / requests
        key = f"trips-{uuid.uuid4().hex}".encode()
        await call_once(built.app, key)
        before = counter.round_trips
        await _batch(built.app, [key] * requests, 201)
        contender.replay_trips = (counter.round_trips - before) / requests
    finally:
        await built.teardown()


async def _run(dsn: str, rounds: int, requests: int) -> str:
    contenders = _contenders()
    built: dict[str, Built] = {}
    for contender in contenders:
        if contender.build is None:
            continue
        try:
            built[contender.name] = contender.build(dsn)
            await built[contender.name].setup()
        except Exception as error:  # a peer that cannot run says why in its row
            contender.error = f"failed: {error!r}"
    jobs = [(mode, c) for c in contenders for mode in ("new", "replay")]
    for round_number in range(rounds + 1):  # round 0: a discarded warm-up
        shift = round_number % len(jobs)
        for mode, contender in jobs[shift:] + jobs[:shift]:
            if contender.error or contender.name not in built:
                continue
            app = built[contender.name].app
            try:
                if mode == "new":
                    wall, cpu = await _batch(app, _new_keys(requests), 201)
                else:
                    wall, cpu = await _replay_batch(app, requests)
            except Exception as error:
                contender.error = f"failed: {error!r}"
                continue
            if round_number:
                (contender.new if mode == "new" else contender.replay).append(wall)
                (contender.new_cpu if mode == "new" else contender.replay_cpu).append(cpu)
    for each in built.values():
        await each.teardown()
    port = int(dsn.rsplit(":", 1)[1].split("/")[0])
    with RoundTripCounter(port) as counter:
        relay_dsn = dsn.replace(f":{port}/", f":{counter.port}/")
        for contender in contenders:
            if contender.build is not None and not contender.error:
                try:
                    await _count_round_trips(contender, relay_dsn, counter)
                except Exception as error:
                    contender.error = f"round trips failed: {error!r}"
    return _report(contenders, rounds, requests)


def _report(contenders: list[Contender], rounds: int, requests: int) -> str:
    headers = [
        "contender",
        "version",
        "store",
        "new key (µs)",
        "new key CPU (µs)",
        "new key round trips",
        "replay (µs)",
        "replay CPU (µs)",
        "replay round trips",
    ]
    rows = []
    for c in contenders:
        if c.error or c.build is None or not c.new:
            reason = c.error or "not run"
            rows.append([c.name, c.version, c.store, *(["n/a"] * 5), reason])
            continue
        rows.append(
            [
                c.name,
                c.version,
                c.store,
                us(median(c.new)),
                us(median(c.new_cpu)),
                f"{c.new_trips:.2f}",
                us(median(c.replay)),
                us(median(c.replay_cpu)),
                f"{c.replay_trips:.2f}",
            ]
        )
    title = (
        f"PostgreSQL stores, per request (median of {rounds} rounds x {requests} requests; "
        "round trips counted on the wire)"
    )
    return table(title, headers, rows)


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    if dsn is not None:
        yield dsn
        return
    from tests.support.db_servers import run_postgres

    with run_postgres() as started:
        yield started


def run(rounds: int = 15, requests: int = 200, dsn: str | None = None) -> str:
    """Run the comparison; the Markdown table."""
    with _server(dsn) as where:
        return asyncio.run(_run(where, rounds, requests))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--dsn", help="an existing server (default: start one)")
    parser.add_argument("--quick", action="store_true", help="2 rounds x 20 requests")
    arguments = parser.parse_args(argv)
    rounds, requests = (2, 20) if arguments.quick else (arguments.rounds, arguments.requests)
    heading("PostgreSQL: ours next to fastidempotent's PostgreSQL backend")
    print(machine_summary())
    print()
    print(run(rounds, requests, arguments.dsn), flush=True)


if __name__ == "__main__":
    main()
