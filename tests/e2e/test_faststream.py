"""``IdempotencyFastStreamMiddleware`` on real brokers: RabbitMQ and NATS JetStream servers
and a Redis stream (started by fixtures on 127.0.0.1), Kafka through FastStream's test
broker (no Kafka server can be installed here).

On each: a new message runs once and is acked; the same message delivered again replays
without running; a failing handler's message is nacked and delivered again by the broker
until its ``max_attempts``-th delivery, which is rejected after ``on_exhausted``. What each
delivery was answered is read off the message by an outer middleware (``Answers``), and
what the broker did with it off the broker (a queue's counts, a dead-letter queue).
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import runpy
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import faststream.kafka.message
import pytest
from faststream import AckPolicy, BaseMiddleware
from faststream.kafka import KafkaBroker, TestKafkaBroker
from faststream.message import StreamMessage
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue, TestRabbitBroker
from faststream.redis import RedisBroker, StreamSub

from idempotency_middleware import (
    Encryption,
    InvalidKeyError,
    MemoryStore,
    RedisStore,
    idempotent,
)
from idempotency_middleware.consumers.faststream import RETRY_PAUSE_SECONDS
from idempotency_middleware.faststream import (
    IdempotencyFastStreamMiddleware,
    header_or_message_id,
    subscriber_name,
)
from idempotency_middleware.functions.attempts import function_key_hash
from idempotency_middleware.testing import FakeClock
from tests.support.broker_servers import nats_url, rabbitmq_url
from tests.support.raw_records import RawStore

__all__ = ["nats_url", "rabbitmq_url"]  # session fixtures used here

WAIT_SECONDS = 20.0
QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "quickstart"


class Boom(Exception):
    pass


class Answers:
    """An outer middleware recording how each delivery was answered (``ACKED``,
    ``NACKED``, ``REJECTED``), and waiting for a number of answers."""

    def __init__(self, only: bytes = b'"order"', but_not: bytes | None = None) -> None:
        self.only = only  # the messages to record: those whose body holds this
        self.but_not = but_not  # ...and not this
        self.seen: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, msg: Any, /, *, context: Any) -> BaseMiddleware[Any, Any]:
        answers = self

        class Scope(BaseMiddleware[Any, Any]):
            async def consume_scope(
                self, call_next: Callable[[Any], Awaitable[Any]], msg: StreamMessage[Any]
            ) -> Any:
                try:
                    return await call_next(msg)
                finally:
                    if answers.only in msg.body and not (
                        answers.but_not is not None and answers.but_not in msg.body
                    ):
                        answers.seen.append(str(getattr(msg.committed, "value", msg.committed)))
                        answers._changed.set()

        return Scope(msg, context=context)

    async def wait_for(self, count: int) -> list[str]:
        async def enough() -> None:
            while len(self.seen) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(enough(), WAIT_SECONDS)
        return self.seen


async def eventually(condition: Callable[[], Awaitable[bool]]) -> None:
    """Polls ``condition`` until it holds (``AssertionError`` after ``WAIT_SECONDS``)."""
    for _ in range(int(WAIT_SECONDS / 0.02)):
        if await condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{condition} did not hold within {WAIT_SECONDS} s")


class Story:
    """A handler that records its runs and raises while ``failing``, and the dead letters
    ``on_exhausted`` was given."""

    def __init__(self, failing: bool = False) -> None:
        self.runs: list[Any] = []
        self.dead: list[tuple[Any, Exception]] = []
        self.failing = failing

    def middleware(self, store: Any = None, **options: Any) -> IdempotencyFastStreamMiddleware:
        return IdempotencyFastStreamMiddleware(
            store=store or MemoryStore(),
            on_exhausted=lambda message, error: self.dead.append((message.body, error)),
            **options,
        )

    def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        self.runs.append(body)
        if self.failing:
            raise Boom(f"run {len(self.runs)}")
        return {"receipt": len(self.runs)}


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- RabbitMQ ------------------------------------------------------------------------------


@pytest.fixture
async def rabbit(rabbitmq_url: str) -> AsyncIterator[Callable[..., RabbitBroker]]:
    brokers: list[RabbitBroker] = []

    def make(*middlewares: Any) -> RabbitBroker:
        broker = RabbitBroker(rabbitmq_url, middlewares=middlewares, logger=None)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        await broker.stop()


def quorum_queue(name: str, dead_letters: str) -> RabbitQueue:
    """A quorum queue (it counts deliveries: ``x-delivery-count``) whose rejected messages
    go to ``dead_letters``."""
    return RabbitQueue(
        name,
        queue_type=QueueType.QUORUM,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_letters},
    )


async def queue_depth(url: str, name: str) -> int:
    """How many messages wait in queue ``name`` (asked on a connection of its own)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        count: int = queue.declaration_result.message_count
        return count


