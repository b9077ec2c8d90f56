"""Per-call cost of our ``idempotent`` function decorator next to AWS Powertools'
``idempotent_function``, both against the same Amazon DynamoDB Local.

    scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.functions
    python -m benchmarks.functions --endpoint-url http://127.0.0.1:8000 [--rounds 20] [--calls 50]

Both decorate the same function body (count the run, return a small dict) and are called the
same way, ``handle(message=...)``, with the same SQS-style message dict; the idempotency key
is the message's ``messageId`` (ours: a ``key`` callable; Powertools: ``event_key_jmespath``)
and both fingerprint the whole message to refuse a key reused with another payload (ours by
default; Powertools with ``payload_validation_jmespath="@"``).
Four calls are measured:

- new key: a fresh ``messageId`` every call, so the body runs once per call;
- replay: one ``messageId`` completed before the rounds, so every call returns the stored
  result without running the body;

each sync (``DynamoDBStore``; Powertools' ``DynamoDBPersistenceLayer`` on a boto3 client)
and async (``AsyncDynamoDBStore``). Powertools has no async support, so its async rows say so.

Every round times a batch of ``--calls`` calls of each contender in each case, ours and
Powertools' back to back, alternating which goes first from round to round. A figure is the
median over the rounds of the batch's mean per call: wall time (``time.perf_counter``) and
CPU time (``time.process_time``, this process only: DynamoDB Local's own work is in its JVM,
so CPU is the client side, the decorator plus botocore). One untimed round warms up first.

Before the rounds, a few calls of each run with a botocore ``before-send`` hook on each
client counting the HTTP requests each makes, by ``X-Amz-Target``: the "DynamoDB requests"
column. The timed calls run without the hook. Every timed call is checked: a new key must
run the body once and return its result, a replay must not run it and must return the
stored result.

DynamoDB Local must run on loopback (scripts/dynamodb-local.sh starts it in a private network
namespace and sets IDEMPOTENCY_DYNAMODB_LOCAL_URL); this refuses any other endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import importlib.metadata
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from benchmarks._common import (
    BODY,
    ORDER,
    REGION,
    Loaded,
    heading,
    load,
    machine_summary,
    median,
    table,
    us,
)
from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore, idempotent

ENDPOINT_VARIABLE = "IDEMPOTENCY_DYNAMODB_LOCAL_URL"
HOW_TO_RUN = "scripts/dynamodb-local.sh --exec .venv/bin/python -m benchmarks.functions"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
TTL_SECONDS = 86400  # ours' default; Powertools is given the same (its own default is 1 h)
COUNTED_CALLS = 3  # calls per case in the counting pass

OURS = "ours"
POWERTOOLS = "powertools"
NEW = "new key"
REPLAY = "replay"
SYNC = "sync"
ASYNC = "async"
CASES = (NEW, REPLAY)
MODES = (SYNC, ASYNC)
# The printed rows, in order: (case, mode, contender).
ROWS = tuple((case, mode, who) for mode in MODES for case in CASES for who in (OURS, POWERTOOLS))
NO_ASYNC = "n/a (no async support)"

Message = dict[str, Any]
Output = dict[str, Any]
SyncHandler = Callable[..., Output]
AsyncHandler = Callable[..., Awaitable[Output]]

# POWERTOOLS_IDEMPOTENCY_DISABLED, if set, turns Powertools' decorator into a pass-through (it
# only warns), which would make its figures meaningless.
os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)


def sqs_message(message_id: str) -> Message:
    """One record of an SQS event as Lambda delivers it; the body is the benchmarks' order."""
    return {
        "messageId": message_id,
        "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a",
        "body": BODY.decode(),
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1700000000000",
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": "1700000000001",
        },
        "messageAttributes": {},
        "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
        "awsRegion": REGION,
    }


def output_for(message: Message) -> Output:
    """What the function body returns: a small dict, the same for both contenders."""
    return {"messageId": message["messageId"], "status": "processed", "amount": ORDER["amount"]}


