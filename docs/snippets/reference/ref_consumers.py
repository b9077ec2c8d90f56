"""The API reference's examples for consumers, Lambda batches and redrive."""

# --8<-- [start:IdempotentConsumer]
from idempotency_middleware import IdempotentConsumer, MemoryStore

consumer = IdempotentConsumer(
    lambda message: f"done {message['id']}",
    store=MemoryStore(),
    key=lambda message: message["id"],
    name="jobs.run",  # a lambda has no name of its own
)
outcome = consumer.process({"id": "j-1"}, delivery_count=1)
assert (outcome.action, outcome.result, outcome.replayed) == ("ack", "done j-1", False)
assert consumer.process({"id": "j-1"}, delivery_count=2).replayed
assert consumer.forget("j-1")  # the next delivery of j-1 runs again
# --8<-- [end:IdempotentConsumer]

# --8<-- [start:Outcome]
from idempotency_middleware import Outcome

assert Outcome("retry", retry_after=1).action == "retry"
# --8<-- [end:Outcome]

# --8<-- [start:process_lambda_batch]
from idempotency_middleware import IdempotentConsumer, MemoryStore, process_lambda_batch

event = {"Records": [{"messageId": "m-1", "body": "x", "eventSource": "aws:sqs"}]}
records = IdempotentConsumer(
    lambda record: record["body"],
    store=MemoryStore(),
    key=lambda record: record["messageId"],
    name="records",
)
assert process_lambda_batch(records, event) == {"batchItemFailures": []}
# --8<-- [end:process_lambda_batch]


# --8<-- [start:aprocess_lambda_batch]
import asyncio

from idempotency_middleware import IdempotentConsumer, MemoryStore, aprocess_lambda_batch

event = {"Records": [{"messageId": "m-1", "body": "x", "eventSource": "aws:sqs"}]}


async def handle(record: dict[str, str]) -> str:
    return record["body"]


async_records = IdempotentConsumer(
    handle, store=MemoryStore(), key=lambda record: record["messageId"]
)
print(asyncio.run(aprocess_lambda_batch(async_records, event)))  # {'batchItemFailures': []}
# --8<-- [end:aprocess_lambda_batch]

# --8<-- [start:IdempotentFunction]
from idempotency_middleware import MemoryStore, idempotent

store = MemoryStore()


@idempotent(store=store, key="order_id")
def ship(order_id: str) -> str:
    return f"shipped {order_id}"


ship("o-1")
assert ship.forget("o-1") is True  # the next ship("o-1") runs again
# --8<-- [end:IdempotentFunction]
