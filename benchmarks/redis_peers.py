"""Ours on Redis next to every peer's Redis backend, on ONE Redis server, in one run.

HTTP: ``IdempotencyMiddleware`` + ``RedisStore`` against fastapi-idempotency-key,
fastidempotent and asgi-idempotency-header, each with its Redis backend, around the same
Starlette app, and AWS Powertools' ``idempotent_function`` on its
``RedisCachePersistenceLayer`` in a sync FastAPI route (as in the DynamoDB table), driven in
process over the raw ASGI interface (benchmarks/_common.py).
Functions: ``idempotent`` on ``RedisStore`` against AWS Powertools' ``idempotent_function``
on its Redis ``CachePersistenceLayer``, on the same SQS-style message (benchmarks/functions.py).

For each contender and case (a new key; a replay of a completed key): wall time and CPU time
(this process's: the client side) per request, each the median over interleaved rounds of
the round's mean, the order of the contenders rotating from round to round; then, in a
separate untimed pass under MONITOR, the round trips per request (commands the client sent)
and the commands the server ran per request (those inside Lua scripts included).

    python -m benchmarks.redis_peers [--rounds 7] [--requests 300] [--redis-url URL] [--quick]

Without ``--redis-url`` it starts its own redis-server on 127.0.0.1 (tests/support/db_servers.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.middleware import Middleware

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
from benchmarks.functions import LambdaContextStub, message_id, output_for, sqs_message
from idempotency_middleware import IdempotencyMiddleware, RedisStore, idempotent

NEW = "new key"
REPLAY = "replay"
CASES = (NEW, REPLAY)
COUNTED_REQUESTS = 10  # per contender and case, in the MONITOR pass
TTL_SECONDS = 86400

# One request: HTTP (the key) or a function call (the message id); awaitable either way.
# It answers "" when the request got what it should, else what it got instead.
Call = Callable[[str], Awaitable[str]]


@dataclass
class Contender:
    """One row pair (new key, replay): how to build it, and what it measured."""

    name: str
    distribution: str
    how: str  # what it sends to Redis, in words
    build: Callable[[str], Awaitable[Call]] | None  # redis URL -> a request maker
    error: str = ""  # why it has no rows at all
    version: str = "-"
    case_errors: dict[str, str] = field(default_factory=dict)  # why one row is missing
    call: Call | None = None
    replay_key: str = ""
    wall: dict[str, list[float]] = field(default_factory=lambda: {NEW: [], REPLAY: []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {NEW: [], REPLAY: []})
    trips: dict[str, float] = field(default_factory=dict)
    server_commands: dict[str, float] = field(default_factory=dict)


# --- requests ----------------------------------------------------------------------------


def http_call(app: Any) -> Call:
    """A request to ``app`` with an Idempotency-Key, which should answer 201."""

    async def call(key: str) -> str:
        exchange = Exchange()
        await app(http_scope(order_headers(key.encode())), exchange.receive, exchange.send)
        return "" if exchange.status == 201 else f"answered {exchange.status}"

    return call


def function_call(function: Callable[..., Any]) -> Call:
    """A call of a decorated sync function with an SQS message, which should return the
    message's output."""

    async def call(key: str) -> str:
        message = sqs_message(key)
        try:
            result = function(message=message)
        except Exception as error:
            return f"raised {type(error).__name__}: {error}"
        return "" if result == output_for(message) else f"returned {result!r}"

    return call


# --- the contenders ----------------------------------------------------------------------


async def _ours_http(url: str) -> Call:
    store = RedisStore(url, prefix=f"bench-ours-{uuid.uuid4().hex[:8]}:")
    await store.awarm_up()
    return http_call(order_app([Middleware(IdempotencyMiddleware, store=store)]))


async def _ours_function(url: str) -> Call:
    store = RedisStore(url, prefix=f"bench-ours-fn-{uuid.uuid4().hex[:8]}:")
    store.warm_up()

    def handle(message: dict[str, Any]) -> dict[str, Any]:
        HandlerRuns.count += 1
        return output_for(message)

    return function_call(idempotent(store=store, key=message_id, ttl_seconds=TTL_SECONDS)(handle))


def _peer(
    name: str, distribution: str, how: str, names: dict[str, tuple[str, str]], make: Any
) -> Contender:
    loaded = load(distribution, names)
    contender = Contender(name, distribution, how, None, loaded.error, loaded.version)
    if loaded.available:

        async def build(url: str) -> Call:
            call: Call = await make(loaded.attributes, url)
            return call

        contender.build = build
    return contender


