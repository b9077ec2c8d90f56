"""Exactly-once business writes across a crash: the server process is killed with SIGKILL at
the two worst moments of a commit, and a new process serves the retries.

- Before the commit: the handler ran and its ``TransactWriteItems`` (the order, the stock
  decrement, the completion) is on the wire, held by the fault proxy (``hang``), when the
  process dies. Nothing landed, the key is still claimed; retries get 409 until the dead
  owner's lock runs out, then one retry runs the handler again and commits once.
- After the commit: DynamoDB applied the transaction and answered, the proxy dropped the
  answer (``swallow``), the process dies before its response goes out. Everything landed;
  a retry gets the response the dead process would have sent, replayed, and so does every
  later retry.

Either way the orders table holds the order exactly once and the stock is decremented once.
The servers run ``tests/support/transaction_crash_app.py`` (FastAPI on uvicorn, Flask on waitress)
in subprocesses, their store talking to DynamoDB through a ``FaultProxy`` in this process;
their clock is a ``FileClock`` this test moves past the lock instead of sleeping. On moto
and on Amazon's DynamoDB Local (ids with ``dynamodb-local``: ``scripts/dynamodb-local.sh``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import boto3
import httpx
import orjson
import pytest

from idempotency_middleware import DynamoDBStore
from idempotency_middleware.stores.records import Record, Status
from tests.support.faultproxy import REGION, FaultProxy
from tests.support.file_clock import FileClock
from tests.support.servers import HOST, UVICORN_LISTENING, WAITRESS_LISTENING, server_process

REPO_ROOT = Path(__file__).resolve().parents[2]
# Long, so that no real time on a loaded machine ever crosses it: the test moves the
# servers' clock past it instead.
LOCK_SECONDS = 60.0
START_TIMEOUT_SECONDS = 30.0  # a cold FastAPI + aioboto3 import on a loaded machine
WAIT_TIMEOUT_SECONDS = 20.0  # for a condition polled while the servers work
CLIENT_TIMEOUT_SECONDS = 30.0
SKU = "widget"
STOCK = 10
COMMIT = "TransactWriteItems"

Adapter = Literal["asgi", "wsgi"]


@pytest.fixture(params=["moto", "dynamodb-local"])
def upstream(request: pytest.FixtureRequest) -> str:
    """The DynamoDB endpoint: moto, or DynamoDB Local (its atomic conditional writes)."""
    fixture = "moto_endpoint" if request.param == "moto" else "dynamodb_local_endpoint"
    endpoint: str = request.getfixturevalue(fixture)
    return endpoint


@dataclass
class Shop:
    """The tables, the fault proxy in front of them, and the servers' shared files."""

    upstream: str
    proxy: FaultProxy
    directory: Path
    dynamodb: Any  # a boto3 client straight to ``upstream``
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def table(self) -> str:
        return f"idem-{self.suffix}"

    @property
    def orders_table(self) -> str:
        return f"orders-{self.suffix}"

    @property
    def stock_table(self) -> str:
        return f"stock-{self.suffix}"

    @property
    def runs_file(self) -> Path:
        return self.directory / "runs.txt"

    @property
    def clock(self) -> FileClock:
        return FileClock(self.directory / "clock.txt")

    def create_tables(self) -> None:
        with DynamoDBStore(self.table, endpoint_url=self.upstream, region_name=REGION) as store:
            store.create_table()
        for name, key in ((self.orders_table, "order_id"), (self.stock_table, "sku")):
            self.dynamodb.create_table(
                TableName=name,
                KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            self.dynamodb.get_waiter("table_exists").wait(
                TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
            )
        self.dynamodb.put_item(
            TableName=self.stock_table, Item={"sku": {"S": SKU}, "count": {"N": str(STOCK)}}
        )

    @contextlib.contextmanager
    def server(self, adapter: Adapter) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
        """The app in a subprocess on a port of its own, its store behind the proxy; killed
        at the end if still running."""
        if adapter == "asgi":
            command = [sys.executable, "-m", "uvicorn", "--factory"]
            command += ["tests.support.transaction_crash_app:create_asgi_app", "--host", HOST]
            command += ["--port", "0", "--log-level", "info", "--lifespan", "off"]
            listening = UVICORN_LISTENING
        else:
            command = [sys.executable, "-m", "waitress", f"--listen={HOST}:0", "--call"]
            command += ["tests.support.transaction_crash_app:create_wsgi_app"]
            listening = WAITRESS_LISTENING
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "NO_PROXY": "127.0.0.1,localhost",
            "TXN_CRASH_ENDPOINT": self.proxy.url,
            "TXN_CRASH_TABLE": self.table,
            "TXN_CRASH_ORDERS_TABLE": self.orders_table,
            "TXN_CRASH_STOCK_TABLE": self.stock_table,
            "TXN_CRASH_RUNS_FILE": str(self.runs_file),
            "TXN_CRASH_CLOCK_FILE": str(self.directory / "clock.txt"),
            "TXN_CRASH_LOCK_SECONDS": str(LOCK_SECONDS),
        }
        with server_process(
            command,
            env=env,
            log=self.directory / f"{adapter}.log",
            listening=listening,
            timeout=START_TIMEOUT_SECONDS,
        ) as started:
            yield started

    def log(self) -> str:
        return "\n".join(path.read_text() for path in sorted(self.directory.glob("*.log")))

    # --- what DynamoDB holds, read straight from it -----------------------------------

    def orders(self) -> list[dict[str, Any]]:
        result = self.dynamodb.scan(TableName=self.orders_table, ConsistentRead=True)
        items: list[dict[str, Any]] = result["Items"]
        return items

    def stock(self) -> int:
        item = self.dynamodb.get_item(
            TableName=self.stock_table, Key={"sku": {"S": SKU}}, ConsistentRead=True
        )["Item"]
        return int(item["count"]["N"])

    def record(self) -> Record:
        """The one idempotency record (the table holds no other)."""
        items = self.dynamodb.scan(TableName=self.table, ConsistentRead=True)["Items"]
        assert len(items) == 1, items
        with DynamoDBStore(self.table, endpoint_url=self.upstream, region_name=REGION) as store:
            record = store.get(items[0]["pk"]["S"])
        assert record is not None
        return record

    def runs(self) -> list[tuple[int, bytes]]:
        """Every handler run so far: the process and the response body it built."""
        if not self.runs_file.exists():
            return []
        lines = self.runs_file.read_bytes().splitlines()
        return [(int(pid), body) for pid, _, body in (line.partition(b" ") for line in lines)]


