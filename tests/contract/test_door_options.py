"""Every door that wraps a callable takes every option they share (``CallableOptions``), and
each option reaches the attempt there.

The doors: ``idempotent`` (a plain and a coroutine function), ``IdempotentConsumer``
(``process`` and ``aprocess``), the Lambda batch helpers and ``SQSWorker`` (on moto's SQS)
given such a consumer, Celery's ``idempotent_task`` (run in-process by ``apply``),
FastStream's middleware (on its Kafka test broker), the MCP door (fastmcp's middleware, and
the decorator on the official SDK's server, each called by its SDK's client in process),
and a door written from ``CallableKeywords`` alone, as the next door will be. Each option
has a probe: a value other than its default, and what the store kept or was asked, the
handler's runs, the events or the clock then show. Each option also has a bad value,
refused by every door naming it.

An option added to ``CallableOptions`` without a probe here fails
``test_every_shared_option_has_a_probe``; given a probe, a door that does not take it, or
takes it and does not pass it on, fails that door's probe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import boto3
import orjson
import pytest
from celery import Celery
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, TestKafkaBroker

from idempotency_middleware import (
    Encryption,
    IdempotencyEvent,
    IdempotentConsumer,
    InvalidKeyError,
    MemoryStore,
    SQSWorker,
    StoredResultUnreadableError,
    aprocess_lambda_batch,
    idempotent,
    process_lambda_batch,
)
from idempotency_middleware.agents.keys import tool_key_hash
from idempotency_middleware.celery import idempotent_task
from idempotency_middleware.engine.decisions import MIN_POLL_INTERVAL
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware
from idempotency_middleware.functions.answers import Returned, answer
from idempotency_middleware.functions.attempts import (
    FunctionAttempts,
    derived_name,
    function_key_hash,
)
from idempotency_middleware.functions.options import (
    OPTION_NAMES,
    CallableKeywords,
    CallableOptions,
)
from idempotency_middleware.functions.payloads import fingerprint_arguments
from idempotency_middleware.mcp import IdempotencyMCPMiddleware, idempotent_tool
from idempotency_middleware.stores.protocol import ClaimRequest, Completion, StoreUnavailable
from idempotency_middleware.stores.records import COMPLETED, Record, SealedResponse
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION
from tests.support.mcp_servers import Kind, connect

if TYPE_CHECKING:
    from typing_extensions import Unpack

ORDER = 7  # what every call or delivery carries beside its key


class RecordingStore(MemoryStore):
    """A ``MemoryStore`` keeping what each claim and completion asked of it; ``down``, its
    claims fail as an unreachable store's do."""

    def __init__(self, *, down: bool = False) -> None:
        super().__init__()
        self.down = down
        self.claims: list[ClaimRequest] = []
        self.completions: list[Completion] = []

    def claim(self, request: ClaimRequest) -> Any:
        self.claims.append(request)
        if self.down:
            raise StoreUnavailable("the store is down", cause="unreachable")
        return super().claim(request)

    def complete(self, completion: Completion) -> bool:
        self.completions.append(completion)
        return super().complete(completion)

    def record(self) -> Record:
        """The record of the first key claimed."""
        found = self.get(self.claims[0].key_hash)
        assert found is not None
        return found


def the_result(stored: Any) -> Any:
    return stored


@dataclass
class Door:
    """One door built over a handler recording its runs: ``deliver(key)`` is one call or
    delivery with ``key`` (``None``: without one). ``key_hash(name, key)`` is the stored key
    of ``key`` under the namespace ``name``, ``result_of`` the handler's result in what the
    door stores (decoded)."""

    deliver: Callable[[str | None], Any]
    store: RecordingStore
    runs: list[str | None]
    key_hash: Callable[[str, str], str] = function_key_hash
    result_of: Callable[[Any], Any] = the_result


# Builds a door with the options given (a RecordingStore unless ``store`` is one of them).
MakeDoor = Callable[..., Door]


def swallowed(call: Callable[[], Any]) -> Any:
    """What ``call`` returns, or the exception it raises (a door's refusal is an answer)."""
    try:
        return call()
    except Exception as error:
        return error


# --- the doors ----------------------------------------------------------------------------


def function_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    @idempotent(key="key", **options)
    def charge(key: str | None, order: int) -> dict[str, int]:
        runs.append(key)
        return {"order": order}

    return lambda key: swallowed(lambda: charge(key, ORDER))


def coroutine_function_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    @idempotent(key="key", **options)
    async def charge(key: str | None, order: int) -> dict[str, int]:
        runs.append(key)
        return {"order": order}

    async def call(key: str | None) -> Any:
        return await charge(key, ORDER)

    return lambda key: swallowed(lambda: asyncio.run(call(key)))