def message_id(message: Message) -> str:
    """Our ``key`` callable: called with the function's own arguments (``message=...``)."""
    value: str = message["messageId"]
    return value


class LambdaContextStub:
    """The one thing Powertools reads from a Lambda context: the time left. In Lambda it is
    registered on the config; with it Powertools writes an in-progress expiry, as ours writes
    its lock's expiry (without it Powertools warns and writes none). A
    steady 60 s, ours' default ``lock_timeout_seconds``."""

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


# --- measurement records ---------------------------------------------------------------------


@dataclass
class Series:
    """One row: a contender in one case and mode."""

    wall: list[float] = field(default_factory=list)  # mean seconds per call, one per round
    cpu: list[float] = field(default_factory=list)
    calls: int = 0  # timed calls
    runs: int = 0  # body runs during the timed calls
    right: int = 0  # timed calls that returned what they should
    requests: Counter[str] = field(default_factory=Counter)  # from the counting pass
    counted_calls: int = 0

    def requests_per_call(self) -> float:
        return sum(self.requests.values()) / self.counted_calls if self.counted_calls else 0.0


@dataclass
class FunctionsResult:
    endpoint_url: str
    rounds: int
    calls: int
    ours_version: str
    powertools_version: str
    powertools_error: str  # why Powertools' rows are missing; "" when they are not
    series: dict[tuple[str, str, str], Series]  # (case, mode, contender)

    def get(self, case: str, mode: str, who: str) -> Series | None:
        return self.series.get((case, mode, who))

    def report(self) -> str:
        rows: list[list[str]] = []
        for case, mode, who in ROWS:
            rows.append(self._row(case, mode, who))
        notes = [
            f"Median over {self.rounds} rounds of the mean per call over {self.calls} calls; "
            "each round runs ours and Powertools' back to back, alternating which goes first.",
            "CPU is this process's (time.process_time), the client side only: DynamoDB Local "
            "works in its own JVM.",
            "'Powertools / ours' divides Powertools' median by ours (above 1: ours costs less).",
            f"DynamoDB requests: counted on the wire (botocore before-send) over {COUNTED_CALLS} "
            "untimed calls per row.",
            f"Endpoint: DynamoDB Local at {self.endpoint_url}.",
        ]
        if self.powertools_error:
            notes.append(f"Powertools' rows are missing: {self.powertools_error}.")
        title = (
            f"idempotent (idempotency-middleware {self.ours_version}) vs Powertools' "
            f"idempotent_function (aws-lambda-powertools {self.powertools_version}), "
            "per call, on DynamoDB Local"
        )
        headers = [
            "call",
            "library",
            "wall us/call",
            "CPU us/call",
            "Powertools / ours (wall, CPU)",
            "DynamoDB requests per call",
            "checks",
        ]
        return "\n".join([table(title, headers, rows), "", *notes])

    def _row(self, case: str, mode: str, who: str) -> list[str]:
        call = f"{case}, {mode}"
        if who == OURS:
            library = f"ours ({self.ours_version})"
        else:
            library = f"Powertools ({self.powertools_version})"
        series = self.get(case, mode, who)
        if series is None:
            reason = NO_ASYNC if mode == ASYNC else f"n/a ({self.powertools_error})"
            return [call, library, reason, reason, "-", "-", "-"]
        ratio = "-"
        ours = self.get(case, mode, OURS)
        if who == POWERTOOLS and ours is not None:
            ratio = (
                f"{median(series.wall) / median(ours.wall):.2f}x, "
                f"{median(series.cpu) / median(ours.cpu):.2f}x"
            )
        return [
            call,
            library,
            us(median(series.wall)),
            us(median(series.cpu)),
            ratio,
            _describe_requests(series),
            _describe_checks(case, series),
        ]


def _describe_requests(series: Series) -> str:
    if not series.counted_calls:
        return "-"
    counted = series.counted_calls
    each = ", ".join(f"{name} {n / counted:g}" for name, n in sorted(series.requests.items()))
    return f"{series.requests_per_call():g} ({each or 'none'})"


