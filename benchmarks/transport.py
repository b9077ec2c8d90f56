"""Client CPU per DynamoDB call: boto3 against the lean transport (sync), aiobotocore against
the lean transport (async), side by side in one run.

    scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.transport
    python -m benchmarks.transport [--endpoint-url URL] [--rounds 9] [--calls 100]

The calls are the stores' own, built by their request builders: the claim of a new key
(conditional PutItem), its completion (conditional UpdateItem with a response blob) and a
strongly consistent GetItem of the completed record. Every client is configured as the
stores configure theirs (timeouts, standard retries, pool size); the lean ones are the
stores' default clients.

Every round runs a batch of ``--calls`` calls of each operation on each client, the clients
in an order that rotates from round to round; a figure is the median over the rounds of the
batch's mean per call: CPU (``time.process_time``: this process only, the server's work is
in its own process) and wall time. One untimed round warms up first.

The server is DynamoDB Local when ``--endpoint-url`` or ``IDEMPOTENCY_DYNAMODB_LOCAL_URL``
names one on loopback, else moto's server in a child process (slower answers, the same
client work).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from benchmarks._common import REGION, heading, machine_summary, median, moto_in_process, table
from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore
from idempotency_middleware.stores import ClaimRequest, Completion
from idempotency_middleware.stores.dynamodb import requests as ddb
from idempotency_middleware.stores.dynamodb.config import ClientSettings
from idempotency_middleware.stores.records import StoredResponse

ENDPOINT_VARIABLE = "IDEMPOTENCY_DYNAMODB_LOCAL_URL"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
OPERATIONS = ("PutItem (claim)", "UpdateItem (complete)", "GetItem")
RESPONSE = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1, "ok": true}')
CLIENTS = ("boto3", "lean sync", "aiobotocore", "lean async")
PAIRS = (("boto3", "lean sync"), ("aiobotocore", "lean async"))

Call = Callable[[tuple[str, dict[str, Any]]], Awaitable[Any]]


@dataclass
class Series:
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)


def requests_for(
    layout: ddb.TableLayout, calls: int
) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """``calls`` fresh keys' claims, completions and reads, by operation."""
    now = time.time()
    by_operation: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in OPERATIONS}
    for _ in range(calls):
        key, owner = uuid.uuid4().hex, uuid.uuid4().hex
        claim = ClaimRequest(key, "fingerprint", owner, now, 30.0)
        completion = Completion(key, owner, now, 3600.0, RESPONSE)
        by_operation[OPERATIONS[0]].append(("put_item", ddb.claim_request(layout, claim)))
        plan = ddb.plan_completion(layout, completion, None)
        by_operation[OPERATIONS[1]].append(("update_item", plan.request))
        by_operation[OPERATIONS[2]].append(("get_item", ddb.get_request(layout, key)))
    return by_operation


def _sync_call(client: Any) -> Call:
    async def call(request: tuple[str, dict[str, Any]]) -> Any:
        method, params = request
        return getattr(client, method)(**params)

    return call


def _async_call(client: Any) -> Call:
    async def call(request: tuple[str, dict[str, Any]]) -> Any:
        method, params = request
        return await getattr(client, method)(**params)

    return call


async def _batch(
    call: Call, requests: list[tuple[str, dict[str, Any]]], series: Series | None
) -> None:
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    for request in requests:
        answer = await call(request)
        if answer["ResponseMetadata"]["HTTPStatusCode"] != 200:
            raise RuntimeError(f"unexpected answer {answer!r}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if series is not None:
        series.cpu.append(cpu / len(requests))
        series.wall.append(wall / len(requests))


@contextlib.asynccontextmanager
async def _clients(endpoint: str, table_name: str) -> Any:
    import aioboto3

    settings = ClientSettings(endpoint, REGION)
    with contextlib.ExitStack() as stack:
        boto3_store = stack.enter_context(
            DynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION, transport="sdk")
        )
        lean_store = stack.enter_context(
            DynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION)
        )
        async with (
            aioboto3.Session().client(
                "dynamodb", **settings.client_arguments({})
            ) as aiobotocore_client,
            AsyncDynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION) as store,
        ):
            yield {
                "boto3": _sync_call(boto3_store.client),
                "lean sync": _sync_call(lean_store.client),
                "aiobotocore": _async_call(aiobotocore_client),
                "lean async": _async_call(await store.client()),
            }


async def measure(
    endpoint: str, table_name: str, rounds: int, calls: int
) -> dict[tuple[str, str], Series]:
    layout = ddb.TableLayout(table_name)
    results = {(client, name): Series() for client in CLIENTS for name in OPERATIONS}
    async with _clients(endpoint, table_name) as clients:
        for round_index in range(-1, rounds):  # round -1 warms up, untimed
            shift = max(round_index, 0) % len(CLIENTS)
            order = CLIENTS[shift:] + CLIENTS[:shift]
            for client in order:
                requests = requests_for(layout, calls)
                for name in OPERATIONS:
                    series = results[(client, name)] if round_index >= 0 else None
                    await _batch(clients[client], requests[name], series)
    return results


def report(results: dict[tuple[str, str], Series], rounds: int, calls: int) -> str:
    rows = []
    for sdk, lean in PAIRS:
        for name in OPERATIONS:
            theirs, ours = results[(sdk, name)], results[(lean, name)]
            sdk_cpu, lean_cpu = median(theirs.cpu), median(ours.cpu)
            rows.append(
                [
                    f"{lean} vs {sdk}",
                    name,
                    f"{sdk_cpu * 1e6:,.0f} us",
                    f"{lean_cpu * 1e6:,.0f} us",
                    f"{lean_cpu / sdk_cpu:.2f}x",
                    f"{median(theirs.wall) * 1e6:,.0f} us",
                    f"{median(ours.wall) * 1e6:,.0f} us",
                ]
            )
    return table(
        f"Client CPU per DynamoDB call, medians of {rounds} rounds x {calls} calls",
        ["clients", "call", "SDK CPU", "lean CPU", "lean/SDK", "SDK wall", "lean wall"],
        rows,
    )


@contextlib.contextmanager
def endpoint_for(given: str | None) -> Iterator[tuple[str, str]]:
    """DynamoDB Local when named (on loopback only), else moto in a child process."""
    endpoint = (given or os.environ.get(ENDPOINT_VARIABLE, "")).strip()
    if endpoint:
        if urlsplit(endpoint).hostname not in LOOPBACK_HOSTS:
            raise SystemExit(f"benchmarks.transport: refusing {endpoint!r}: loopback only")
        yield endpoint, "DynamoDB Local"
        return
    with moto_in_process() as moto:
        yield moto, "moto server (child process)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args(argv)
    with endpoint_for(args.endpoint_url) as (endpoint, server):
        heading(f"transport: client CPU per DynamoDB call, SDK vs lean, on {server}")
        table_name = f"bench-transport-{uuid.uuid4().hex[:8]}"
        with DynamoDBStore(table_name, endpoint_url=endpoint, region_name=REGION) as store:
            store.create_table()
            try:
                results = asyncio.run(measure(endpoint, table_name, args.rounds, args.calls))
            finally:
                store.client.delete_table(TableName=table_name)
    print(report(results, args.rounds, args.calls), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