@pytest.fixture
def shop(upstream: str, tmp_path: Path) -> Iterator[Shop]:
    dynamodb = boto3.client("dynamodb", endpoint_url=upstream, region_name=REGION)
    try:
        with FaultProxy(upstream) as proxy:
            made = Shop(upstream, proxy, tmp_path, dynamodb)
            made.create_tables()
            yield made
    finally:
        dynamodb.close()


def wait_for(condition: Callable[[], bool], what: str, shop: Shop) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {WAIT_TIMEOUT_SECONDS} s: {shop.log()}"
        time.sleep(0.02)


def post_order(url: str, key: str, order_id: str) -> httpx.Response:
    return httpx.post(
        f"{url}/orders",
        content=orjson.dumps({"order_id": order_id, "sku": SKU, "quantity": 1}),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        timeout=CLIENT_TIMEOUT_SECONDS,
        trust_env=False,
    )


def kill_during_commit(shop: Shop, adapter: Adapter, key: str, order_id: str, moment: str) -> int:
    """Send the first request to a new server and SIGKILL it once the proxy ``moment``
    (``seen``: holds the commit; ``answered``: upstream answered it); the dead pid."""
    outcome: list[httpx.Response | BaseException] = []

    def first_request(url: str) -> None:
        try:
            outcome.append(post_order(url, key, order_id))
        except httpx.HTTPError as error:
            outcome.append(error)

    with shop.server(adapter) as (first, url):
        client = threading.Thread(target=first_request, args=(url,), daemon=True)
        client.start()
        try:
            watched = shop.proxy.operations if moment == "seen" else shop.proxy.answered
            wait_for(lambda: COMMIT in watched() or bool(outcome), f"the commit {moment}", shop)
            assert not outcome, f"the first request ended before the kill: {answered(outcome)}"
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        finally:
            first.kill()  # (already dead unless an assertion failed: then its client ends too)
            first.wait(10)
            client.join(CLIENT_TIMEOUT_SECONDS)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
    assert shop.proxy.operations().count(COMMIT) == 1, shop.proxy.operations()
    return first.pid


def answered(outcome: list[httpx.Response | BaseException]) -> list[str]:
    return [
        f"{o.status_code} {o.text}" if isinstance(o, httpx.Response) else repr(o) for o in outcome
    ]