def _describe_checks(case: str, series: Series) -> str:
    if case == NEW:
        return (
            f"ran {series.runs}/{series.calls}, returned its output {series.right}/{series.calls}"
        )
    return f"stored result {series.right}/{series.calls}, ran {series.runs}"


# --- counting requests on the wire -------------------------------------------------------------


class RequestCounter:
    """A botocore ``before-send`` handler counting requests by operation (``X-Amz-Target``).

    It returns None, so botocore sends the request as usual.
    """

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()

    def __call__(self, request: Any, **_: Any) -> None:
        target = request.headers.get("X-Amz-Target", b"")
        if isinstance(target, bytes):
            target = target.decode()
        self.requests[str(target).rsplit(".", 1)[-1] or "?"] += 1


@contextlib.contextmanager
def counting(clients: Sequence[Any], counter: RequestCounter) -> Iterator[RequestCounter]:
    for client in clients:
        client.meta.events.register("before-send.dynamodb", counter)
    try:
        yield counter
    finally:
        for client in clients:
            client.meta.events.unregister("before-send.dynamodb", counter)


# --- the contenders ----------------------------------------------------------------------------


@dataclass
class Contender:
    """One decorated function, its client (for counting), and the replay it was primed with."""

    who: str
    mode: str
    call: Callable[..., Any]  # handle(message=...), sync or a coroutine function
    runs: Callable[[], int]
    client: Any
    series: dict[str, Series] = field(default_factory=dict)  # by case
    replay_message: Message = field(default_factory=dict)
    replay_output: Output = field(default_factory=dict)


class BodyRuns:
    """Run counts of the function bodies, by contender and mode."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def sync_body(self, name: str) -> SyncHandler:
        counts = self.counts

        def handle(message: Message) -> Output:
            counts[name] += 1
            return output_for(message)

        # Powertools names its records after the function (module.qualname); keep them apart.
        handle.__qualname__ = handle.__name__ = f"handle_{name.replace('-', '_')}"
        return handle

    def async_body(self, name: str) -> AsyncHandler:
        counts = self.counts

        async def handle(message: Message) -> Output:
            counts[name] += 1
            return output_for(message)

        handle.__qualname__ = handle.__name__ = f"handle_{name.replace('-', '_')}"
        return handle


def _powertools() -> Loaded:
    return load(
        "aws-lambda-powertools",
        {
            "layer": (
                "aws_lambda_powertools.utilities.idempotency",
                "DynamoDBPersistenceLayer",
            ),
            "config": ("aws_lambda_powertools.utilities.idempotency", "IdempotencyConfig"),
            "decorator": (
                "aws_lambda_powertools.utilities.idempotency",
                "idempotent_function",
            ),
        },
    )


def _boto3_client(endpoint_url: str) -> Any:
    import boto3

    return boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=REGION)


def _create_powertools_table(client: Any, table_name: str) -> None:
    """Powertools' documented table: partition key ``id`` (string), on demand."""
    client.create_table(
        TableName=table_name,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 150}
    )


# --- timing ----------------------------------------------------------------------------------


def _record(
    series: Series,
    wall: float,
    cpu: float,
    outputs: list[Any],
    expected: list[Output],
    runs: int,
) -> None:
    series.wall.append(wall / len(outputs))
    series.cpu.append(cpu / len(outputs))
    series.calls += len(outputs)
    series.runs += runs
    series.right += sum(1 for got, want in zip(outputs, expected, strict=True) if got == want)


async def _batch(contender: Contender, case: str, messages: list[Message], timed: bool) -> None:
    """Call ``contender`` once per message; when ``timed``, record the batch in its series."""
    if case == NEW:
        expected = [output_for(message) for message in messages]
    else:
        expected = [contender.replay_output] * len(messages)
    runs_before = contender.runs()
    outputs: list[Any] = []
    call = contender.call
    gc.collect()
    if contender.mode == SYNC:
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        for message in messages:
            outputs.append(call(message=message))
        cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    else:
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        for message in messages:
            outputs.append(await call(message=message))
        cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    if timed:
        _record(
            contender.series[case], wall, cpu, outputs, expected, contender.runs() - runs_before
        )


