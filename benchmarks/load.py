"""Load test: many concurrent clients retrying a few hundred keys through uvicorn and DynamoDB.

    python -m benchmarks.load                       # 2,000 requests, 200 keys, 50 clients
    python -m benchmarks.load --requests 600 --keys 60 --clients 30
    python -m benchmarks.load --endpoint-url http://127.0.0.1:8000   # a running DynamoDB Local

moto's DynamoDB server (unless ``--endpoint-url`` names another) and a uvicorn server (the
middleware with ``AsyncDynamoDBStore`` in front of a small handler) each run in a child
process on 127.0.0.1; this process runs the
clients: one ``httpx.AsyncClient`` each, taking requests from a shared, shuffled queue in
which every key appears ``requests / keys`` times, so duplicates of a key are often in
flight together. A duplicate gets the replay (201) or, while the first is still running,
409; nothing is retried. The handler counts its runs per key; at the end every key must have
run exactly once and no response may be a 5xx.

Exactly once needs a store whose conditional writes are atomic. moto's threaded server reads,
checks and writes a conditional ``PutItem`` without a lock (tests/contract/test_moto_atomicity.py
shows two both winning), so on moto a key can, rarely, run twice: moto's race, not ours.
On moto a key run twice is reported but does not fail the run; against DynamoDB Local
(the test suite runs it there too) it does.

Prints requests/s, p50 and p99 latency and the status counts. Figures depend on moto, which
is far slower than DynamoDB: read them as the middleware's overhead ceiling on this machine,
not as DynamoDB's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks._common import (
    HOST,
    REGION,
    child_process,
    moto_in_process,
    wait_for_port,
)
from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK_SECONDS = 0.01  # what the handler "does" per run
START_TIMEOUT_SECONDS = 30.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# --- the server side (imported by uvicorn in the child process) --------------------------------


class LoadApp:
    """``POST /orders``: count a run for the request's key, work a little, answer 201.
    ``GET /runs``: the run counts per key. Lifespan shutdown closes the store."""

    def __init__(self, on_shutdown: Callable[[], Awaitable[None]] | None = None) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self._on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        more = True
        while more:
            message = await receive()
            more = bool(message.get("more_body", False))
        if scope["method"] == "GET" and scope["path"] == "/runs":
            await _json(send, 200, dict(self.runs))
            return
        key = dict(scope["headers"]).get(b"idempotency-key", b"").decode("latin-1")
        self.runs[key] += 1
        run = self.runs[key]
        await asyncio.sleep(WORK_SECONDS)
        await _json(send, 201, {"key": key, "run": run})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._on_shutdown is not None:
                    await self._on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _json(send: Send, status: int, payload: Any) -> None:
    body = orjson.dumps(payload)
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


def create_app() -> Any:
    """The app uvicorn serves (``--factory``), configured by ``LOAD_TABLE``/``LOAD_ENDPOINT``."""
    from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware

    store = AsyncDynamoDBStore(
        os.environ["LOAD_TABLE"],
        endpoint_url=os.environ["LOAD_ENDPOINT"],
        region_name=REGION,
        read_timeout=10.0,  # moto under load is slow; a timeout here would be a false 503
    )
    return IdempotencyMiddleware(LoadApp(on_shutdown=store.aclose), store=store)


# --- child processes ------------------------------------------------------------------------------


def _aws_env() -> dict[str, str]:
    # moto accepts any credentials; botocore only needs some to sign. Never a real AWS.
    return {
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        "AWS_DEFAULT_REGION": REGION,
        "PYTHONPATH": str(REPO_ROOT),
    }


moto_server = moto_in_process  # moto's DynamoDB in a child process (its own GIL)


@contextlib.contextmanager
def load_server(endpoint_url: str, table: str) -> Iterator[str]:
    """uvicorn serving ``create_app()`` in a child process; yields its URL."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "benchmarks.load:create_app",
        "--factory",
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    env = {**_aws_env(), "LOAD_TABLE": table, "LOAD_ENDPOINT": endpoint_url}
    with child_process(argv, env) as process:
        wait_for_port(port, process, START_TIMEOUT_SECONDS)
        yield f"http://{HOST}:{port}"


# --- the clients ----------------------------------------------------------------------------------