async def _fastapi_idempotency_key(found: dict[str, Any], url: str) -> Call:
    backend = found["backend"](redis_url=url, prefix=f"bench-fik-{uuid.uuid4().hex[:8]}:")
    return http_call(order_app([Middleware(found["middleware"], backend=backend)]))


async def _fastidempotent(found: dict[str, Any], url: str) -> Call:
    backend = found["backend"](url=url, key_prefix=f"bench-fi-{uuid.uuid4().hex[:8]}:")
    await backend.init()  # connects (its README's start-up step)
    return http_call(order_app([Middleware(found["middleware"], backend=backend)]))


async def _asgi_idempotency_header(found: dict[str, Any], url: str) -> Call:
    import redis.asyncio

    suffix = uuid.uuid4().hex[:8]
    backend = found["backend"](
        redis=redis.asyncio.from_url(url),
        keys_key=f"bench-aih-keys-{suffix}",
        response_key=f"bench-aih-{suffix}:",
    )
    return http_call(order_app([Middleware(found["middleware"], backend=backend)]))


async def _powertools(found: dict[str, Any], url: str) -> Call:
    layer, config = _powertools_layer(found, url, "messageId")

    def handle_powertools(message: dict[str, Any]) -> dict[str, Any]:
        HandlerRuns.count += 1
        return output_for(message)

    handle_powertools.__qualname__ = f"handle_powertools_{uuid.uuid4().hex[:8]}"
    decorated = found["decorator"](
        handle_powertools, data_keyword_argument="message", persistence_store=layer, config=config
    )
    return function_call(decorated)


def _powertools_layer(found: dict[str, Any], url: str, key_path: str) -> tuple[Any, Any]:
    """Powertools' Redis layer (``RedisCachePersistenceLayer``, which it also exports as
    ``CachePersistenceLayer``) and its config, keyed by ``key_path`` of the payload."""
    import redis

    with warnings.catch_warnings():  # its class warns that a rename is coming in v4
        warnings.simplefilter("ignore", DeprecationWarning)
        layer = found["layer"](client=redis.Redis.from_url(url))
    config = found["config"](
        event_key_jmespath=key_path,
        # No payload_validation_jmespath: on this layer every replay would then fail (its
        # completion rewrites the record without the payload hash). Ours checks it.
        raise_on_no_idempotency_key=True,
        expires_after_seconds=TTL_SECONDS,
    )
    config.register_lambda_context(LambdaContextStub())
    return layer, config


async def _powertools_http(found: dict[str, Any], url: str) -> Call:
    """As in the DynamoDB table (benchmarks/dynamodb_requests.py): a sync FastAPI route (it
    has no async support) calls an ``idempotent_function`` with the order and the key."""
    from fastapi import Body, FastAPI, Header

    layer, config = _powertools_layer(found, url, "key")

    def handle(order: dict[str, Any]) -> dict[str, Any]:
        HandlerRuns.count += 1
        return {"id": HandlerRuns.count, "amount": order["amount"], "status": "accepted"}

    handle.__qualname__ = f"handle_powertools_http_{uuid.uuid4().hex[:8]}"
    decorated = found["decorator"](
        handle, data_keyword_argument="order", persistence_store=layer, config=config
    )
    app = FastAPI()

    @app.post("/orders", status_code=201)
    def create_order(
        order: dict[str, Any] = Body(),  # noqa: B008
        idempotency_key: str = Header(),
    ) -> dict[str, Any]:
        result: dict[str, Any] = decorated(order={"key": idempotency_key, **order})
        return result

    return http_call(app)


_POWERTOOLS = "aws_lambda_powertools.utilities.idempotency"
_POWERTOOLS_NAMES = {
    "layer": (f"{_POWERTOOLS}.persistence.redis", "RedisCachePersistenceLayer"),
    "config": (_POWERTOOLS, "IdempotencyConfig"),
    "decorator": (_POWERTOOLS, "idempotent_function"),
}


