"""The cost of ``encryption=`` per request: the ASGI middleware with and without it, side
by side in one run, on ``MemoryStore`` (no I/O: the cost shows whole) and on Amazon's
DynamoDB Local (``AsyncDynamoDBStore``, when ``IDEMPOTENCY_DYNAMODB_LOCAL_URL`` names it).

    scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.encryption
    python -m benchmarks.encryption [--rounds 9] [--requests 300]   (MemoryStore only)

The app answers ``POST /orders`` with 201 and a ~1 KB JSON document (compressed before it
is encrypted, as every stored response over 1 KiB is), driven in process over raw ASGI.
Cases: a new key every request (sealed on completion), and a replay of a completed key
(opened each time: no replay cache). Every round runs a batch of ``--requests`` requests
per contender per case, the contenders in an order that alternates from round to round; a
figure is the median over the rounds of the batch's mean per request, wall time and
``time.process_time`` (this process's CPU: DynamoDB Local's work is in its JVM).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from benchmarks._common import (
    REGION,
    Exchange,
    heading,
    http_scope,
    machine_summary,
    median,
    order_headers,
    table,
    us,
)
from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    Encryption,
    IdempotencyMiddleware,
    MemoryStore,
)

DYNAMODB_LOCAL = "IDEMPOTENCY_DYNAMODB_LOCAL_URL"
NEW, REPLAY = "new key", "replay"
ENCRYPTION = Encryption(keys={"bench": os.urandom(32)}, current="bench")
# About 1 KB, shaped like a payment's answer.
RESPONSE = orjson.dumps(
    {
        "id": "ch_3Nq8Xy2eZvKYlo2C1x9",
        "amount": 1999,
        "currency": "usd",
        "card": {"brand": "visa", "last4": "4242", "exp_month": 11, "exp_year": 2029},
        "billing": {"name": "Ada Lovelace", "line1": "12 St James's Square", "city": "London"},
        "items": [{"sku": f"A-{n}", "qty": n, "price": 100 * n} for n in range(20)],
    }
)


async def order_app(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    while message.get("more_body", False):
        message = await receive()
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(RESPONSE)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": RESPONSE})


@dataclass
class Contender:
    name: str
    app: Any
    replay_key: bytes = b""
    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)


async def _batch(contender: Contender, case: str, count: int, timed: bool) -> None:
    keys = (
        [contender.replay_key] * count
        if case == REPLAY
        else [uuid.uuid4().hex.encode() for _ in range(count)]
    )
    expected = 201
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    for key in keys:
        exchange = Exchange()
        await contender.app(http_scope(order_headers(key)), exchange.receive, exchange.send)
        if exchange.status != expected or exchange.body_size != len(RESPONSE):
            raise RuntimeError(f"{contender.name} {case}: got {exchange.status}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if timed:
        contender.wall.setdefault(case, []).append(wall / count)
        contender.cpu.setdefault(case, []).append(cpu / count)


async def _measure(contenders: list[Contender], rounds: int, requests: int) -> None:
    for contender in contenders:
        contender.replay_key = uuid.uuid4().hex.encode()
        await _batch(contender, NEW, 1, timed=False)
        exchange = Exchange()
        await contender.app(
            http_scope(order_headers(contender.replay_key)), exchange.receive, exchange.send
        )
    for round_index in range(-1, rounds):  # round -1 warms up, untimed
        order = contenders if round_index % 2 == 0 else contenders[::-1]
        for contender in order:
            for case in (NEW, REPLAY):
                await _batch(contender, case, requests, timed=round_index >= 0)


def _report(where: str, contenders: list[Contender], rounds: int, requests: int) -> str:
    plain, sealed = contenders
    rows = []
    for case in (NEW, REPLAY):
        for measure, label in ((plain.wall, "wall"), (plain.cpu, "CPU")):
            other = sealed.wall if label == "wall" else sealed.cpu
            base, cost = median(measure[case]), median(other[case])
            rows.append(
                [case, label, us(base), us(cost), f"{(cost - base) * 1e6:+.1f}", _pct(cost, base)]
            )
    return "\n".join(
        [
            table(
                f"Encryption cost per request, ASGI middleware on {where} (µs)",
                ["case", "time", "without", "with encryption", "difference", "relative"],
                rows,
            ),
            "",
            f"Medians of {rounds} rounds x {requests} requests per case, contenders alternating "
            f"in order from round to round; a {len(RESPONSE)}-byte JSON response. The machine "
            "may be shared with other work: compare the two columns of one run, not runs.",
        ]
    )


def _pct(cost: float, base: float) -> str:
    return f"{(cost / base - 1) * 100:+.1f}%" if base else "n/a"


async def _memory(rounds: int, requests: int) -> str:
    contenders = [
        Contender("without", IdempotencyMiddleware(order_app, store=MemoryStore())),
        Contender(
            "with", IdempotencyMiddleware(order_app, store=MemoryStore(), encryption=ENCRYPTION)
        ),
    ]
    await _measure(contenders, rounds, requests)
    return _report("MemoryStore", contenders, rounds, requests)


async def _dynamodb_local(endpoint: str, rounds: int, requests: int) -> str:
    table_name = f"bench-encryption-{uuid.uuid4().hex[:8]}"
    with DynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION) as creator:
        creator.create_table()
    stores = [AsyncDynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION)]
    stores.append(AsyncDynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION))
    try:
        contenders = [
            Contender("without", IdempotencyMiddleware(order_app, store=stores[0])),
            Contender(
                "with", IdempotencyMiddleware(order_app, store=stores[1], encryption=ENCRYPTION)
            ),
        ]
        await _measure(contenders, rounds, requests)
    finally:
        for store in stores:
            await store.aclose()
    return _report("DynamoDB Local (AsyncDynamoDBStore)", contenders, rounds, requests)


def run(rounds: int, requests: int, endpoint: str | None) -> str:
    parts = [asyncio.run(_memory(rounds, requests))]
    if endpoint:
        # Fewer requests per batch: each is a few round trips to the JVM.
        parts.append(asyncio.run(_dynamodb_local(endpoint, rounds, max(requests // 5, 20))))
    else:
        parts.append(
            f"DynamoDB Local: SKIPPED ({DYNAMODB_LOCAL} is not set; `make bench` runs it "
            "through scripts/dynamodb-local.sh --exec)"
        )
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The cost of encryption= per request")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    heading("encryption: the cost of encryption= per request (ASGI, MemoryStore, DynamoDB Local)")
    endpoint = os.environ.get(DYNAMODB_LOCAL, "").strip() or None
    print(run(args.rounds, args.requests, endpoint), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