@dataclass
class LoadResult:
    requests: int
    keys: int
    clients: int
    backend: str = "moto"  # where the DynamoDB table lives: moto, or an endpoint URL
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, sorted at the end
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    replayed: int = 0
    errors: list[str] = field(default_factory=list)  # transport errors
    runs: dict[str, int] = field(default_factory=dict)  # handler runs per key
    wrong_replays: int = 0  # replays whose body was not the key's first run

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def quantile_ms(self, fraction: float) -> float:
        if not self.latencies:
            return float("nan")
        index = min(len(self.latencies) - 1, max(0, round(fraction * len(self.latencies)) - 1))
        return self.latencies[index] * 1000

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)

    def keys_not_run_once(self, key_names: list[str]) -> list[str]:
        return [key for key in key_names if self.runs.get(key, 0) != 1]

    def missed_guarantee(self) -> bool:
        """A key not run exactly once, or a replay of another run's body. Not counted on
        moto, whose non-atomic conditional writes can let two claims of one key both win."""
        if self.backend == "moto":
            return any(self.runs.get(key, 0) == 0 for key in self.runs)
        return bool(self.wrong_replays or self.keys_not_run_once(list(self.runs)))

    def report(self) -> str:
        statuses = ", ".join(
            f"{status} x {count}" for status, count in sorted(self.statuses.items())
        )
        return "\n".join(
            [
                f"load: {self.requests} requests over {self.keys} keys from {self.clients} "
                f"concurrent clients (uvicorn + AsyncDynamoDBStore on {self.backend}, 127.0.0.1)",
                f"  {self.requests_per_second:.0f} requests/s over {self.elapsed:.1f} s; "
                f"latency p50 {self.quantile_ms(0.50):.1f} ms, p99 {self.quantile_ms(0.99):.1f} ms",
                f"  statuses: {statuses} ({self.replayed} replays); "
                f"transport errors: {len(self.errors)}",
                f"  handler runs: {sum(self.runs.values())} for {len(self.runs)} keys; "
                f"keys not run exactly once: {len(self.keys_not_run_once(list(self.runs)))}",
            ]
        )


async def _drive(url: str, key_names: list[str], result: LoadResult, seed: int) -> None:
    per_key = result.requests // result.keys
    queue: asyncio.Queue[str] = asyncio.Queue()
    order = [key for key in key_names for _ in range(per_key)]
    order += key_names[: result.requests - len(order)]
    random.Random(seed).shuffle(order)
    for key in order:
        queue.put_nowait(key)
    first_bodies: dict[str, bytes] = {}
    replay_bodies: list[tuple[str, bytes]] = []

    async def client() -> None:
        async with httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=1), trust_env=False
        ) as http:
            while True:
                try:
                    key = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = orjson.dumps({"key": key, "amount": 100})
                started = time.perf_counter()
                try:
                    response = await http.post(
                        "/orders",
                        content=body,
                        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
                    )
                except httpx.HTTPError as error:
                    result.errors.append(repr(error))
                    continue
                result.latencies.append(time.perf_counter() - started)
                result.statuses[response.status_code] += 1
                if response.status_code == 201:
                    if response.headers.get("idempotent-replayed") == "true":
                        result.replayed += 1
                        replay_bodies.append((key, response.content))
                    else:
                        first_bodies[key] = response.content

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(result.clients)))
    result.elapsed = time.perf_counter() - started
    result.latencies.sort()
    result.wrong_replays = sum(1 for key, body in replay_bodies if first_bodies.get(key) != body)
    async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as http:
        result.runs = (await http.get("/runs")).json()


def run_load(
    requests: int = 2000,
    keys: int = 200,
    clients: int = 50,
    *,
    seed: int = 20240501,
    endpoint_url: str | None = None,
) -> LoadResult:
    """Start uvicorn (and moto, unless ``endpoint_url`` names a running DynamoDB, such as
    DynamoDB Local) in child processes, drive the load, stop them; the result."""
    from idempotency_middleware import DynamoDBStore

    result = LoadResult(
        requests, keys, clients, backend="moto" if endpoint_url is None else endpoint_url
    )
    table = f"load-{uuid.uuid4().hex[:10]}"
    key_names = [f"load-{table}-{index:04d}" for index in range(keys)]
    for name, value in _aws_env().items():
        os.environ.setdefault(name, value)
    with contextlib.ExitStack() as stack:
        if endpoint_url is None:
            endpoint_url = stack.enter_context(moto_server())
        with DynamoDBStore(table, endpoint_url=endpoint_url, region_name=REGION) as store:
            store.create_table()
        with load_server(endpoint_url, table) as url:
            asyncio.run(_drive(url, key_names, result, seed))
    for key in key_names:
        result.runs.setdefault(key, 0)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument(
        "--endpoint-url",
        help="a running DynamoDB on 127.0.0.1 (such as DynamoDB Local) instead of moto",
    )
    arguments = parser.parse_args(argv)
    result = run_load(
        arguments.requests,
        arguments.keys,
        arguments.clients,
        endpoint_url=arguments.endpoint_url,
    )
    print(result.report())
    failed = result.server_errors or result.errors or result.missed_guarantee()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