def http_contenders() -> list[Contender]:
    """Ours, the three ASGI peers with their Redis backends, and Powertools' Redis layer in a
    FastAPI route."""
    ours = Contender(
        "idempotency-middleware (ours), RedisStore",
        "idempotency-middleware",
        "1 EVALSHA claim (holder returned in it); 1 EVALSHA complete fenced by owner",
        _ours_http,
        version=importlib.metadata.version("idempotency-middleware"),
    )
    return [
        ours,
        _peer(
            "fastapi-idempotency-key, RedisBackend",
            "fastapi-idempotency-key",
            "EVAL (whole script sent each time) GET-or-SET; unfenced SET to complete",
            {
                "middleware": ("fastapi_idempotency_key", "IdempotencyMiddleware"),
                "backend": ("fastapi_idempotency_key", "RedisBackend"),
            },
            _fastapi_idempotency_key,
        ),
        _peer(
            "fastidempotent, RedisBackend",
            "fastidempotent",
            "GET record, SET NX lock key; SET record + DEL lock (two keys: not cluster-safe)",
            {
                "middleware": ("fastidempotent", "IdempotencyMiddleware"),
                "backend": ("fastidempotent.backends.redis", "RedisBackend"),
            },
            _fastidempotent,
        ),
        _peer(
            "asgi-idempotency-header, RedisBackend",
            "asgi-idempotency-header",
            "GET; SADD to one global set (never expires); SET, SET, EXPIRE, EXPIRE",
            {
                "middleware": ("idempotency_header_middleware", "IdempotencyHeaderMiddleware"),
                "backend": ("idempotency_header_middleware.backends.redis", "RedisBackend"),
            },
            _asgi_idempotency_header,
        ),
        _peer(
            "Powertools idempotent_function in a sync FastAPI route, RedisCachePersistenceLayer",
            "aws-lambda-powertools",
            "SET NX, then GET when held; unfenced SET to complete; payload not checked",
            _POWERTOOLS_NAMES,
            _powertools_http,
        ),
    ]


def function_contenders() -> list[Contender]:
    """Our ``idempotent`` and Powertools' ``idempotent_function``, both sync, on Redis."""
    return [
        Contender(
            "idempotent (ours), RedisStore",
            "idempotency-middleware",
            "1 EVALSHA claim (holder returned in it); 1 EVALSHA complete fenced by owner",
            _ours_function,
            version=importlib.metadata.version("idempotency-middleware"),
        ),
        _peer(
            "Powertools idempotent_function, RedisCachePersistenceLayer",
            "aws-lambda-powertools",
            "SET NX, then GET when held; unfenced SET to complete; payload not checked",
            _POWERTOOLS_NAMES,
            _powertools,
        ),
    ]


# --- measuring ---------------------------------------------------------------------------


async def _prepare(contender: Contender, url: str) -> None:
    """Build the contender and complete the key its replays will repeat."""
    assert contender.build is not None
    contender.call = await contender.build(url)
    contender.replay_key = f"replay-{uuid.uuid4().hex}"
    before = HandlerRuns.count
    first = await contender.call(contender.replay_key)
    if first:
        raise RuntimeError(f"its first request {first}")
    second = await contender.call(contender.replay_key)
    if second or HandlerRuns.count != before + 1:
        contender.case_errors[REPLAY] = (
            f"broken: a retry of a completed key {second or 'ran again'}"
        )


def _keys(contender: Contender, case: str, requests: int) -> list[str]:
    if case == REPLAY:
        return [contender.replay_key] * requests
    return [f"new-{uuid.uuid4().hex}" for _ in range(requests)]