def consumer_of(runs: list[str | None], coroutine: bool, **options: Any) -> IdempotentConsumer:
    """A consumer of messages ``{"key": ..., "order": ...}`` (or of boto3's and Lambda's SQS
    messages, whose body is that)."""

    def body(message: dict[str, Any]) -> dict[str, Any]:
        text = message.get("Body", message.get("body"))
        return message if text is None else dict(json.loads(text))

    def handle(message: dict[str, Any]) -> dict[str, Any]:
        runs.append(body(message)["key"])
        return {"order": body(message)["order"]}

    async def ahandle(message: dict[str, Any]) -> dict[str, Any]:
        return handle(message)

    return IdempotentConsumer(
        ahandle if coroutine else handle,
        key=lambda message: body(message)["key"],
        payload=body,
        **options,
    )


def consumer_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    consumer = consumer_of(runs, False, **options)
    return lambda key: consumer.process({"key": key, "order": ORDER})


def coroutine_consumer_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    consumer = consumer_of(runs, True, **options)
    return lambda key: asyncio.run(consumer.aprocess({"key": key, "order": ORDER}))


def lambda_event(key: str | None) -> dict[str, Any]:
    body = json.dumps({"key": key, "order": ORDER})
    record = {"eventSource": "aws:sqs", "messageId": uuid.uuid4().hex, "body": body}
    return {"Records": [record]}


def lambda_batch_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    consumer = consumer_of(runs, False, **options)
    return lambda key: process_lambda_batch(consumer, lambda_event(key))


def coroutine_lambda_batch_door(
    runs: list[str | None], **options: Any
) -> Callable[[str | None], Any]:
    consumer = consumer_of(runs, True, **options)
    return lambda key: asyncio.run(aprocess_lambda_batch(consumer, lambda_event(key)))


def celery_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    app = Celery("door-options", set_as_current=False)

    # max_retries=0: a retry verdict ends the in-process run (apply) with its error, rather
    # than running the task again at once.
    @idempotent_task(app, key=lambda call: call.kwargs["key"], max_retries=0, **options)
    def charge(key: str | None, order: int) -> dict[str, int]:
        runs.append(key)
        return {"order": order}

    def deliver(key: str | None) -> Any:
        return charge.apply(kwargs={"key": key, "order": ORDER}, task_id=uuid.uuid4().hex).result

    return deliver


def faststream_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    def key_header(message: Any) -> str | None:
        found = message.headers.get("key")
        return None if found is None else str(found)

    middleware = IdempotencyFastStreamMiddleware(key=key_header, **options)
    broker = KafkaBroker(middlewares=[middleware], logger=None)

    @broker.subscriber("orders", group_id="billing", ack_policy=AckPolicy.NACK_ON_ERROR)
    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        runs.append(body["key"])
        return {"order": body["order"]}

    async def publish(key: str | None) -> None:
        async with TestKafkaBroker(broker) as test_broker:
            headers = {} if key is None else {"key": key}
            await test_broker.publish({"key": key, "order": ORDER}, "orders", headers=headers)

    return lambda key: asyncio.run(publish(key))


def keyword_door(
    function: Callable[..., Any],
    *,
    store: Any,
    key: Callable[..., str | None],
    **options: Unpack[CallableKeywords],
) -> Callable[..., Any]:
    """A door written from the shared definition alone, as the next door will be: it names
    none of the shared options, and takes them all."""
    settings = CallableOptions.from_keywords("keyword_door()", store=store, own=["key"], **options)
    name = derived_name(function, settings.name, "keyword door")
    attempts = FunctionAttempts(
        function,
        name,
        settings.store,
        settings.serializer,
        settings.attempt_options,
        False,
        f"keyword door {name}",
    )

    def call(**arguments: Any) -> Any:
        given = key(**arguments)
        if given is None and settings.required:
            raise InvalidKeyError("no key")
        attempt = (
            None
            if given is None
            else attempts.attempt(given, fingerprint_arguments(name, arguments))
        )
        answered = answer(attempts, attempt, lambda: function(**arguments))
        if isinstance(answered, Returned):
            return answered.value
        raise answered.error

    return call