async def test_rabbitmq_runs_a_message_once_and_replays_its_redelivery(
    rabbit: Callable[..., RabbitBroker], rabbitmq_url: str
) -> None:
    story, answers = Story(), Answers()
    broker = rabbit(answers, story.middleware())
    queue = fresh("orders")
    replies: list[Any] = []

    @broker.subscriber(queue)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    @broker.subscriber(f"{queue}-replies")
    async def reply(body: dict[str, Any]) -> None:
        replies.append(body)

    await broker.start()
    for _ in range(2):  # the producer's message id, sent twice
        await broker.publish({"order": 7}, queue, message_id="m-7", reply_to=f"{queue}-replies")
    assert await answers.wait_for(2) == ["ACKED", "ACKED"]
    assert story.runs == [{"order": 7}]

    async def replied() -> bool:
        return len(replies) >= 2

    await eventually(replied)
    assert replies == [{"receipt": 1}, {"receipt": 1}]  # the replay's reply is the first one's
    assert await queue_depth(rabbitmq_url, queue) == 0


async def test_rabbitmq_nacks_a_failure_until_max_attempts_then_dead_letters_it(
    rabbit: Callable[..., RabbitBroker], rabbitmq_url: str
) -> None:
    story, answers = Story(failing=True), Answers()
    broker = rabbit(answers, story.middleware(max_attempts=3))
    queue, dead_letters = fresh("orders"), fresh("orders-dlq")
    await broker.connect()
    await broker.declare_queue(RabbitQueue(dead_letters))

    @broker.subscriber(quorum_queue(queue, dead_letters))
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    await broker.start()
    await broker.publish({"order": 8}, queue, message_id="m-8")
    assert await answers.wait_for(3) == ["NACKED", "NACKED", "REJECTED"]
    assert len(story.runs) == 3  # a nack is delivered again by RabbitMQ, the key released
    assert [(body, str(error)) for body, error in story.dead] == [(b'{"order":8}', "run 3")]

    async def dead_lettered() -> bool:
        return await queue_depth(rabbitmq_url, dead_letters) == 1

    await eventually(dead_lettered)
    assert await queue_depth(rabbitmq_url, queue) == 0


