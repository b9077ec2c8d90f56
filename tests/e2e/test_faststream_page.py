"""The consumers page's FastStream programs, run as the page shows them.

Each broker's tab includes the ``show`` section of ``docs/snippets/consumers-faststream-*.py``;
here that section, cut out exactly as the page shows it, is written to a file of its own and
run: as a process (``python orders.py``) against the real Redis, RabbitMQ and NATS servers the
fixtures start on 127.0.0.1, and imported as a module on FastStream's ``TestKafkaBroker`` for
Kafka (no Kafka server can be installed here). The program's handler ships an order by
calling a warehouse over HTTP: the ``Warehouse`` below is that service, a real HTTP server,
and counts the runs (a handler run is one call). Each test proves the page's four promises:
a new message runs once, a duplicate is acknowledged without running, a ``retry`` comes again
and is then handled, and a ``dead`` message is parked where the page says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aio_pika
import faststream.kafka.message
import nats.js.errors
import pytest
import redis.asyncio as aioredis
from faststream.kafka import KafkaBroker, TestKafkaBroker
from faststream.nats import NatsBroker
from faststream.rabbit import RabbitBroker
from faststream.redis import RedisBroker

from tests.support.broker_servers import nats_url, rabbitmq_url

__all__ = ["nats_url", "rabbitmq_url"]  # session fixtures used here

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
PAGE = ROOT / "docs" / "consumers.md"
BROKERS = {
    "Redis streams": "consumers-faststream-redis.py",
    "RabbitMQ": "consumers-faststream-rabbit.py",
    "NATS JetStream": "consumers-faststream-nats.py",
    "Kafka": "consumers-faststream-kafka.py",
}
# Generous: a Redis retry waits for the claimer (min_idle_time), and the machine is shared.
WAIT_SECONDS = 120.0
STARTED = "FastStream app started successfully"


def shown(snippet: str) -> str:
    """The ``show`` section of a snippet file, as pymdownx.snippets includes it."""
    text = (SNIPPETS / snippet).read_text()
    found = re.search(r"^# --8<-- \[start:show\]\n(.*?)^# --8<-- \[end:show\]\n", text, re.S | re.M)
    assert found, f"{snippet} has no show section"
    return found.group(1)


def test_the_page_shows_each_brokers_program_in_its_own_tab() -> None:
    page = PAGE.read_text()
    section = page[page.index("## FastStream") : page.index("## Celery")]
    for tab, snippet in BROKERS.items():
        included = f'=== "{tab}"\n\n    ```python\n    --8<-- "docs/snippets/{snippet}:show"\n'
        assert included in section, tab


# --- what the programs call: a warehouse over HTTP ------------------------------------------


class Warehouse:
    """The shipping service the page's handler calls (``POST /shipments``), on 127.0.0.1:
    it records each call's order id and answer, and fails the calls it is told to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: list[tuple[int, int]] = []
        self._failures_left: dict[int, int] = {}
        warehouse = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                order = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = warehouse._answer(int(order["id"]))
                body = json.dumps({"shipment": f"shipment-{order['id']}"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _answer(self, order_id: int) -> int:
        with self._lock:
            failing = self._failures_left.get(order_id, 0) > 0
            if failing:
                self._failures_left[order_id] -= 1
            status = 503 if failing else 200
            self._answers.append((order_id, status))
            return status

    def fail(self, order_id: int, times: int) -> None:
        """Answer the next ``times`` calls for ``order_id`` with 503."""
        with self._lock:
            self._failures_left[order_id] = times

    def answers(self, order_id: int) -> list[int]:
        """The statuses the calls for ``order_id`` were answered, in order: its runs."""
        with self._lock:
            return [status for called, status in self._answers if called == order_id]

    def __enter__(self) -> Warehouse:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def warehouse() -> Iterator[Warehouse]:
    with Warehouse() as running:
        yield running


# --- running a program ------------------------------------------------------------------------


class Program:
    """A page's program running as a process: its output, and whether it has started."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self.started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if STARTED in line:
                self.started.set()
        self.started.set()  # it exited: nothing more to wait for

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_started(self) -> None:
        assert self.started.wait(WAIT_SECONDS), f"not started:\n{self.output}"
        assert self.process.poll() is None, f"the program exited:\n{self.output}"

    def stop(self) -> int:
        """SIGTERM, as a deployment stops a worker; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(WAIT_SECONDS)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._reader.join(WAIT_SECONDS)
        return status


@contextmanager
def running(snippet: str, directory: Path, **environment: str) -> Iterator[Program]:
    """The snippet's shown code saved as ``orders.py`` in ``directory`` and run there as a
    program (``python orders.py``), until the block ends; it must then stop cleanly."""
    program = directory / "orders.py"
    program.write_text(shown(snippet))
    process = subprocess.Popen(
        [sys.executable, str(program)],
        cwd=directory,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = Program(process)
    try:
        started.wait_started()
        yield started
    finally:
        status = started.stop()
    assert status == 0, f"the program exited with {status}:\n{started.output}"


async def eventually(condition: Callable[[], Awaitable[bool]], what: str, program: Any) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` (with the program's
    output) after ``WAIT_SECONDS``."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            output = getattr(program, "output", "")
            raise AssertionError(f"{what}: not within {WAIT_SECONDS} s\n{output}")
        await asyncio.sleep(0.05)


def new_key() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


# --- Redis streams ----------------------------------------------------------------------------


@asynccontextmanager
async def redis_producer(url: str) -> AsyncIterator[RedisBroker]:
    broker = RedisBroker(url)
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.stop()


async def test_the_redis_streams_program_runs_once_redelivers_a_retry_and_parks_a_dead(
    redis_url: str, warehouse: Warehouse, tmp_path: Path
) -> None:
    client = aioredis.from_url(redis_url)
    await client.delete("orders", "orders-dead")  # the page's names: this test's own
    warehouse.fail(2, times=1)  # order 2: one outage, then shipped
    warehouse.fail(3, times=99)  # order 3: never shipped

    async def group() -> dict[str, Any]:
        [shipping] = await client.xinfo_groups("orders")
        return {name.replace("-", "_"): value for name, value in shipping.items()}

    try:
        async with redis_producer(redis_url) as producer:
            with running(
                "consumers-faststream-redis.py",
                tmp_path,
                REDIS_URL=redis_url,
                WAREHOUSE_URL=warehouse.url,
            ) as program:
                first = new_key()
                await producer.publish(
                    {"id": 1}, stream="orders", headers={"Idempotency-Key": first}
                )
                duplicate = await producer.publish(
                    {"id": 1}, stream="orders", headers={"Idempotency-Key": first}
                )

                async def both_acknowledged() -> bool:
                    found = await group()
                    return bool(found["last_delivered_id"] == duplicate and found["pending"] == 0)

                await eventually(both_acknowledged, "the message and its duplicate acked", program)
                assert warehouse.answers(1) == [200]  # one run: the duplicate replayed

                for order in (2, 3):
                    await producer.publish(
                        {"id": order}, stream="orders", headers={"Idempotency-Key": new_key()}
                    )

                async def shipped_after_an_outage() -> bool:
                    return warehouse.answers(2) == [503, 200]

                await eventually(shipped_after_an_outage, "order 2 claimed again", program)

                async def parked() -> bool:
                    return await client.xlen("orders-dead") == 1

                await eventually(parked, "order 3 on orders-dead", program)
                assert warehouse.answers(3) == [503, 503, 503]  # max_attempts=3
                entries: list[Any] = list(await client.xrange("orders-dead") or [])
                [(_, fields)] = entries
                assert b'{"id":3}' in fields[b"__data__"]

                async def nothing_pending() -> bool:
                    return bool((await group())["pending"] == 0)

                await eventually(nothing_pending, "every entry acknowledged", program)
                assert warehouse.answers(1) == [200] and warehouse.answers(2) == [503, 200]
    finally:
        await client.delete("orders", "orders-dead")
        await client.aclose()


# --- RabbitMQ -----------------------------------------------------------------------------------


async def queue_depth(url: str, name: str) -> int:
    """How many messages are ready in queue ``name`` (asked on a connection of its own)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        count: int = queue.declaration_result.message_count
        return count


async def delete_queues(url: str, *names: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in names:
            await channel.queue_delete(name)


async def test_the_rabbitmq_program_runs_once_redelivers_a_retry_and_dead_letters_a_dead(
    rabbitmq_url: str, warehouse: Warehouse, tmp_path: Path
) -> None:
    await delete_queues(rabbitmq_url, "orders", "orders-dead")  # the page's names
    warehouse.fail(2, times=1)
    warehouse.fail(3, times=99)
    producer = RabbitBroker(rabbitmq_url, logger=None)
    await producer.connect()
    try:
        with running(
            "consumers-faststream-rabbit.py",
            tmp_path,
            RABBITMQ_URL=rabbitmq_url,
            WAREHOUSE_URL=warehouse.url,
        ) as program:
            first = new_key()
            # A reply comes only from an ack: the duplicate's is the first run's, replayed.
            replies = [
                await (
                    await producer.request(
                        {"id": 1},
                        "orders",
                        headers={"Idempotency-Key": first},
                        timeout=WAIT_SECONDS,
                    )
                ).decode()
                for _ in range(2)
            ]
            assert replies == [{"shipment": "shipment-1"}] * 2
            assert warehouse.answers(1) == [200]

            for order in (2, 3):
                await producer.publish(
                    {"id": order}, "orders", headers={"Idempotency-Key": new_key()}
                )

            async def shipped_after_an_outage() -> bool:
                return warehouse.answers(2) == [503, 200]

            await eventually(shipped_after_an_outage, "order 2 delivered again", program)

            async def dead_lettered() -> bool:
                return await queue_depth(rabbitmq_url, "orders-dead") == 1

            await eventually(dead_lettered, "order 3 in orders-dead", program)
            assert warehouse.answers(3) == [503, 503, 503]  # max_attempts=3
        # Stopped: a message delivered but not answered would be back in the queue now.
        assert await queue_depth(rabbitmq_url, "orders") == 0
        connection = await aio_pika.connect(rabbitmq_url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("orders-dead", passive=True)
            parked = await queue.get(timeout=WAIT_SECONDS)
            assert parked is not None and json.loads(parked.body) == {"id": 3}
    finally:
        await producer.stop()
        await delete_queues(rabbitmq_url, "orders", "orders-dead")


# --- NATS JetStream -------------------------------------------------------------------------


async def delete_streams(jetstream: Any) -> None:
    for name in ("ORDERS", "ORDERS_DEAD"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await jetstream.delete_stream(name)


async def test_the_nats_jetstream_program_runs_once_redelivers_a_retry_and_parks_a_dead(
    nats_url: str, warehouse: Warehouse, tmp_path: Path
) -> None:
    producer = NatsBroker(nats_url, logger=None)
    await producer.connect()
    jetstream = producer._connection.jetstream()  # type: ignore[union-attr]
    await delete_streams(jetstream)  # the page's names: this test's own
    warehouse.fail(2, times=1)
    warehouse.fail(3, times=99)
    try:
        with running(
            "consumers-faststream-nats.py",
            tmp_path,
            NATS_URL=nats_url,
            WAREHOUSE_URL=warehouse.url,
        ) as program:
            first = new_key()
            await producer.publish(
                {"id": 1}, "orders", stream="ORDERS", headers={"Idempotency-Key": first}
            )
            duplicate = await producer.publish(
                {"id": 1}, "orders", stream="ORDERS", headers={"Idempotency-Key": first}
            )

            async def both_acknowledged() -> bool:
                consumer = await jetstream.consumer_info("ORDERS", "shipping")
                return bool(
                    consumer.delivered.stream_seq >= duplicate.seq and consumer.num_ack_pending == 0
                )

            await eventually(both_acknowledged, "the message and its duplicate acked", program)
            assert warehouse.answers(1) == [200]

            for order in (2, 3):
                # With JetStream's own duplicate detection too: the parked copy keeps it.
                headers = {"Idempotency-Key": new_key(), "Nats-Msg-Id": f"order-{order}"}
                await producer.publish({"id": order}, "orders", stream="ORDERS", headers=headers)

            async def shipped_after_an_outage() -> bool:
                return warehouse.answers(2) == [503, 200]

            await eventually(shipped_after_an_outage, "order 2 delivered again", program)

            async def parked() -> bool:
                info = await jetstream.stream_info("ORDERS_DEAD")
                return bool(info.state.messages == 1)

            await eventually(parked, "order 3 under orders.dead", program)
            assert warehouse.answers(3) == [503, 503, 503]  # max_attempts=3
            dead = await jetstream.get_last_msg("ORDERS_DEAD", "orders.dead")
            assert json.loads(dead.data or b"") == {"id": 3}

            async def nothing_pending() -> bool:
                consumer = await jetstream.consumer_info("ORDERS", "shipping")
                return bool(consumer.num_ack_pending == 0 and consumer.num_pending == 0)

            await eventually(nothing_pending, "every message answered", program)
            assert warehouse.answers(3) == [503, 503, 503]  # terminated: never delivered again
    finally:
        await delete_streams(jetstream)
        await producer.stop()


# --- Kafka (FastStream's test broker) -----------------------------------------------------


async def test_the_kafka_program_on_the_test_broker_runs_once_retries_and_parks_a_dead(
    warehouse: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Kafka server here: the shown code is imported as a module and its broker run on
    ``TestKafkaBroker``, which hands the subscriber records as a consumer would, but seeks
    nowhere: a record read again after a nack is published again here. It gives every record
    offset 0, so each record of this test has a partition of its own (the program counts a
    record's deliveries by its position)."""
    monkeypatch.chdir(tmp_path)  # its SQLite file
    monkeypatch.setenv("WAREHOUSE_URL", warehouse.url)
    program = tmp_path / "orders.py"
    program.write_text(shown("consumers-faststream-kafka.py"))
    module = runpy.run_path(str(program), run_name="orders")
    broker: KafkaBroker = module["broker"]
    warehouse.fail(2, times=1)
    warehouse.fail(3, times=99)
    parked: list[dict[str, Any]] = []

    @broker.subscriber("orders-dead")
    async def read_orders_dead(order: dict[str, Any]) -> None:
        parked.append(order)

    # The test broker's consumer: what the middleware asked of Kafka.
    answered: list[str] = []

    async def commit(consumer: Any) -> None:
        answered.append("commit")

    def seek(consumer: Any, partition: Any, offset: int) -> None:
        answered.append(f"seek to {partition.partition}:{offset}")

    monkeypatch.setattr(faststream.kafka.message.FakeConsumer, "commit", commit)
    monkeypatch.setattr(faststream.kafka.message.FakeConsumer, "seek", seek)

    async with TestKafkaBroker(broker) as test_broker:

        async def deliver(order: int, key: str, partition: int) -> Any:
            """One read of a record; the reply (only an ack has one)."""
            answered.clear()
            reply = await test_broker.request(
                {"id": order},
                "orders",
                partition=partition,
                headers={"Idempotency-Key": key},
                timeout=WAIT_SECONDS,  # the default, 0.5 s, is short for a loaded machine
            )
            return await reply.decode() if reply.body else None

        first = new_key()
        assert await deliver(1, first, partition=0) == {"shipment": "shipment-1"}
        assert answered == ["commit"]
        # The producer's retry (a new record, another position): committed, replayed.
        assert await deliver(1, first, partition=1) == {"shipment": "shipment-1"}
        assert answered == ["commit"]
        assert warehouse.answers(1) == [200]

        retried = new_key()
        assert await deliver(2, retried, partition=2) is None
        assert answered == ["seek to 2:0"]  # read again: here, published again
        assert await deliver(2, retried, partition=2) == {"shipment": "shipment-2"}
        assert answered == ["commit"]
        assert warehouse.answers(2) == [503, 200]

        dead = new_key()
        for _ in range(2):
            assert await deliver(3, dead, partition=3) is None
            assert answered == ["seek to 3:0"]
        assert await deliver(3, dead, partition=3) is None
        assert answered == ["commit"]  # the third: parked, then committed
        assert warehouse.answers(3) == [503, 503, 503]  # max_attempts=3
        assert parked == [{"id": 3}]