def next_door(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
    def charge(key: str | None, order: int) -> dict[str, int]:
        runs.append(key)
        return {"order": order}

    door = keyword_door(charge, key=lambda **arguments: arguments["key"], **options)
    return lambda key: swallowed(lambda: door(key=key, order=ORDER))


def mcp_door(kind: Kind) -> Callable[..., Callable[[str | None], Any]]:
    """The MCP door ``kind`` over a server in this process, called by its SDK's client: the
    key in the request's ``_meta``, and as an argument the tool records."""

    def make(runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
        async def charge(key: str | None, order: int) -> dict[str, int]:
            runs.append(key)
            return {"order": order}

        server: Any
        if kind == "fastmcp-middleware":
            from fastmcp import FastMCP

            server = FastMCP("orders", middleware=[IdempotencyMCPMiddleware(**options)])
            server.tool()(charge)
        else:
            from mcp.server.mcpserver import MCPServer

            server = MCPServer("orders")
            server.tool()(idempotent_tool(**options)(charge))

        async def call(key: str | None) -> Any:
            async with connect(kind, server=server) as tool_call:
                return await tool_call("charge", {"key": key, "order": ORDER}, key)

        return lambda key: asyncio.run(call(key))

    return make


def tool_result_of(stored: Any) -> Any:
    """The tool's value in a stored tool result: its text content (JSON, in either SDK)."""
    return json.loads(stored["content"][0]["text"])


@dataclass
class SQSDoor:
    """``SQSWorker`` over a queue of its own on moto: a delivery is one message sent, then
    one batch received and settled."""

    client: Any
    queues: list[str] = field(default_factory=list)

    def __call__(self, runs: list[str | None], **options: Any) -> Callable[[str | None], Any]:
        consumer = consumer_of(runs, False, **options)
        name = f"orders-{uuid.uuid4().hex[:12]}"
        queue_url = str(self.client.create_queue(QueueName=name)["QueueUrl"])
        self.queues.append(queue_url)
        worker = SQSWorker(consumer, queue_url, client=self.client, wait_time_seconds=0)

        def deliver(key: str | None) -> Any:
            body = json.dumps({"key": key, "order": ORDER})
            self.client.send_message(QueueUrl=queue_url, MessageBody=body)
            return worker.run_once()

        return deliver


DoorFunction = Callable[..., Callable[[str | None], Any]]
DOORS: dict[str, DoorFunction | None] = {
    "idempotent": function_door,
    "idempotent-async": coroutine_function_door,
    "IdempotentConsumer.process": consumer_door,
    "IdempotentConsumer.aprocess": coroutine_consumer_door,
    "process_lambda_batch": lambda_batch_door,
    "aprocess_lambda_batch": coroutine_lambda_batch_door,
    "SQSWorker-moto": None,  # on moto, made by the fixture (the id marks it as a server test)
    "idempotent_task": celery_door,
    "IdempotencyFastStreamMiddleware": faststream_door,
    "IdempotencyMCPMiddleware": mcp_door("fastmcp-middleware"),
    "idempotent_tool": mcp_door("mcp-decorator"),
    "CallableKeywords-door": next_door,
}
# The MCP doors: their keys are a tool's, their stored results tool results.
MCP_DOORS = {"IdempotencyMCPMiddleware", "idempotent_tool"}


@pytest.fixture(params=list(DOORS))
def make_door(request: pytest.FixtureRequest) -> Iterator[MakeDoor]:
    made = DOORS[request.param]
    queues: SQSDoor | None = None
    if made is None:
        endpoint = request.getfixturevalue("moto_endpoint")
        queues = SQSDoor(boto3.client("sqs", endpoint_url=endpoint, region_name=REGION))
        made = queues

    def make(**options: Any) -> Door:
        options.setdefault("store", RecordingStore())
        runs: list[str | None] = []
        assert made is not None
        door = Door(made(runs, **options), options["store"], runs)
        if request.param in MCP_DOORS:
            door.key_hash = lambda name, key: tool_key_hash(name, None, key)
            door.result_of = tool_result_of
        return door

    yield make
    if queues is not None:
        for queue_url in queues.queues:
            queues.client.delete_queue(QueueUrl=queue_url)
        queues.client.close()


# --- the probes: each option reaches the attempt --------------------------------------------


def store_is_the_one_written(make: MakeDoor) -> None:
    store = RecordingStore()
    door = make(store=store)
    door.deliver("k-1")
    assert door.runs == ["k-1"]
    assert store.record().status is COMPLETED


def name_namespaces_the_keys(make: MakeDoor) -> None:
    door = make(name="probe.orders")
    door.deliver("k-1")
    assert door.store.claims[0].key_hash == door.key_hash("probe.orders", "k-1")


def required_false_runs_a_call_without_a_key_unprotected(make: MakeDoor) -> None:
    door = make(required=False)
    door.deliver(None)
    door.deliver(None)
    assert door.runs == [None, None]
    assert door.store.claims == []


def ttl_seconds_is_the_completed_records_lifetime(make: MakeDoor) -> None:
    door = make(ttl_seconds=123)
    door.deliver("k-1")
    completion = door.store.completions[0]
    assert door.store.record().expires_at == completion.now + 123


def lock_timeout_seconds_is_the_claims_lease(make: MakeDoor) -> None:
    door = make(lock_timeout_seconds=45)
    door.deliver("k-1")
    claim = door.store.claims[0]
    assert claim.lock_timeout_seconds == 45
    assert door.store.record().lock_expires_at == claim.now + 45


def wait_seconds_waits_for_the_running_attempt(make: MakeDoor) -> None:
    clock = FakeClock()
    door = make(wait_seconds=5, clock=clock)
    door.deliver("k-1")
    # The key is held now by an attempt elsewhere, that has not finished.
    first = door.store.claims[0]
    door.store.delete(first.key_hash)
    door.store.claim(first._replace(owner="elsewhere", now=clock.now(), lock_timeout_seconds=600))
    door.deliver("k-1")
    assert door.runs == ["k-1"]
    # Waited it out (until too little of it was left for another poll).
    assert 5 - MIN_POLL_INTERVAL <= sum(clock.slept) < 5 + 1e-6
    assert len(door.store.claims) > 3  # polled, beside the first's and the holder's


def clock_is_the_attempts_time(make: MakeDoor) -> None:
    door = make(clock=FakeClock(start=1_000_000.0))
    door.deliver("k-1")
    assert door.store.claims[0].now == 1_000_000.0


def clock_skew_seconds_is_the_claims_takeover_margin(make: MakeDoor) -> None:
    door = make(clock_skew_seconds=0.25)
    door.deliver("k-1")
    assert door.store.claims[0].clock_skew_seconds == 0.25


def serializer_writes_the_stored_result(make: MakeDoor) -> None:
    def dumps(value: Any) -> bytes:
        return b"probe:" + orjson.dumps(value)

    def loads(data: bytes) -> Any:
        return orjson.loads(data.removeprefix(b"probe:"))

    door = make(serializer=(dumps, loads))
    door.deliver("k-1")
    response = door.store.record().response
    assert response is not None
    assert response.body.startswith(b"probe:")
    assert door.result_of(orjson.loads(response.body.removeprefix(b"probe:"))) == {"order": ORDER}


def on_store_error_run_runs_unprotected_when_the_claim_fails(make: MakeDoor) -> None:
    door = make(store=RecordingStore(down=True), on_store_error="run")
    door.deliver("k-1")
    assert door.runs == ["k-1"]
    assert len(door.store.claims) == 1


def replay_cache_size_answers_a_replay_without_the_store(make: MakeDoor) -> None:
    door = make(replay_cache_size=8)
    for _ in range(3):  # ran; replayed from the store (and cached); replayed from the cache
        door.deliver("k-1")
    assert door.runs == ["k-1"]
    assert len(door.store.claims) == 2


def on_event_hears_the_attempt(make: MakeDoor) -> None:
    events: list[IdempotencyEvent] = []
    door = make(on_event=events.append)
    door.deliver("k-1")
    assert [event.kind for event in events] == ["claimed", "completed"]
    assert {event.key_hash for event in events} == {door.store.claims[0].key_hash}


def encryption_seals_the_stored_result(make: MakeDoor) -> None:
    sealing = Encryption(keys={"2026-11": bytes(range(32))}, current="2026-11")
    door = make(encryption=sealing)
    door.deliver("k-1")
    response = door.store.record().response
    assert isinstance(response, SealedResponse)
    assert b"order" not in response.body


@dataclass(frozen=True)
class Probe:
    """How one option is seen to reach the attempt, and a value of it every door refuses."""

    check: Callable[[MakeDoor], None]
    bad: object


PROBES: dict[str, Probe] = {
    "store": Probe(store_is_the_one_written, bad=object()),
    "name": Probe(name_namespaces_the_keys, bad=""),
    "required": Probe(required_false_runs_a_call_without_a_key_unprotected, bad="yes"),
    "ttl_seconds": Probe(ttl_seconds_is_the_completed_records_lifetime, bad=0),
    "lock_timeout_seconds": Probe(lock_timeout_seconds_is_the_claims_lease, bad=-1),
    "wait_seconds": Probe(wait_seconds_waits_for_the_running_attempt, bad=-1),
    "serializer": Probe(serializer_writes_the_stored_result, bad=(repr,)),
    "on_store_error": Probe(on_store_error_run_runs_unprotected_when_the_claim_fails, bad="retry"),
    "replay_cache_size": Probe(replay_cache_size_answers_a_replay_without_the_store, bad=-1),
    "on_event": Probe(on_event_hears_the_attempt, bad=3),
    "clock": Probe(clock_is_the_attempts_time, bad=object()),
    "clock_skew_seconds": Probe(clock_skew_seconds_is_the_claims_takeover_margin, bad=-1),
    "encryption": Probe(encryption_seals_the_stored_result, bad="a key"),
}


def test_every_shared_option_has_a_probe() -> None:
    assert set(PROBES) == OPTION_NAMES
    assert set(CallableKeywords.__annotations__) == OPTION_NAMES - {"store"}


@pytest.mark.parametrize("option", list(PROBES))
def test_each_door_takes_each_shared_option_and_it_reaches_the_attempt(
    make_door: MakeDoor, option: str
) -> None:
    PROBES[option].check(make_door)


@pytest.mark.parametrize("option", list(PROBES))
def test_each_door_refuses_a_bad_value_of_each_shared_option_naming_it(
    make_door: MakeDoor, option: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=option):
        make_door(**{option: PROBES[option].bad})


def test_each_door_refuses_a_misspelled_option_listing_the_valid_ones(make_door: MakeDoor) -> None:
    with pytest.raises(
        TypeError, match=r"'ttl_secnods' \(did you mean 'ttl_seconds'\?\)"
    ) as raised:
        make_door(ttl_secnods=5)
    message = str(raised.value)
    assert all(f"{name}," in message or message.endswith(name) for name in OPTION_NAMES)


# Doors whose signature documents each shared option: with the shared defaults. (Celery's
# idempotent_task takes ``name`` as the task option it also is.)
SIGNATURES: list[tuple[Callable[..., Any], frozenset[str]]] = [
    (idempotent, frozenset()),
    (IdempotentConsumer, frozenset()),
    (idempotent_task, frozenset({"name"})),
    (IdempotencyFastStreamMiddleware, frozenset()),
]


@pytest.mark.parametrize(
    ("door", "through_its_own_keywords"),
    SIGNATURES,
    ids=[door.__name__ for door, _ in SIGNATURES],
)
def test_each_door_declares_each_shared_option_with_the_shared_default(
    door: Callable[..., Any], through_its_own_keywords: frozenset[str]
) -> None:
    parameters = inspect.signature(door).parameters
    for option in dataclasses.fields(CallableOptions):
        if not option.init or option.name in through_its_own_keywords:
            continue
        declared = parameters[option.name]
        default = (
            inspect.Parameter.empty if option.default is dataclasses.MISSING else option.default
        )
        assert declared.kind is declared.KEYWORD_ONLY, option.name
        assert declared.default == default, option.name


def test_a_door_from_callable_keywords_names_its_own_options_beside_the_shared_ones() -> None:
    with pytest.raises(TypeError, match=r"'kee' \(did you mean 'key'\?\)"):
        keyword_door(print, store=MemoryStore(), key=lambda: "k", kee=3)  # type: ignore[call-arg]


def test_a_celery_task_takes_the_shared_options_apart_from_its_task_options() -> None:
    """``name`` is both: the task's name and its keys' namespace."""
    app = Celery("door-options-names", set_as_current=False)
    store = RecordingStore()

    @idempotent_task(app, store=store, name="probe.refunds", rate_limit="1/s")
    def refund(order: str) -> str:
        return order

    assert (refund.name, refund.rate_limit) == ("probe.refunds", "1/s")
    assert refund.apply(("o-1",), task_id="t-1").get() == "o-1"
    assert store.claims[0].key_hash == function_key_hash("probe.refunds", "t-1")


def test_an_undecodable_stored_result_is_refused_alike_by_the_function_and_consumer_doors() -> None:
    """The one ladder: the function door raises the refusal, the consumer door gives up
    on the message with that same error."""
    store = RecordingStore()
    runs: list[str | None] = []

    def loads(data: bytes) -> Any:
        raise ValueError("not this format")

    serializer = (orjson.dumps, loads)
    function = function_door(runs, store=store, name="probe.shared", serializer=serializer)
    consumer = consumer_of(runs, False, store=store, name="probe.shared", serializer=serializer)
    assert function("k-1") == {"order": ORDER}  # ran: its result, not read back
    refused = function("k-1")
    outcome = consumer.process({"key": "k-1", "order": ORDER})
    assert runs == ["k-1"]
    assert isinstance(refused, StoredResultUnreadableError)
    assert outcome.action == "dead"
    assert isinstance(outcome.error, StoredResultUnreadableError)