async def test_two_subscribers_of_one_message_keep_their_keys_apart(
    rabbit: Callable[..., RabbitBroker],
) -> None:
    """One message id reaching two functions (a fanout) runs each once: the keys' default
    namespace is the subscriber's function."""
    story, answers = Story(), Answers()
    broker = rabbit(answers, story.middleware())
    emails, invoices = fresh("emails"), fresh("invoices")

    @broker.subscriber(emails)
    async def send_email(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle({**body, "to": "email"})

    @broker.subscriber(invoices)
    async def send_invoice(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle({**body, "to": "invoice"})

    await broker.start()
    for queue in (emails, invoices, emails):
        await broker.publish({"order": 10}, queue, message_id="m-10")
    assert await answers.wait_for(3) == ["ACKED"] * 3
    assert sorted(run["to"] for run in story.runs) == ["email", "invoice"]


# --- NATS JetStream ------------------------------------------------------------------------


@pytest.fixture
async def nats(nats_url: str) -> AsyncIterator[Callable[..., NatsBroker]]:
    brokers: list[NatsBroker] = []

    def make(*middlewares: Any) -> NatsBroker:
        broker = NatsBroker(nats_url, middlewares=middlewares, logger=None)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        await broker.stop()


async def test_nats_jetstream_runs_once_replays_and_terminates_after_max_attempts(
    nats: Callable[..., NatsBroker],
) -> None:
    story, answers = Story(), Answers()
    broker = nats(answers, story.middleware(max_attempts=2))
    subject = fresh("orders")
    stream = JStream(fresh("ORDERS"), subjects=[f"{subject}.>"])

    @broker.subscriber(f"{subject}.ok", stream=stream)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    failing = Story(failing=True)

    @broker.subscriber(f"{subject}.fail", stream=stream)
    async def refund(body: dict[str, Any]) -> dict[str, Any]:
        return failing.handle(body)

    await broker.start()
    for _ in range(2):  # two sends of one logical operation: the producer's header
        await broker.publish(
            {"order": 11}, f"{subject}.ok", stream=stream.name, headers={"Idempotency-Key": "o-11"}
        )
    assert await answers.wait_for(2) == ["ACKED", "ACKED"]
    assert story.runs == [{"order": 11}]

    await broker.publish({"order": 12}, f"{subject}.fail", stream=stream.name)
    assert (await answers.wait_for(4))[2:] == ["NACKED", "REJECTED"]  # num_delivered 1, 2
    assert len(failing.runs) == 2
    assert [str(error) for _, error in story.dead] == ["run 2"]


async def test_a_message_without_key_or_id_is_dead_with_the_fix_named(
    nats: Callable[..., NatsBroker],
) -> None:
    """FastStream's producers set a message id; another producer may not (here a core NATS
    message published with the plain client, no headers)."""
    story, answers = Story(), Answers()
    broker = nats(answers, story.middleware())
    subject = fresh("orders")

    @broker.subscriber(subject)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    await broker.start()
    await broker._connection.publish(subject, b'{"order":9}')  # type: ignore[union-attr]
    assert await answers.wait_for(1) == ["REJECTED"]
    assert story.runs == []
    [(_, error)] = story.dead
    assert isinstance(error, InvalidKeyError)
    assert "Idempotency-Key" in str(error) and "key=" in str(error)


class Passthrough:
    """A middleware listed after the idempotency one: it runs inside it."""

    def __call__(self, msg: Any, /, *, context: Any) -> BaseMiddleware[Any, Any]:
        return BaseMiddleware(msg, context=context)


async def test_nats_duplicate_while_running_is_nacked_with_a_delay_then_replays(
    nats: Callable[..., NatsBroker],
) -> None:
    """Two workers get one operation at once: the second is nacked with ``retry_after`` as
    JetStream's redelivery delay, and when it comes back the first has completed: a replay.
    Another middleware inside this one still runs (the subscriber's name is found through
    it)."""
    story, answers = Story(), Answers()
    # retry_after for a key still held: what is left of its lock (renewed while it runs).
    middleware = story.middleware(lock_timeout_seconds=1)
    broker = nats(answers, middleware, Passthrough())
    subject = fresh("orders")
    stream = JStream(fresh("BUSY"), subjects=[subject])
    release = asyncio.Event()

    @broker.subscriber(subject, stream=stream, max_workers=2)
    async def export(body: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return story.handle(body)

    await broker.start()
    for _ in range(2):
        await broker.publish(
            {"order": 18}, subject, stream=stream.name, headers={"Idempotency-Key": "o-18"}
        )
    assert await answers.wait_for(1) == ["NACKED"]  # the second, while the first waits
    release.set()
    assert await answers.wait_for(3) == ["NACKED", "ACKED", "ACKED"]  # the first; the replay
    assert story.runs == [{"order": 18}]
    expected = f"{__name__}.test_nats_duplicate_while_running_is_nacked_with_a_delay_then_replays"
    assert middleware.consumer(f"{expected}.<locals>.export").forget("o-18")


async def test_nats_pull_subscriber_gets_the_same_answers(
    nats: Callable[..., NatsBroker],
) -> None:
    story, answers = Story(failing=True), Answers()
    broker = nats(answers, story.middleware(max_attempts=2))
    subject = fresh("orders")
    stream = JStream(fresh("PULL"), subjects=[subject])

    @broker.subscriber(subject, stream=stream, durable=fresh("pull"), pull_sub=PullSub(1))
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    await broker.start()
    await broker.publish({"order": 13}, subject, stream=stream.name)
    assert await answers.wait_for(2) == ["NACKED", "REJECTED"]
    assert len(story.runs) == 2 and len(story.dead) == 1


# --- Redis streams -------------------------------------------------------------------------


async def test_redis_stream_acks_replays_and_acks_a_dead_message_after_on_exhausted(
    redis_url: str,
) -> None:
    """A consumer group's pending entries: an ack removes it, a nack leaves it pending to
    be claimed again (``min_idle_time``), and a dead message is acknowledged too, since
    Redis has no dead letters (``on_exhausted`` keeps it)."""
    store = RedisStore(redis_url, prefix=fresh("faststream"))
    story, failing = Story(), Story(failing=True)
    # Each message's answers apart: the claimer may also take an order 14 entry whose ack
    # came after min_idle_time on a loaded machine (a replay, ACKED), which must not count
    # as one of order 15's answers (it did once, in a full run).
    answers, failing_answers = Answers(only=b'"order"', but_not=b'"fail"'), Answers(b'"fail"')
    broker = RedisBroker(
        redis_url, middlewares=[answers, failing_answers, story.middleware(store, max_attempts=2)]
    )
    stream = fresh("orders")
    # A consumer group's usual pair: one reads new entries, one claims those left pending.
    reader = StreamSub(stream, group="workers", consumer="reader", polling_interval=20)
    claimer = StreamSub(
        stream, group="workers", consumer="claimer", min_idle_time=50, polling_interval=20
    )

    @broker.subscriber(stream=reader)
    @broker.subscriber(stream=claimer)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return (failing if body.get("fail") else story).handle(body)

    try:
        await broker.start()
        for _ in range(2):
            await broker.publish({"order": 14}, stream=stream, headers={"Idempotency-Key": "o-14"})
        assert set(await answers.wait_for(2)) == {"ACKED"}  # a late claim: ACKED too
        assert story.runs == [{"order": 14}]
        await broker.publish({"order": 15, "fail": True}, stream=stream)
        # The first delivery is nacked, the claimer's second one is dead and acked; in either
        # order of recording: the first is recorded once its consume scope returns, after it
        # released the key, and on a loaded machine the entry can be idle past min_idle_time
        # by then, so the claimer's delivery may run whole in between (seen once, at a load
        # of 13 on two cores). The runs and the dead message below say which delivery did
        # what.
        # Or the claimer took the entry while the first delivery still ran (idle past
        # min_idle_time on a loaded machine: seen at a load of 15): its delivery found the key
        # in progress and was nacked, and the first, failing, read the entry's delivery count
        # as 2 (Redis counts the claim) and was dead after one run. Either way the message is
        # given up exactly once, after max_attempts deliveries, and never run after.
        assert sorted(await failing_answers.wait_for(2)) == ["ACKED", "NACKED"]
        assert [str(error) for _, error in story.dead] in (["run 2"], ["run 1"])
        assert len(failing.runs) == int(str(story.dead[0][1]).removeprefix("run "))
        pending = await broker._connection.xpending(stream, "workers")  # type: ignore[union-attr]
        assert pending["pending"] == 0
    finally:
        await broker.stop()
        await store.aclose()


# --- Kafka (FastStream's test broker) ------------------------------------------------------


async def duplicate_while_running(
    broker: Any, test_broker_of: Callable[[Any], Any], subscribe: Callable[..., Any]
) -> None:
    """Two deliveries of one key on the broker's test broker, the second while the first
    runs (held on an event until the second was answered)."""
    started, release = asyncio.Event(), asyncio.Event()

    @subscribe
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"receipt": body["order"]}

    headers = {"Idempotency-Key": "o-19"}
    async with test_broker_of(broker) as test_broker:
        first = asyncio.create_task(test_broker.publish({"order": 19}, "orders", headers=headers))
        await asyncio.wait_for(started.wait(), WAIT_SECONDS)
        await test_broker.publish({"order": 19}, "orders", headers=headers)
        release.set()
        await asyncio.wait_for(first, WAIT_SECONDS)


@pytest.mark.parametrize(
    ("policy", "lock_timeout", "wait_seconds", "pause"),
    [
        (AckPolicy.NACK_ON_ERROR, 2, 0, 3.0),  # what is left of the lock, plus the 1 s skew
        (AckPolicy.NACK_ON_ERROR, 60, 0, RETRY_PAUSE_SECONDS),  # at most
        (AckPolicy.NACK_ON_ERROR, 60, 1, RETRY_PAUSE_SECONDS - 1),  # less what it waited
        (AckPolicy.ACK_FIRST, 60, 0, None),  # committed already: the nack does nothing
    ],
)
async def test_kafka_duplicate_of_a_running_record_waits_retry_after_before_its_nack(
    policy: AckPolicy,
    lock_timeout: float,
    wait_seconds: float,
    pause: float | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kafka's nack seeks back, so the record is read again at once: a duplicate of a
    record still running waits what is left of the running one's lock (plus the skew
    margin), at most RETRY_PAUSE_SECONDS and less what it waited (``wait_seconds``), before
    its nack, rather than coming straight back to the store until the first run ends."""
    clock, answers = FakeClock(), Answers()
    middleware = Story().middleware(
        clock=clock, lock_timeout_seconds=lock_timeout, wait_seconds=wait_seconds
    )
    broker = KafkaBroker(middlewares=[answers, middleware], logger=None)
    sought: list[float] = []  # the fake clock's time at each seek back

    def seek(consumer: Any, partition: Any, offset: int) -> None:
        sought.append(clock.now())

    monkeypatch.setattr(faststream.kafka.message.FakeConsumer, "seek", seek)
    subscribe = broker.subscriber("orders", group_id="billing", ack_policy=policy)
    await duplicate_while_running(broker, TestKafkaBroker, subscribe)
    if pause is None:
        assert clock.slept == [] and sought == []
        assert answers.seen == ["ACKED", "ACKED"]
        return
    assert clock.slept[-1] == pytest.approx(pause)
    assert sum(clock.slept) <= max(pause, wait_seconds + pause) + 1e-6
    assert sought == [pytest.approx(clock.now())]  # the nack came after the pause
    assert answers.seen == ["NACKED", "ACKED"]


async def test_rabbitmq_duplicate_of_a_running_message_waits_retry_after_before_its_nack() -> None:
    """RabbitMQ requeues a nacked message at once: the same wait as Kafka's."""
    clock, answers = FakeClock(), Answers()
    middleware = Story().middleware(clock=clock, lock_timeout_seconds=60)
    broker = RabbitBroker(middlewares=[answers, middleware], logger=None)
    subscribe = broker.subscriber("orders", ack_policy=AckPolicy.NACK_ON_ERROR)
    await duplicate_while_running(broker, TestRabbitBroker, subscribe)
    assert clock.slept == [RETRY_PAUSE_SECONDS]
    assert answers.seen == ["NACKED", "ACKED"]


async def test_kafka_test_broker_replays_by_header_and_gives_up_on_the_counted_delivery() -> None:
    """No Kafka server here: FastStream's test broker, which hands the middleware the
    records a Kafka consumer would. The delivery count comes from a header the producer's
    retry sets (Kafka does not count deliveries)."""
    story, failing, answers = Story(), Story(failing=True), Answers()
    middleware = story.middleware(
        max_attempts=2, delivery_count=lambda message: int(message.headers.get("attempt", 1))
    )
    broker = KafkaBroker(middlewares=[answers, middleware], logger=None)

    # Kafka commits offsets itself unless told not to: an ack policy makes each record
    # answerable (a nack seeks back to it, so the consumer reads it again).
    @broker.subscriber("orders", group_id="billing", ack_policy=AckPolicy.NACK_ON_ERROR)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return (failing if body.get("fail") else story).handle(body)

    async with TestKafkaBroker(broker) as test_broker:
        for _ in range(2):
            await test_broker.publish({"order": 16}, "orders", headers={"Idempotency-Key": "o-16"})
        body = {"order": 17, "fail": True}
        for attempt in ("1", "2"):
            await test_broker.publish(
                body, "orders", headers={"Idempotency-Key": "o-17", "attempt": attempt}
            )
    # Kafka has no reject: FastStream commits the record, after on_exhausted kept it.
    assert answers.seen == ["ACKED", "ACKED", "NACKED", "ACKED"]
    assert story.runs == [{"order": 16}]
    assert len(failing.runs) == 2
    assert [str(error) for _, error in story.dead] == ["run 2"]


def test_kafka_records_are_keyed_by_topic_partition_and_offset() -> None:
    class Record:
        topic, partition, offset = "orders", 3, 41

    message = StreamMessage(Record(), b"{}", headers={})
    assert header_or_message_id(message) == "orders:3:41"
    message.headers["Idempotency-Key"] = "o-1"
    assert header_or_message_id(message) == "o-1"


def test_the_namespace_is_the_subscriber_function_or_name() -> None:
    def handler(body: object) -> None: ...

    assert subscriber_name(handler) == f"{__name__}.{handler.__qualname__}"
    assert subscriber_name(lambda body: None) is None
    with pytest.raises(TypeError, match="key must be a callable"):
        IdempotencyFastStreamMiddleware(store=MemoryStore(), key="message_id")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delivery_count must be a callable"):
        IdempotencyFastStreamMiddleware(store=MemoryStore(), delivery_count=3)  # type: ignore[arg-type]
    named = IdempotencyFastStreamMiddleware(store=MemoryStore(), name="billing")
    assert repr(named) == "IdempotencyFastStreamMiddleware(name='billing')"


async def test_a_delivery_count_that_cannot_be_read_is_unknown_not_a_failure() -> None:
    """A count function that raises (Redis' XPENDING unreachable, a bad header) leaves the
    count unknown: a failing handler is retried, never made dead by it."""
    story, answers = Story(failing=True), Answers()

    def unreadable(message: StreamMessage[Any]) -> int:
        raise KeyError("attempt")

    broker = KafkaBroker(
        middlewares=[answers, story.middleware(max_attempts=1, delivery_count=unreadable)],
        logger=None,
    )

    @broker.subscriber("payments", group_id="billing", ack_policy=AckPolicy.NACK_ON_ERROR)
    async def pay(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    async with TestKafkaBroker(broker) as test_broker:
        await test_broker.publish({"order": 19}, "payments", headers={"Idempotency-Key": "o-19"})
    assert answers.seen == ["NACKED"]
    assert story.dead == []


async def test_the_readme_quick_start_runs_a_message_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/snippets/quickstart/faststream_app.py, as the README quotes it, on FastStream's
    test broker: two sends with one Idempotency-Key, one run, the same reply twice."""
    monkeypatch.chdir(tmp_path)  # its SQLite file
    module = runpy.run_path(str(QUICKSTART / "faststream_app.py"))
    broker, charge = module["broker"], module["charge"]
    async with TestRabbitBroker(broker) as test_broker:
        replies = [
            await (
                await test_broker.request(
                    {"id": 7}, "orders", headers={"Idempotency-Key": "o-7"}, timeout=WAIT_SECONDS
                )
            ).decode()
            for _ in range(2)
        ]
        assert replies == [{"charged": 7}, {"charged": 7}]
        assert charge.mock.call_count == 1  # the replay did not reach the function
    module["store"].close()


# --- the options idempotent takes -----------------------------------------------------------

SEALING = Encryption(keys={"2026-11": bytes(range(32))}, current="2026-11")
PICKLE = (pickle.dumps, pickle.loads)
SECRET = "card-4242-4242"


async def test_with_encryption_a_result_is_stored_sealed_and_its_replay_opened(
    nats: Callable[..., NatsBroker], redis_url: str
) -> None:
    """A pickled result with ``encryption``: no clear text in the Redis hash, and the
    replay (the reply to the second request) is the first result, decrypted."""
    store = RedisStore(redis_url, prefix=fresh("sealed"))
    name = fresh("billing.charge")
    runs: list[Any] = []
    broker = nats(
        IdempotencyFastStreamMiddleware(
            store=store, name=name, serializer=PICKLE, encryption=SEALING
        )
    )
    subject = fresh("cards")

    @broker.subscriber(subject)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        runs.append(body)
        return {"card": SECRET, "run": len(runs)}

    try:
        await broker.start()
        replies = [
            await (
                await broker.request(
                    {"order": 21},
                    subject,
                    headers={"Idempotency-Key": "o-21"},
                    timeout=WAIT_SECONDS,
                )
            ).decode()
            for _ in range(2)
        ]
        assert replies == [{"card": SECRET, "run": 1}] * 2
        assert runs == [{"order": 21}]
        raw = RawStore("redis", store, redis_url).raw(function_key_hash(name, "o-21"))
        assert b"response" in raw
        assert SECRET.encode() not in raw
    finally:
        await store.aclose()


def test_a_pickle_serializer_warns_unless_encryption_is_given() -> None:
    with pytest.warns(UserWarning, match="serializer loads with pickle"):
        IdempotencyFastStreamMiddleware(store=MemoryStore(), serializer=PICKLE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IdempotencyFastStreamMiddleware(store=MemoryStore(), serializer=PICKLE, encryption=SEALING)


def test_it_takes_every_option_idempotent_takes_and_names_them_when_one_is_misspelled() -> None:
    ours = set(inspect.signature(IdempotencyFastStreamMiddleware).parameters)
    assert set(inspect.signature(idempotent).parameters) <= ours
    with pytest.raises(
        TypeError, match="'encyrption' \\(did you mean 'encryption'\\?\\)"
    ) as raised:
        IdempotencyFastStreamMiddleware(store=MemoryStore(), encyrption=SEALING)  # type: ignore[call-arg]
    assert "replay_cache_size" in str(raised.value)  # the valid names are listed
    with pytest.raises(ValueError, match="replay_cache_size"):
        IdempotencyFastStreamMiddleware(store=MemoryStore(), replay_cache_size=-1)


async def test_required_false_runs_a_message_without_key_unprotected(
    nats: Callable[..., NatsBroker],
) -> None:
    story, answers = Story(), Answers()
    broker = nats(answers, story.middleware(required=False))
    subject = fresh("orders")

    @broker.subscriber(subject)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    await broker.start()
    for _ in range(2):  # no header, no message id: nothing to key it by
        await broker._connection.publish(subject, b'{"order":22}')  # type: ignore[union-attr]
    assert await answers.wait_for(2) == ["ACKED", "ACKED"]
    assert story.runs == [{"order": 22}] * 2
    assert story.dead == []


async def test_forget_clears_a_subscribers_replay_cache(nats: Callable[..., NatsBroker]) -> None:
    story, answers = Story(), Answers()
    name = fresh("billing.refund")
    middleware = story.middleware(name=name, replay_cache_size=8)
    broker = nats(answers, middleware)
    subject = fresh("refunds")

    @broker.subscriber(subject)
    async def refund(body: dict[str, Any]) -> dict[str, Any]:
        return story.handle(body)

    await broker.start()
    for sent in range(1, 4):
        await broker.publish({"order": 23}, subject, headers={"Idempotency-Key": "o-23"})
        await answers.wait_for(sent)
        if sent == 2:  # the replay put it in the cache: forget must clear it there too
            assert await middleware.consumer(name).aforget("o-23") is True
    assert answers.seen == ["ACKED"] * 3
    assert story.runs == [{"order": 23}] * 2
