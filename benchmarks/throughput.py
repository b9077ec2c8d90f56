"""Requests per second and latency through uvicorn on 127.0.0.1, with httpx clients.

Three uvicorn processes serve the same Starlette app: bare, with the middleware on
MemoryStore, and with it on AsyncDynamoDBStore against moto's server (its own process).
This process is the client: ``--concurrency`` ``httpx.AsyncClient`` instances, one
connection each, send up to ``--requests`` POSTs (9 in 10 with a new key, 1 in 10
repeating a key completed during the warm-up, so replayed), stopping early after
``--seconds``. Rounds interleave the three servers; the table shows medians over rounds.

    python -m benchmarks.throughput [--rounds 3] [--requests 2000] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from benchmarks._common import (
    BODY,
    HOST,
    child_process,
    create_table,
    heading,
    machine_summary,
    median,
    moto_in_process,
    quantile,
    table,
    wait_for_port,
)
from tests.support.ports import free_port

WARM_UP_REQUESTS = 100
DYNAMODB_LOCAL = "IDEMPOTENCY_DYNAMODB_LOCAL_URL"  # set by scripts/dynamodb-local.sh


@dataclass
class Server:
    label: str
    variant: str
    url: str = ""
    rps: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the server process's, per request
    sent: list[int] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    error: str = ""


@contextlib.contextmanager
def _uvicorn(variant: str, extra_env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "benchmarks._apps:uvicorn_app",
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    with child_process(argv, {"BENCH_VARIANT": variant, **extra_env}) as process:
        wait_for_port(port, process)
        yield f"http://{HOST}:{port}"


async def _one_run(
    server: Server, requests: int, concurrency: int, seconds: float
) -> tuple[float, float, float, float, int, Counter[str]]:
    headers = {"content-type": "application/json"}
    prefix = uuid.uuid4().hex[:12]
    warm_keys = [f"{prefix}-warm-{index}" for index in range(WARM_UP_REQUESTS)]
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    next_index = 0
    deadline = 0.0
    async with contextlib.AsyncExitStack() as stack:
        # One client and connection per worker: one AsyncClient sharing a pool of 50
        # connections spends more CPU in its pool than the server spends answering
        # (encode/httpx#3215), so it would measure httpx, not the server.
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=server.url,
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                    timeout=30,
                )
            )
            for _ in range(concurrency)
        ]

        async def warm(client: httpx.AsyncClient, keys: list[str]) -> None:
            for key in keys:
                await client.post(
                    "/orders", content=BODY, headers={**headers, "idempotency-key": key}
                )

        await asyncio.gather(
            *(warm(client, warm_keys[n::concurrency]) for n, client in enumerate(clients))
        )

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal next_index
            while next_index < requests and time.perf_counter() < deadline:
                index = next_index
                next_index += 1
                replay = index % 10 == 9
                key = warm_keys[index % WARM_UP_REQUESTS] if replay else f"{prefix}-{index}"
                started = time.perf_counter()
                response = await client.post(
                    "/orders", content=BODY, headers={**headers, "idempotency-key": key}
                )
                latencies.append(time.perf_counter() - started)
                replayed = response.headers.get("idempotent-replayed") == "true"
                statuses[f"{response.status_code}{' replayed' if replayed else ''}"] += 1

        cpu = float((await clients[0].get("/cpu")).text)
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(worker(client) for client in clients))
        elapsed = time.perf_counter() - started
        cpu = float((await clients[0].get("/cpu")).text) - cpu
    latencies.sort()
    return (
        len(latencies) / elapsed,
        quantile(latencies, 0.50),
        quantile(latencies, 0.99),
        cpu / max(len(latencies), 1),
        len(latencies),
        statuses,
    )


def run(rounds: int = 3, requests: int = 2000, concurrency: int = 50, seconds: float = 4.0) -> str:
    local = os.environ.get(DYNAMODB_LOCAL, "").strip()
    backend = "DynamoDB Local" if local else "moto"
    servers = [
        Server("bare Starlette app", "bare"),
        Server("middleware, MemoryStore", "memory"),
        Server(f"middleware, AsyncDynamoDBStore, lean ({backend})", "dynamodb"),
        Server(f"middleware, AsyncDynamoDBStore, aioboto3 ({backend})", "dynamodb-sdk"),
    ]
    with contextlib.ExitStack() as stack:
        endpoint = local or stack.enter_context(moto_in_process())
        table_name = f"bench-{uuid.uuid4().hex[:8]}"
        create_table(endpoint, table_name)
        env = {"BENCH_ENDPOINT": endpoint, "BENCH_TABLE": table_name}
        for server in servers:
            server.url = stack.enter_context(_uvicorn(server.variant, env))
        for round_number in range(rounds):
            shift = round_number % len(servers)
            for server in servers[shift:] + servers[:shift]:
                if server.error:
                    continue
                try:
                    rps, p50, p99, cpu, sent, statuses = asyncio.run(
                        _one_run(server, requests, concurrency, seconds)
                    )
                except Exception as error:  # report it in the table, measure the others
                    server.error = f"failed: {error!r}"
                    continue
                server.rps.append(rps)
                server.p50.append(p50)
                server.p99.append(p99)
                server.cpu.append(cpu)
                server.sent.append(sent)
                server.statuses += statuses
    rows = []
    for server in servers:
        if server.error or not server.rps:
            rows.append([server.label, "n/a", "n/a", "n/a", "n/a", "n/a", server.error or "no run"])
            continue
        seen = ", ".join(f"{kind} x{n}" for kind, n in sorted(server.statuses.items()))
        rows.append(
            [
                server.label,
                f"{median(server.rps):.0f}",
                f"{median(server.p50) * 1000:.1f}",
                f"{median(server.p99) * 1000:.1f}",
                f"{median(server.cpu) * 1e6:,.0f}",
                f"{int(median(server.sent))}",
                seen,
            ]
        )
    return "\n".join(
        [
            table(
                "Throughput through uvicorn (median over rounds)",
                [
                    "server",
                    "requests/s",
                    "p50 ms",
                    "p99 ms",
                    "server CPU us/request",
                    "requests per run",
                    "statuses",
                ],
                rows,
            ),
            "",
            f"{rounds} interleaved rounds; per run up to {requests} requests or {seconds:g} s, "
            f"{concurrency} concurrent, 9 in 10 new keys, 1 in 10 replays. One uvicorn worker "
            "(h11, asyncio) per server; client, servers and the DynamoDB server share the "
            "machine's cores, so the client caps the bare figure. Server CPU is the uvicorn "
            f"process's CPU time over the timed part of a run. DynamoDB: {backend}.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Throughput through uvicorn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    heading("throughput: uvicorn on 127.0.0.1, httpx.AsyncClient")
    print(run(args.rounds, args.requests, args.concurrency, args.seconds), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
