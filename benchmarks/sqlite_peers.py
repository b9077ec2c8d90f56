"""Ours on SQLite next to the peers' SQLite backends, each on a file of its own, in one run.

HTTP: ``IdempotencyMiddleware`` + ``SQLiteStore`` against fastapi-idempotency-key's
``SQLiteBackend`` (aiosqlite) and fastidempotent's ``SQLiteBackend`` (SQLAlchemy's asyncio
engine on aiosqlite), around the same Starlette app (benchmarks/_apps.py), driven in process
over the raw ASGI interface (benchmarks/_common.py); each contender on a database file of its
own, all in one directory (a temporary one unless ``--dir``), each set up as its README says.

For each contender and case (a new key; a replay of a completed key): wall time and CPU time
(this process's, every thread: the middleware, the driver's threads and SQLite itself) per
request, each the median over interleaved rounds of the round's mean, the order of the
contenders rotating from round to round. Every answer is checked: a new key answers 201 and
runs the handler once; a replay answers the first response's status and body without running
the handler. A contender that answers wrongly has that row marked and left out.

Then, in a separate untimed pass on fresh instances, statements per request: every statement
SQLite ran for the request, transaction control (BEGIN, COMMIT) included, seen by a
``sqlite3`` trace callback set on each connection the contenders open (all three use the
standard library's ``sqlite3`` underneath, aiosqlite in a thread of its own).

    python -m benchmarks.sqlite_peers [--rounds 7] [--requests 300] [--dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import itertools
import os
import sqlite3
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message

from benchmarks._apps import HandlerRuns, checked_batch, order_app
from benchmarks._common import (
    Exchange,
    heading,
    http_scope,
    load,
    machine_summary,
    median,
    order_headers,
    table,
    us,
)
from idempotency_middleware import IdempotencyMiddleware, SQLiteStore

NEW = "new key"
REPLAY = "replay"
CASES = (NEW, REPLAY)
COUNTED_REQUESTS = 20  # per contender and case, in the statement-counting pass
WARM_UP_REQUESTS = 5  # before counting: connections opened, schema made, first purge done
# The peer whose CPU per request we track ours against, and ours' targets (at most this many
# times its CPU) for each case.
TARGET_PEER = "fastapi-idempotency-key"
TARGETS = {NEW: 0.4, REPLAY: 1.0}


@dataclass
class Built:
    """A contender's app on one database file, and how to close its store."""

    app: ASGIApp
    close: Callable[[], Awaitable[None]]


# A database file path -> the contender's app on it, set up.
Build = Callable[[str], Awaitable[Built]]


@dataclass
class Running:
    """A built contender with a completed key for its replays."""

    built: Built
    replay_key: bytes
    replay_body: bytes
    replay_problem: str  # "" when the first retry of the completed key answered right