def _messages(contender: Contender, case: str, calls: int) -> list[Message]:
    """Fresh keys for new-key calls; copies of the completed message for replays (built
    before the clock starts, so neither contender pays for them)."""
    if case == NEW:
        return [sqs_message(f"{contender.who}-{uuid.uuid4()}") for _ in range(calls)]
    return [copy.deepcopy(contender.replay_message) for _ in range(calls)]


async def _prime_replay(contender: Contender) -> None:
    message = sqs_message(f"{contender.who}-replay-{uuid.uuid4()}")
    result = contender.call(message=message)
    if contender.mode == ASYNC:
        result = await result
    if result != output_for(message):
        raise RuntimeError(f"{contender.who} ({contender.mode}) returned {result!r}")
    contender.replay_message = message
    contender.replay_output = result


async def _measure(
    contenders: list[Contender], rounds: int, calls: int, warmup_rounds: int
) -> None:
    for contender in contenders:
        await _prime_replay(contender)
        contender.series = {case: Series() for case in CASES}

    # The counting pass (also the connections' warm-up): a handler on each client, untimed.
    for contender in contenders:
        for case in CASES:
            counter = RequestCounter()
            with counting([contender.client], counter):
                await _batch(contender, case, _messages(contender, case, COUNTED_CALLS), False)
            contender.series[case].requests = counter.requests
            contender.series[case].counted_calls = COUNTED_CALLS

    for round_index in range(-warmup_rounds, rounds):
        for mode in MODES:
            for case in CASES:
                pair = [c for c in contenders if c.mode == mode]
                if round_index % 2:  # alternate which contender goes first
                    pair.reverse()
                batches = [(c, _messages(c, case, calls)) for c in pair]
                for contender, messages in batches:
                    await _batch(contender, case, messages, timed=round_index >= 0)


def _ours(store: DynamoDBStore | AsyncDynamoDBStore, bodies: BodyRuns, client: Any) -> Contender:
    """Our decorator on the store of its flavour: a sync body on the sync store, async on
    the async one. Everything else at its defaults but the key."""
    mode = ASYNC if isinstance(store, AsyncDynamoDBStore) else SYNC
    name = f"ours-{mode}"
    body = bodies.async_body(name) if mode == ASYNC else bodies.sync_body(name)
    decorated = idempotent(store=store, key=message_id, ttl_seconds=TTL_SECONDS)(body)
    return Contender(OURS, mode, decorated, lambda: bodies.counts[name], client)


def _powertools_sync(
    powertools: Loaded, table_name: str, bodies: BodyRuns, client: Any
) -> Contender:
    """Powertools' decorator as its documentation wires it, on the boto3 client given."""
    layer = powertools.attributes["layer"](table_name=table_name, boto3_client=client)
    config = powertools.attributes["config"](
        event_key_jmespath="messageId",
        # Ours fingerprints the whole payload by default and refuses a key reused with
        # another one; "@" (the whole message) makes Powertools store and check that too.
        payload_validation_jmespath="@",
        raise_on_no_idempotency_key=True,  # as ours' required=True: no key is an error
        expires_after_seconds=TTL_SECONDS,
    )
    config.register_lambda_context(LambdaContextStub())
    name = "powertools-sync"
    decorated = powertools.attributes["decorator"](
        bodies.sync_body(name),
        data_keyword_argument="message",
        persistence_store=layer,
        config=config,
    )
    return Contender(POWERTOOLS, SYNC, decorated, lambda: bodies.counts[name], client)


