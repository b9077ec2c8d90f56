"""Per request on Amazon's DynamoDB Local: our middleware against AWS Powertools' idempotency
utility in the same web framework, WSGI (Flask) and ASGI (FastAPI), side by side in one run.

    scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.dynamodb_requests
    python -m benchmarks.dynamodb_requests --endpoint-url http://127.0.0.1:8000 [--rounds 7]

Contenders, each serving ``POST /orders`` (the ~100-byte JSON order) with a handler that
counts its runs and answers 201 with a small JSON document:

- ours, WSGI: ``IdempotencyWSGIMiddleware`` + ``DynamoDBStore`` around the Flask app, on the
  lean transport (the default) and on boto3 (``transport="sdk"``);
- Powertools, Flask: the route calls an ``idempotent_function`` (``DynamoDBPersistenceLayer``
  on a boto3 client) with the order and the ``Idempotency-Key`` header as its key, validating
  the whole payload as ours fingerprints it;
- ours, ASGI: ``IdempotencyMiddleware`` + ``AsyncDynamoDBStore`` around the FastAPI app
  (an async route), lean and on aioboto3;
- Powertools in a sync FastAPI route (Powertools has no async support; FastAPI runs the
  route in its thread pool).

Requests are driven in process (a PEP 3333 environ; a raw ASGI call), so the figures are the
app's own cost: CPU is ``time.process_time`` of this process (the framework, the
idempotency layer and its DynamoDB client; DynamoDB Local's work is in its JVM). Cases: a new
key every request, and a replay of a key completed before the rounds. Every round runs a
batch of ``--requests`` requests per contender per case, contenders in an order that rotates
from round to round; a figure is the median over the rounds of the batch's mean per request.
A counting pass first records the DynamoDB HTTP requests each makes per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import io
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks._common import (
    BODY,
    REGION,
    Exchange,
    heading,
    http_scope,
    machine_summary,
    median,
    order_headers,
    table,
)
from benchmarks.dynamodb_floor import FloorASGI, FloorWSGI, create_floor_table
from benchmarks.functions import LambdaContextStub
from benchmarks.transport import endpoint_for
from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
)
from idempotency_middleware.stores.dynamodb import Transport

TRANSPORTS: tuple[Transport, ...] = ("lean", "sdk")
NEW = "new key"
REPLAY = "replay"
TTL_SECONDS = 86400
FLOOR_WSGI = "floor, Flask"
FLOOR_ASGI = "floor, FastAPI"


@dataclass
class Contender:
    name: str
    door: str  # "WSGI" or "ASGI"
    call: Callable[[str], Any]  # key -> awaitable of the status code
    runs: Callable[[], int]
    clients: list[Any]  # DynamoDB clients whose requests are counted
    calls: Callable[[], int] | None = None  # or its own count of DynamoDB requests (the floor)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    requests_per: dict[str, float] = field(default_factory=dict)
    replay_key: str = ""


# --- the apps --------------------------------------------------------------------------------


def _environ(key: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/orders",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }


def _wsgi_caller(app: Any) -> Callable[[str], Any]:
    async def call(key: str) -> int:
        status: list[str] = []
        result = app(_environ(key), lambda line, headers, exc_info=None: status.append(line))
        try:
            for _ in result:
                pass
        finally:
            getattr(result, "close", lambda: None)()
        return int(status[0].split(" ", 1)[0])

    return call


def _asgi_caller(app: Any) -> Callable[[str], Any]:
    async def call(key: str) -> int:
        exchange = Exchange(BODY)
        await app(http_scope(order_headers(key.encode())), exchange.receive, exchange.send)
        return exchange.status

    return call


class Runs:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def body(self, name: str, order: dict[str, Any]) -> dict[str, Any]:
        self.counts[name] += 1
        return {"id": self.counts[name], "amount": order["amount"], "status": "accepted"}


def _flask(runs: Runs, name: str, handle: Callable[..., Any] | None = None) -> Any:
    from flask import Flask, jsonify, request

    app = Flask(name)

    @app.post("/orders")
    def create_order() -> Any:
        order = request.get_json()
        if handle is None:
            return jsonify(runs.body(name, order)), 201
        key = request.headers["Idempotency-Key"]
        return jsonify(handle(order={"key": key, **order})), 201

    return app


def _fastapi(runs: Runs, name: str, handle: Callable[..., Any] | None = None) -> Any:
    from fastapi import Body, FastAPI, Header

    app = FastAPI()
    if handle is None:

        @app.post("/orders", status_code=201)
        async def create_order(order: dict[str, Any] = Body()) -> dict[str, Any]:  # noqa: B008
            return runs.body(name, order)

    else:

        @app.post("/orders", status_code=201)
        def create_order_sync(
            order: dict[str, Any] = Body(),  # noqa: B008
            idempotency_key: str = Header(),
        ) -> dict[str, Any]:
            result: dict[str, Any] = handle(order={"key": idempotency_key, **order})
            return result

    return app


def _powertools_function(runs: Runs, name: str, table_name: str, client: Any) -> Any:
    # Imported by name: a bench-only dependency (benchmarks/requirements.txt), which the
    # type checker of `make test` does not have.
    powertools: Any = importlib.import_module("aws_lambda_powertools.utilities.idempotency")
    DynamoDBPersistenceLayer = powertools.DynamoDBPersistenceLayer
    IdempotencyConfig = powertools.IdempotencyConfig
    idempotent_function = powertools.idempotent_function

    layer = DynamoDBPersistenceLayer(table_name=table_name, boto3_client=client)
    config = IdempotencyConfig(
        event_key_jmespath="key",
        payload_validation_jmespath="@",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=TTL_SECONDS,
    )
    # A stand-in Lambda context, as benchmarks.functions gives it (in-progress expiry).
    config.register_lambda_context(LambdaContextStub())

    def handle(order: dict[str, Any]) -> dict[str, Any]:
        return runs.body(name, order)

    handle.__qualname__ = handle.__name__ = f"handle_{name.replace(' ', '_').replace(',', '')}"
    return idempotent_function(
        handle, data_keyword_argument="order", persistence_store=layer, config=config
    )


# --- counting and timing ---------------------------------------------------------------------


@contextlib.contextmanager
def _counting(clients: Sequence[Any]) -> Iterator[Counter[str]]:
    seen: Counter[str] = Counter()

    def count(request: Any, **_: Any) -> None:
        seen[str(request.headers.get("X-Amz-Target", b""))] += 1

    for client in clients:
        client.meta.events.register("before-send.dynamodb", count)
    try:
        yield seen
    finally:
        for client in clients:
            client.meta.events.unregister("before-send.dynamodb", count)


async def _batch(contender: Contender, case: str, keys: list[str], timed: bool) -> None:
    before = contender.runs()
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    statuses = [await contender.call(key) for key in keys]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    ran = contender.runs() - before
    if any(status != 201 for status in statuses) or ran != (len(keys) if case == NEW else 0):
        raise RuntimeError(f"{contender.name} {case}: statuses {set(statuses)}, {ran} runs")
    if timed:
        contender.cpu.setdefault(case, []).append(cpu / len(keys))
        contender.wall.setdefault(case, []).append(wall / len(keys))


def _keys(contender: Contender, case: str, count: int) -> list[str]:
    if case == REPLAY:
        return [contender.replay_key] * count
    return [uuid.uuid4().hex for _ in range(count)]


async def _measure(contenders: list[Contender], rounds: int, requests: int) -> None:
    for contender in contenders:
        contender.replay_key = uuid.uuid4().hex
        await contender.call(contender.replay_key)
        for case in (NEW, REPLAY):
            calls = contender.calls() if contender.calls else 0
            with _counting(contender.clients) as seen:
                await _batch(contender, case, _keys(contender, case, 3), timed=False)
            if contender.calls:
                seen["floor"] = contender.calls() - calls
            contender.requests_per[case] = sum(seen.values()) / 3
    for round_index in range(-1, rounds):
        shift = max(round_index, 0) % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            for case in (NEW, REPLAY):
                keys = _keys(contender, case, requests)
                await _batch(contender, case, keys, timed=round_index >= 0)


async def _run(endpoint: str, tables: tuple[str, str, str], rounds: int, n: int) -> list[Contender]:
    import boto3

    ours_table, powertools_table, floor_name = tables
    runs = Runs()
    contenders: list[Contender] = []
    with contextlib.ExitStack() as stack:
        for transport in TRANSPORTS:
            name = f"ours WSGI ({transport})"
            store = stack.enter_context(
                DynamoDBStore(
                    ours_table, endpoint_url=endpoint, region_name=REGION, transport=transport
                )
            )
            app = IdempotencyWSGIMiddleware(_flask(runs, name), store=store)
            stack.callback(app.close)
            contenders.append(
                Contender(name, "WSGI", _wsgi_caller(app), _runs(runs, name), [store.client])
            )
        name = FLOOR_WSGI
        floor = FloorWSGI(_flask(runs, name), endpoint, REGION, floor_name)
        stack.callback(floor.close)
        contenders.append(
            Contender(name, "WSGI", _wsgi_caller(floor), _runs(runs, name), [], _floor_calls(floor))
        )
        client = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)
        name = "Powertools, Flask"
        handle = _powertools_function(runs, name, powertools_table, client)
        contenders.append(
            Contender(
                name, "WSGI", _wsgi_caller(_flask(runs, name, handle)), _runs(runs, name), [client]
            )
        )
        async with contextlib.AsyncExitStack() as astack:
            for transport in TRANSPORTS:
                name = f"ours ASGI ({transport})"
                astore = await astack.enter_async_context(
                    AsyncDynamoDBStore(
                        ours_table, endpoint_url=endpoint, region_name=REGION, transport=transport
                    )
                )
                asgi_app = IdempotencyMiddleware(_fastapi(runs, name), store=astore)
                contenders.append(
                    Contender(
                        name,
                        "ASGI",
                        _asgi_caller(asgi_app),
                        _runs(runs, name),
                        [await astore.client()],
                    )
                )
            name = FLOOR_ASGI
            afloor = FloorASGI(_fastapi(runs, name), endpoint, REGION, floor_name)
            astack.push_async_callback(afloor.aclose)
            contenders.append(
                Contender(
                    name, "ASGI", _asgi_caller(afloor), _runs(runs, name), [], _floor_calls(afloor)
                )
            )
            name = "Powertools, sync FastAPI route"
            handle = _powertools_function(runs, name, powertools_table, client)
            contenders.append(
                Contender(
                    name,
                    "ASGI",
                    _asgi_caller(_fastapi(runs, name, handle)),
                    _runs(runs, name),
                    [client],
                )
            )
            await _measure(contenders, rounds, n)
    return contenders


def _runs(runs: Runs, name: str) -> Callable[[], int]:
    return lambda: runs.counts[name]


def _floor_calls(floor: FloorWSGI | FloorASGI) -> Callable[[], int]:
    return lambda: floor.wire.calls


def report(contenders: list[Contender], rounds: int, requests: int) -> str:
    rows = []
    for door in ("WSGI", "ASGI"):
        group = [c for c in contenders if c.door == door]
        powertools = next(c for c in group if c.name.startswith("Powertools"))
        for contender in group:
            cells = [contender.name]
            for case in (NEW, REPLAY):
                cpu = median(contender.cpu[case])
                ratio = cpu / median(powertools.cpu[case])
                cells += [
                    f"{cpu * 1e6:,.0f} us",
                    f"{ratio:.2f}x",
                    f"{median(contender.wall[case]) * 1e6:,.0f} us",
                    f"{contender.requests_per[case]:g}",
                ]
            rows.append(cells)
    headers = ["contender"]
    for case in (NEW, REPLAY):
        headers += [f"{case} CPU", "vs Powertools", f"{case} wall", "DynamoDB calls"]
    return "\n\n".join(
        [
            table(
                f"Per request on DynamoDB Local, in-process drivers, medians of {rounds} "
                f"rounds x {requests} requests",
                headers,
                rows,
            ),
            floor_table(contenders),
        ]
    )


def floor_table(contenders: list[Contender]) -> str:
    """Ours (lean) against the floor, CPU per request, from the same run."""
    by_name = {contender.name: contender for contender in contenders}
    rows = []
    for door, framework, ours_name, floor_name in (
        ("WSGI", "Flask", "ours WSGI (lean)", FLOOR_WSGI),
        ("ASGI", "FastAPI", "ours ASGI (lean)", FLOOR_ASGI),
    ):
        ours, floor = by_name[ours_name], by_name[floor_name]
        for case in (NEW, REPLAY):
            ours_cpu, floor_cpu = median(ours.cpu[case]), median(floor.cpu[case])
            rows.append(
                [
                    f"{door} ({framework})",
                    case,
                    f"{ours_cpu * 1e6:,.0f} us",
                    f"{floor_cpu * 1e6:,.0f} us",
                    f"{ours_cpu / floor_cpu:.2f}x",
                ]
            )
    return "\n".join(
        [
            table(
                "Ours against the floor (the bare app + one signed conditional PutItem with "
                "ALL_OLD and one UpdateItem on one kept-alive connection), CPU per request",
                ["door", "case", "ours CPU", "floor CPU", "ours / floor"],
                rows,
            ),
            "",
            "The floor is benchmarks/dynamodb_floor.py: no retries, rules, events or error "
            "answers; a lower bound for ours, not a middleware. Target: ours / floor <= 1.3x.",
        ]
    )


def run(endpoint: str, rounds: int, requests: int) -> str:
    import boto3

    suffix = uuid.uuid4().hex[:8]
    ours_table, powertools_table = f"bench-req-ours-{suffix}", f"bench-req-pt-{suffix}"
    floor_table_name = f"bench-req-floor-{suffix}"
    admin = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)
    with DynamoDBStore(ours_table, endpoint_url=endpoint, region_name=REGION) as store:
        store.create_table()
    admin.create_table(
        TableName=powertools_table,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    admin.get_waiter("table_exists").wait(TableName=powertools_table)
    create_floor_table(admin, floor_table_name)
    try:
        contenders = asyncio.run(
            _run(endpoint, (ours_table, powertools_table, floor_table_name), rounds, requests)
        )
    finally:
        for name in (ours_table, powertools_table, floor_table_name):
            admin.delete_table(TableName=name)
        admin.close()
    return report(contenders, rounds, requests)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ours vs Powertools per request, DynamoDB Local")
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args(argv)
    with endpoint_for(args.endpoint_url) as (endpoint, server):
        heading(f"dynamodb_requests: ours vs Powertools per request, on {server}")
        print(run(endpoint, args.rounds, args.requests), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
