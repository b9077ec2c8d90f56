"""A property of the test tools, not of this package: moto's server does not make a
conditional PutItem atomic, so concurrency claims are never proven on moto.

moto's ``ThreadedMotoServer`` serves every request on its own thread (werkzeug's
``make_server(..., threaded=True)``), and its DynamoDB backend takes no lock around a
conditional write: ``moto/dynamodb/models/table.py`` ``Table.put_item`` reads the current
item (``current = self.get_item(...)``), parses and evaluates the ConditionExpression against
it, and only then stores the new item (``self.items[hash_value] = item``). Python may switch
threads anywhere in between, so two PutItems on one key, each with
``attribute_not_exists(pk)``, can both read "absent" and both succeed. On DynamoDB each
conditional write is atomic and exactly one of them wins.

This is why ``test_simultaneous_duplicates_from_async_clients_run_the_handler_once
[wsgi-dynamodb]`` once saw two 201s and "claim was taken over while the handler ran" on a
fresh clone: two claims of one key both won on moto. tests/e2e/test_concurrency.py now runs on
MemoryStore, SQLiteStore and DynamoDB Local, whose claims are atomic; moto keeps the
wire-protocol tests.

The race needs the interpreter to switch threads inside that short window. At CPython's
default switch interval (5 ms) it is rare: here about 1 burst of 4 writers in 300 had two
winners (0 in 100 bursts of 24), which is why the suite's moto case failed only once in a
while. The test shortens the interval while it runs, which only makes thread switches more
frequent (moto's code is unchanged): then about 1 burst in 10 has two winners, and the test
sends bursts until one does.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.conftest import REGION

WRITERS = 4  # simultaneous PutItems per burst
# moto: the bursts sent at most before giving up on seeing two winners. Measured here, two
# winners came after 11 bursts on average (2 to 36 in 10 runs); at a rate of 1 in 20 bursts,
# 400 bursts all with one winner has a chance of 0.95**400, about 1e-9.
MOTO_MAX_BURSTS = 400
# DynamoDB Local: every one of these bursts must have exactly one winner.
LOCAL_BURSTS = 100
SWITCH_INTERVAL_SECONDS = 1e-4


def conditional_put(client: Any, table: str, key: str, writer: int) -> bool:
    """PutItem ``key`` only if it does not exist; whether this writer won."""
    try:
        client.put_item(
            TableName=table,
            Item={"pk": {"S": key}, "writer": {"N": str(writer)}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    except client.exceptions.ConditionalCheckFailedException:
        return False
    return True


def burst(clients: list[Any], table: str) -> int:
    """``WRITERS`` conditional PutItems of one new key, released together; how many won."""
    key = uuid.uuid4().hex
    barrier = threading.Barrier(len(clients), timeout=60)
    winners: list[int] = []
    lock = threading.Lock()

    def write(writer: int) -> None:
        barrier.wait(timeout=10)
        if conditional_put(clients[writer], table, key, writer):
            with lock:
                winners.append(writer)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return len(winners)


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads every 100 us instead of every 5 ms while the test runs."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@contextlib.contextmanager
def writers_on(endpoint: str) -> Iterator[tuple[list[Any], str]]:
    """A fresh table on ``endpoint`` and one client per writer (one attempt each)."""
    config = Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=10)
    session = boto3.session.Session(region_name=REGION)
    clients = [
        session.client("dynamodb", endpoint_url=endpoint, config=config) for _ in range(WRITERS)
    ]
    table = f"atomicity-{uuid.uuid4().hex[:12]}"
    try:
        clients[0].create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        clients[0].get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 0.2, "MaxAttempts": 50}
        )
        yield clients, table
    finally:
        with contextlib.suppress(Exception):
            clients[0].delete_table(TableName=table)
        for client in clients:
            client.close()


@pytest.mark.usefixtures("frequent_thread_switches")
def test_moto_server_lets_two_simultaneous_conditional_puts_of_one_key_both_succeed(
    moto_endpoint: str,
) -> None:
    """Documents moto (see the module docstring): not a test of this package."""
    winners_per_burst: list[int] = []
    with writers_on(moto_endpoint) as (clients, table):
        while len(winners_per_burst) < MOTO_MAX_BURSTS:
            winners_per_burst.append(burst(clients, table))
            if winners_per_burst[-1] >= 2:
                break
    assert all(winners >= 1 for winners in winners_per_burst)
    assert max(winners_per_burst) >= 2, (
        f"no burst of {WRITERS} conditional PutItems had two winners on moto in "
        f"{len(winners_per_burst)} bursts: has moto made conditional writes atomic?"
    )


# Its id, [dynamodb-local], is what scripts/dynamodb-local.sh selects; without DynamoDB Local
# (a normal run) the ``dynamodb_local_endpoint`` fixture skips it.
@pytest.mark.parametrize("backend", ["dynamodb-local"])
@pytest.mark.usefixtures("frequent_thread_switches")
def test_exactly_one_of_simultaneous_conditional_puts_of_one_key_succeeds_on_dynamodb_local(
    backend: str, dynamodb_local_endpoint: str
) -> None:
    """The same bursts on DynamoDB Local: the atomic conditional write the claim relies on."""
    assert backend == "dynamodb-local"
    with writers_on(dynamodb_local_endpoint) as (clients, table):
        winners_per_burst = [burst(clients, table) for _ in range(LOCAL_BURSTS)]
    assert winners_per_burst == [1] * LOCAL_BURSTS