@dataclass
class Contender:
    """One row pair (new key, replay): how to build it, and what it measured."""

    name: str
    version: str
    store: str  # how it keeps its records, in words
    build: Build | None
    error: str = ""  # why it has no figures at all
    case_errors: dict[str, str] = field(default_factory=dict)  # why one row has none
    running: Running | None = None
    wall: dict[str, list[float]] = field(default_factory=lambda: {NEW: [], REPLAY: []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {NEW: [], REPLAY: []})
    statements: dict[str, float] = field(default_factory=dict)
    one_request: dict[str, str] = field(default_factory=dict)  # the statements, in words


# --- requests ----------------------------------------------------------------------------


class Answer(Exchange):
    """An exchange that also keeps the response body (a replay must repeat it)."""

    __slots__ = ("body",)

    def __init__(self) -> None:
        super().__init__()
        self.body = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.body += message.get("body", b"")
        await super().send(message)


async def request(app: ASGIApp, key: bytes) -> Answer:
    answer = Answer()
    await app(http_scope(order_headers(key)), answer.receive, answer.send)
    return answer


# --- the contenders ----------------------------------------------------------------------


async def _ours(path: str) -> Built:
    store = SQLiteStore(path)
    await store.acreate_table()
    app = order_app([Middleware(IdempotencyMiddleware, store=store)])
    return Built(app, store.aclose)


async def _ours_threads(path: str) -> Built:
    # What every call cost before it ran inline: the hand-off to a thread and back.
    store = SQLiteStore(path, async_inline=False)
    await store.acreate_table()
    app = order_app([Middleware(IdempotencyMiddleware, store=store)])
    return Built(app, store.aclose)


async def _ours_full(path: str) -> Built:
    # The peers' durability: an fsync per commit, so every call goes to the store's threads.
    store = SQLiteStore(path, synchronous="FULL")
    await store.acreate_table()
    app = order_app([Middleware(IdempotencyMiddleware, store=store)])
    return Built(app, store.aclose)


def _peer(
    name: str, distribution: str, store: str, names: dict[str, tuple[str, str]], make: Any
) -> Contender:
    loaded = load(distribution, names)
    contender = Contender(name, loaded.version, store, None, loaded.error)
    if loaded.available:

        async def build(path: str) -> Built:
            built: Built = await make(loaded.attributes, path)
            return built

        contender.build = build
    return contender


async def _fastapi_idempotency_key(found: dict[str, Any], path: str) -> Built:
    # It connects on first use: the journal mode (WAL) and its table are set up then.
    backend = found["backend"](path)
    app = order_app([Middleware(found["middleware"], backend=backend)])
    return Built(app, backend.close)


async def _fastidempotent(found: dict[str, Any], path: str) -> Built:
    backend = found["backend"](url=f"sqlite+aiosqlite:///{path}")
    await backend.init()  # creates its table (its README's start-up step)
    app = order_app([Middleware(found["middleware"], backend=backend)])
    return Built(app, backend.close)


def contenders() -> list[Contender]:
    """Ours, then the two ASGI peers with their SQLite backends."""
    ours = Contender(
        "idempotency-middleware (ours)",
        importlib.metadata.version("idempotency-middleware"),
        "SQLiteStore: sqlite3 inline on the loop (a thread when locked), WAL, "
        "synchronous=NORMAL; one upsert per claim",
        _ours,
    )
    ours_threads = Contender(
        "ours, async_inline=False",
        ours.version,
        "SQLiteStore(async_inline=False): every call on the store's threads, WAL, NORMAL",
        _ours_threads,
    )
    ours_full = Contender(
        "ours, synchronous=FULL",
        ours.version,
        "SQLiteStore(synchronous='FULL'): the peers' durability; sqlite3 on the store's threads",
        _ours_full,
    )
    # (The peers' modules import aiosqlite when loaded: without it they say so in their rows.)
    return [
        ours,
        ours_threads,
        ours_full,
        _peer(
            "fastapi-idempotency-key",
            "fastapi-idempotency-key",
            "SQLiteBackend: aiosqlite, one connection, WAL, synchronous=FULL (SQLite's default)",
            {
                "middleware": ("fastapi_idempotency_key", "IdempotencyMiddleware"),
                "backend": ("fastapi_idempotency_key.backends.sqlite", "SQLiteBackend"),
                "aiosqlite": ("aiosqlite", "connect"),
            },
            _fastapi_idempotency_key,
        ),
        _peer(
            "fastidempotent",
            "fastidempotent",
            "SQLiteBackend: SQLAlchemy async + aiosqlite, rollback journal, synchronous=FULL",
            {
                "middleware": ("fastidempotent", "IdempotencyMiddleware"),
                "backend": ("fastidempotent.backends.sqlite", "SQLiteBackend"),
                "aiosqlite": ("aiosqlite", "connect"),
            },
            _fastidempotent,
        ),
    ]


# --- measuring ---------------------------------------------------------------------------


_files = itertools.count(1)


def _database(directory: str, contender: Contender) -> str:
    """A new database file in ``directory`` for one build of ``contender``."""
    stem = contender.name.split()[0].replace("-", "_")
    return os.path.join(directory, f"{stem}_{next(_files)}.sqlite3")


async def _start(contender: Contender, path: str) -> Running:
    """Build the contender on ``path`` and complete the key its replays will repeat."""
    assert contender.build is not None
    built = await contender.build(path)
    key = f"replay-{uuid.uuid4().hex}".encode()
    try:
        before = HandlerRuns.count
        first = await request(built.app, key)
        if first.status != 201 or HandlerRuns.count != before + 1:
            raise RuntimeError(f"its first request answered {first.status}")
        second = await request(built.app, key)
        problem = ""
        if HandlerRuns.count != before + 1:
            problem = "ran the handler again"
        elif second.status != first.status:
            problem = f"answered {second.status}, not {first.status}"
        elif second.body != first.body:
            problem = "answered another body"
    except BaseException:
        await built.close()
        raise
    broken = f"broken: a retry of a completed key {problem}" if problem else ""
    return Running(built, key, first.body, broken)


def _keys(running: Running, case: str, requests: int) -> list[bytes]:
    if case == REPLAY:
        return [running.replay_key] * requests
    return [f"new-{uuid.uuid4().hex}".encode() for _ in range(requests)]


async def _batch(
    running: Running, case: str, keys: Sequence[bytes], collect: bool = True
) -> tuple[float, float]:
    """Wall and CPU seconds per request over ``keys``; checks every answer and run count.
    ``collect``: start from a full garbage collection (timed batches; counting needs none)."""
    app = running.built.app
    body = running.replay_body if case == REPLAY else None

    async def wrong(key: bytes) -> bool:
        answer = Answer()
        await app(http_scope(order_headers(key)), answer.receive, answer.send)
        return answer.status != 201 or (body is not None and answer.body != body)

    return await checked_batch(wrong, keys, case == NEW, collect=collect)


@contextlib.contextmanager
def traced_connections(log: list[str]) -> Iterator[None]:
    """Every ``sqlite3`` connection opened inside the block appends the statements it runs to
    ``log`` (the trace callback is set in the thread that opens it, as sqlite3 requires)."""
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection: sqlite3.Connection = connect(*args, **kwargs)
        connection.set_trace_callback(log.append)
        return connection

    with mock.patch.object(sqlite3, "connect", traced):
        yield


def in_words(statements: Sequence[str]) -> str:
    """``BEGIN IMMEDIATE, INSERT, COMMIT`` for those statements."""
    words = []
    for statement in statements:
        tokens = statement.split()
        verb = tokens[0].upper() if tokens else "?"
        if verb == "BEGIN" and len(tokens) > 1 and tokens[1].upper() != "TRANSACTION":
            verb += " " + tokens[1].upper()
        words.append(verb)
    return ", ".join(words)


async def _count(contender: Contender, directory: str) -> None:
    """Statements per request, on a fresh instance whose connections are all traced."""
    log: list[str] = []
    with traced_connections(log):
        running = await _start(contender, _database(directory, contender))
        try:
            for case in CASES:
                if case in contender.case_errors or (case == REPLAY and running.replay_problem):
                    continue
                await _batch(running, case, _keys(running, case, WARM_UP_REQUESTS), collect=False)
                before = len(log)
                await _batch(running, case, _keys(running, case, COUNTED_REQUESTS), collect=False)
                contender.statements[case] = (len(log) - before) / COUNTED_REQUESTS
                before = len(log)
                await _batch(running, case, _keys(running, case, 1), collect=False)
                contender.one_request[case] = in_words(log[before:])
        finally:
            await running.built.close()


async def _measure(
    contenders: Sequence[Contender], directory: str, rounds: int, requests: int
) -> None:
    for contender in contenders:
        if contender.build is None or contender.error:
            continue
        try:
            contender.running = await _start(contender, _database(directory, contender))
        except Exception as error:  # a broken peer is reported in its rows, the others go on
            contender.error = f"failed: {error!r}"
            continue
        if contender.running.replay_problem:
            contender.case_errors[REPLAY] = contender.running.replay_problem
    jobs = [
        (c, case)
        for c in contenders
        if c.running is not None
        for case in CASES
        if case not in c.case_errors
    ]
    for round_number in range(rounds + 1):  # the first round warms up and is discarded
        shift = round_number % len(jobs) if jobs else 0
        for contender, case in jobs[shift:] + jobs[:shift]:
            if contender.running is None or case in contender.case_errors:
                continue
            keys = _keys(contender.running, case, requests)
            try:
                wall, cpu = await _batch(contender.running, case, keys)
            except Exception as error:  # wrong answers: this row is marked and left out
                contender.case_errors[case] = f"failed: {error!r}"
                continue
            if round_number:
                contender.wall[case].append(wall)
                contender.cpu[case].append(cpu)
    for contender in contenders:
        if contender.running is not None:
            await contender.running.built.close()
            contender.running = None
    for contender in contenders:
        if contender.build is None or contender.error:
            continue
        try:
            await _count(contender, directory)
        except Exception as error:
            contender.error = f"statement count failed: {error!r}"


# --- the report --------------------------------------------------------------------------


HEADERS = [
    "contender",
    "version",
    "case",
    "wall us/req",
    "CPU us/req",
    "statements/req",
    "one request's statements",
    "store",
    "note",
]


def _has_figures(contender: Contender, case: str) -> bool:
    return not contender.error and case not in contender.case_errors and bool(contender.cpu[case])


def rows(contenders: Sequence[Contender]) -> list[list[str]]:
    out = []
    for c in contenders:
        for case in CASES:
            if not _has_figures(c, case):
                reason = c.error or c.case_errors.get(case, "not run")
                out.append([c.name, c.version, case, *(["n/a"] * 4), c.store, reason])
                continue
            out.append(
                [
                    c.name,
                    c.version,
                    case,
                    us(median(c.wall[case])),
                    us(median(c.cpu[case])),
                    f"{c.statements.get(case, float('nan')):.1f}",
                    c.one_request.get(case, "n/a"),
                    c.store,
                    "",
                ]
            )
    return out


def ratios(contenders: Sequence[Contender]) -> list[str]:
    """Each of ours' CPU per request over each peer's, per case (the target peer's with
    targets)."""
    mine = [c for c in contenders if c.name.startswith(("idempotency-middleware", "ours"))]
    peers = [c for c in contenders if c not in mine]
    lines = []
    for ours in mine:
        label = "ours" if ours is mine[0] else ours.name
        for peer in peers:
            parts = []
            for case in CASES:
                if _has_figures(ours, case) and _has_figures(peer, case):
                    ratio = f"{median(ours.cpu[case]) / median(peer.cpu[case]):.2f}x"
                else:
                    ratio = "n/a"
                target = f" (target <= {TARGETS[case]:.1f}x)" if peer.name == TARGET_PEER else ""
                parts.append(f"{case} {ratio}{target}")
            lines.append(f"CPU per request, {label} / {peer.name}: {'; '.join(parts)}.")
    return lines


def report(contenders: Sequence[Contender], rounds: int, requests: int, where: str) -> str:
    notes = (
        f"{rounds} interleaved rounds (+1 warm-up) x {requests} requests per contender and "
        f"case, each contender on its own database file in {where}; wall and CPU: medians of "
        "round means, CPU of this process (all its threads). Statements: every statement "
        f"SQLite ran (sqlite3 trace callback, {COUNTED_REQUESTS} untimed requests on fresh "
        "instances), transaction control included. Durability differs: ours keeps "
        "synchronous=NORMAL (WAL: commits survive an application crash, a power loss may lose "
        "the last ones), the peers keep SQLite's default FULL (at least one fsync per commit)."
    )
    return "\n".join(
        [
            table(
                "HTTP: ASGI middlewares on SQLite (in process, raw ASGI)",
                HEADERS,
                rows(contenders),
            ),
            "",
            *ratios(contenders),
            "",
            notes,
        ]
    )


@contextlib.contextmanager
def _directory(directory: str | None) -> Iterator[str]:
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix="sqlite-peers-") as made:
        yield made


def run(rounds: int = 7, requests: int = 300, directory: str | None = None) -> str:
    """Measure every contender on database files in ``directory`` (default: a temporary
    one); the table and the CPU ratios."""
    with _directory(directory) as where:
        everyone = contenders()
        asyncio.run(_measure(everyone, where, rounds, requests))
        return report(everyone, rounds, requests, where)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--dir", default=None, help="for the database files (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="1 round of 10 requests (a smoke run)")
    args = parser.parse_args(argv)
    rounds, requests = (1, 10) if args.quick else (args.rounds, args.requests)
    heading("SQLite: ours next to the peers' SQLite backends")
    print(machine_summary())
    print()
    print(run(rounds, requests, args.dir), flush=True)


if __name__ == "__main__":
    main()