def assert_replays(shop: Shop, url: str, key: str, order_id: str, expected: bytes) -> None:
    """Every later retry gets the same bytes, replayed, and runs nothing."""
    runs = shop.runs()
    for _ in range(3):
        replay = post_order(url, key, order_id)
        assert replay.status_code == 201, replay.text
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.headers["content-type"] == "application/json"
        assert replay.content == expected
    assert shop.runs() == runs


ADAPTERS = pytest.mark.parametrize("adapter", ["asgi", "wsgi"])


@ADAPTERS
def test_killed_after_the_handler_before_the_commit_nothing_lands_and_a_retry_commits_once(
    shop: Shop, adapter: Adapter
) -> None:
    key, order_id = f"order-{uuid.uuid4().hex}", f"o-{uuid.uuid4().hex[:8]}"
    shop.proxy.set("hang", operations={COMMIT})
    dead = kill_during_commit(shop, adapter, key, order_id, "seen")

    # Nothing landed: no order, the stock untouched, the key still claimed by the dead owner.
    ((pid, unsent),) = shop.runs()
    assert pid == dead
    assert shop.orders() == []
    assert shop.stock() == STOCK
    held = shop.record()
    assert held.status is Status.IN_PROGRESS and held.response is None

    shop.proxy.set("pass")
    with shop.server(adapter) as (second, url):
        # The dead owner's lease holds the key: 409, and nothing runs or lands.
        for _ in range(2):
            refused = post_order(url, key, order_id)
            assert refused.status_code == 409, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert int(refused.headers["retry-after"]) >= 1
        assert len(shop.runs()) == 1 and shop.orders() == [] and shop.stock() == STOCK

        # Past the lease (by the servers' clock): the retry takes over and runs once.
        shop.clock.advance(held.lock_expires_at - shop.clock.now() + 1)
        taken = post_order(url, key, order_id)
        assert taken.status_code == 201, taken.text
        assert taken.headers.get("idempotent-replayed") is None
        assert shop.runs() == [(dead, unsent), (second.pid, taken.content)]
        answer = orjson.loads(taken.content)
        assert answer["receipt"] != orjson.loads(unsent)["receipt"]  # a run of its own
        assert answer["order_id"] == order_id and answer["pid"] == second.pid

        orders = shop.orders()
        assert len(orders) == 1, orders
        assert orders[0]["order_id"]["S"] == order_id
        assert orders[0]["receipt"]["S"] == answer["receipt"]
        assert shop.stock() == STOCK - 1
        done = shop.record()
        assert done.status is Status.COMPLETED and done.response is not None
        assert done.response.body == taken.content

        assert_replays(shop, url, key, order_id, taken.content)
    assert len(shop.orders()) == 1 and shop.stock() == STOCK - 1


@ADAPTERS
def test_killed_after_the_commit_before_the_response_a_retry_replays_what_it_would_have_sent(
    shop: Shop, adapter: Adapter
) -> None:
    key, order_id = f"order-{uuid.uuid4().hex}", f"o-{uuid.uuid4().hex[:8]}"
    shop.proxy.set("swallow", operations={COMMIT})
    dead = kill_during_commit(shop, adapter, key, order_id, "answered")

    # The commit landed whole: the order, the stock decrement and the completed record.
    ((pid, unsent),) = shop.runs()
    assert pid == dead
    unsent_answer = orjson.loads(unsent)
    orders = shop.orders()
    assert len(orders) == 1, orders
    assert orders[0]["order_id"]["S"] == order_id
    assert orders[0]["receipt"]["S"] == unsent_answer["receipt"]
    assert orders[0]["quantity"]["N"] == str(Decimal(1))
    assert shop.stock() == STOCK - 1
    stored = shop.record()
    assert stored.status is Status.COMPLETED and stored.response is not None
    assert stored.response.status == 201
    assert stored.response.body == unsent

    shop.proxy.set("pass")
    with shop.server(adapter) as (_, url):
        replay = post_order(url, key, order_id)
        assert replay.status_code == 201, replay.text
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.content == unsent == stored.response.body
        assert_replays(shop, url, key, order_id, unsent)
    assert shop.runs() == [(dead, unsent)]
    assert len(shop.orders()) == 1 and shop.stock() == STOCK - 1
    assert shop.proxy.answered().count(COMMIT) == 1