async def _batch(contender: Contender, case: str, keys: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds per request over ``keys``; checks every answer and run count."""
    assert contender.call is not None
    return await checked_batch(contender.call, keys, case == NEW)


@contextlib.contextmanager
def _redis_url(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests.support.db_servers import run_redis

    with run_redis() as started:
        yield started


def _server_commands(admin: Any) -> int:
    stats = admin.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


async def _count(contenders: Sequence[Contender], url: str) -> None:
    """The untimed pass: round trips (MONITOR) and server commands (INFO commandstats)."""
    import redis

    from tests.support.redis_helpers import CommandLog

    admin = redis.Redis.from_url(url)
    _server_commands(admin)  # connects before the log starts (its handshake is not counted)
    with CommandLog(url) as log:
        for contender in contenders:
            if contender.call is None or contender.error:
                continue
            for case in CASES:
                if case in contender.case_errors:
                    continue
                keys = _keys(contender, case, COUNTED_REQUESTS)
                log.take()
                before = _server_commands(admin)
                for key in keys:
                    await contender.call(key)
                # (The MONITOR marker's own ECHO is left out of both figures.)
                server = _server_commands(admin) - before
                # (Neither the scripts' commands nor this pass's own INFO.)
                sent = [c for c in log.take() if c.source != "lua" and c.words[0].lower() != "info"]
                contender.trips[case] = len(sent) / len(keys)
                contender.server_commands[case] = server / len(keys)
    admin.close()


async def _measure(contenders: list[Contender], url: str, rounds: int, requests: int) -> None:
    for contender in contenders:
        if contender.build is None or contender.error:
            continue
        try:
            await _prepare(contender, url)
        except Exception as error:  # a broken peer is reported in its row, the others go on
            contender.error = f"failed: {error!r}"
    jobs = [
        (c, case)
        for c in contenders
        if c.call is not None and not c.error
        for case in CASES
        if case not in c.case_errors
    ]
    for round_number in range(rounds + 1):  # the first round warms up and is discarded
        shift = round_number % len(jobs) if jobs else 0
        for contender, case in jobs[shift:] + jobs[:shift]:
            if contender.error:
                continue
            try:
                wall, cpu = await _batch(contender, case, _keys(contender, case, requests))
            except Exception as error:
                contender.error = f"failed: {error!r}"
                continue
            if round_number:
                contender.wall[case].append(wall)
                contender.cpu[case].append(cpu)
    await _count(contenders, url)


def _rows(contenders: Sequence[Contender]) -> list[list[str]]:
    rows = []
    for contender in contenders:
        for case in CASES:
            if contender.error or not contender.wall[case]:
                reason = contender.error or contender.case_errors.get(case, "n/a")
                rows.append([contender.name, contender.version, case, reason, "", "", "", ""])
                continue
            rows.append(
                [
                    contender.name,
                    contender.version,
                    case,
                    us(median(contender.wall[case])),
                    us(median(contender.cpu[case])),
                    f"{contender.trips.get(case, float('nan')):.1f}",
                    f"{contender.server_commands.get(case, float('nan')):.1f}",
                    contender.how,
                ]
            )
    return rows


HEADERS = [
    "contender",
    "version",
    "case",
    "wall us/req",
    "CPU us/req",
    "round trips/req",
    "server cmds/req",
    "what it sends",
]


async def _run(url: str, rounds: int, requests: int) -> str:
    http, functions = http_contenders(), function_contenders()
    await _measure(http, url, rounds, requests)
    await _measure(functions, url, rounds, requests)
    notes = (
        f"{rounds} interleaved rounds (+1 warm-up) x {requests} requests per contender and "
        f"case, one Redis server ({url.rsplit('@', 1)[-1]}); wall and CPU: medians of round "
        "means, CPU of this (client) process only. Round trips: commands the client sent "
        f"(MONITOR, {COUNTED_REQUESTS} untimed requests); server cmds: commands Redis ran, "
        "those inside Lua scripts included (INFO commandstats)."
    )
    known = (
        "Known peer defects seen here: fastapi-idempotency-key's RedisBackend completes a key "
        "with an empty fingerprint, so every retry of a completed key answers 422 instead of "
        "the replay; Powertools' Redis layer drops the payload hash when it completes, so with "
        "payload_validation_jmespath every replay raises IdempotencyValidationError (its row "
        "runs without payload validation; ours validates the payload in every row)."
    )
    return "\n".join(
        [
            table(
                "HTTP: ASGI middlewares, and Powertools in a FastAPI route, on Redis (in process, "
                "raw ASGI)",
                HEADERS,
                _rows(http),
            ),
            "",
            table("Functions: idempotent decorators on Redis (sync)", HEADERS, _rows(functions)),
            "",
            notes,
            known,
        ]
    )


def run(url: str | None = None, rounds: int = 7, requests: int = 300) -> str:
    """Measure every contender on the Redis at ``url`` (or one started here); the tables."""
    with _redis_url(url) as where:
        return asyncio.run(_run(where, rounds, requests))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--redis-url", default=None, help="an existing server (default: start one)")
    parser.add_argument("--quick", action="store_true", help="1 round of 5 requests (a smoke run)")
    args = parser.parse_args(argv)
    rounds, requests = (1, 5) if args.quick else (args.rounds, args.requests)
    heading("Redis: ours next to the peers' Redis backends, on one server")
    print(run(args.redis_url, rounds, requests), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