async def _run_contenders(
    endpoint_url: str,
    ours_table: str,
    powertools: Loaded | None,
    powertools_table: str,
    rounds: int,
    calls: int,
    warmup_rounds: int,
) -> list[Contender]:
    """Open the stores and clients, build the contenders (ours sync, Powertools sync, ours
    async), measure them, close everything."""
    bodies = BodyRuns()
    with contextlib.ExitStack() as stack:
        sync_store = stack.enter_context(
            DynamoDBStore(ours_table, endpoint_url=endpoint_url, region_name=REGION)
        )
        async with AsyncDynamoDBStore(
            ours_table, endpoint_url=endpoint_url, region_name=REGION
        ) as async_store:
            contenders = [_ours(sync_store, bodies, sync_store.client)]
            if powertools is not None:
                client = _boto3_client(endpoint_url)
                stack.callback(client.close)
                contenders.append(_powertools_sync(powertools, powertools_table, bodies, client))
            contenders.append(_ours(async_store, bodies, await async_store.client()))
            await _measure(contenders, rounds, calls, warmup_rounds)
    return contenders


def run(
    endpoint_url: str,
    rounds: int = 20,
    calls: int = 50,
    warmup_rounds: int = 1,
    *,
    with_powertools: bool = True,
) -> FunctionsResult:
    """Create the tables, measure, drop the tables. ``with_powertools=False`` leaves
    Powertools out as if it were not installed (the tests use it)."""
    powertools = _powertools()
    powertools_error = powertools.error
    if not with_powertools:
        powertools_error = "left out (with_powertools=False)"
    suffix = uuid.uuid4().hex[:8]
    ours_table = f"bench-functions-ours-{suffix}"
    powertools_table = f"bench-functions-powertools-{suffix}"
    result = FunctionsResult(
        endpoint_url=endpoint_url,
        rounds=rounds,
        calls=calls,
        ours_version=importlib.metadata.version("idempotency-middleware"),
        powertools_version=powertools.version,
        powertools_error=powertools_error,
        series={},
    )
    admin = _boto3_client(endpoint_url)
    tables: list[str] = []
    try:
        with DynamoDBStore(ours_table, endpoint_url=endpoint_url, region_name=REGION) as store:
            store.create_table()
        tables.append(ours_table)
        if not powertools_error:
            _create_powertools_table(admin, powertools_table)
            tables.append(powertools_table)
        contenders = asyncio.run(
            _run_contenders(
                endpoint_url,
                ours_table,
                None if powertools_error else powertools,
                powertools_table,
                rounds,
                calls,
                warmup_rounds,
            )
        )
        for contender in contenders:
            for case, series in contender.series.items():
                result.series[(case, contender.mode, contender.who)] = series
    finally:
        # The script's DynamoDB Local is in memory and gone afterwards; another one is not.
        for name in tables:
            admin.delete_table(TableName=name)
        admin.close()
    return result


# --- command line ------------------------------------------------------------------------------


def resolve_endpoint(given: str | None) -> str:
    """The endpoint to use, or SystemExit(2) with how to run this when there is none or
    it is not on loopback (DynamoDB Local only: never a real AWS endpoint)."""
    endpoint = (given or os.environ.get(ENDPOINT_VARIABLE, "")).strip()
    if not endpoint:
        print(
            "benchmarks.functions needs DynamoDB Local: run it with\n"
            f"    {HOW_TO_RUN}\n"
            f"or pass --endpoint-url (or set {ENDPOINT_VARIABLE}) to a DynamoDB Local on "
            "127.0.0.1.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if urlsplit(endpoint).hostname not in LOOPBACK_HOSTS:
        print(
            f"benchmarks.functions: refusing {endpoint!r}: only a DynamoDB Local on loopback "
            "(127.0.0.1, localhost, ::1).",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return endpoint


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="idempotent vs Powertools' idempotent_function, per call, on DynamoDB Local"
    )
    parser.add_argument(
        "--endpoint-url",
        default=None,
        help=f"DynamoDB Local on loopback (default: ${ENDPOINT_VARIABLE})",
    )
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument(
        "--calls", type=int, default=50, help="calls per contender per case per round"
    )
    parser.add_argument("--warmup-rounds", type=int, default=1)
    args = parser.parse_args(argv)
    endpoint = resolve_endpoint(args.endpoint_url)
    heading("functions: idempotent vs Powertools' idempotent_function, on DynamoDB Local")
    result = run(endpoint, args.rounds, args.calls, args.warmup_rounds)
    print(result.report(), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
