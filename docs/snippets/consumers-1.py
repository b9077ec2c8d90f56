"""The consumers page's first example: one consumer, each verdict it gives."""

# --8<-- [start:show]
from idempotency_middleware import IdempotentConsumer, MemoryStore

store = MemoryStore()
shipped: list[str] = []
dead_letters: list[dict[str, str]] = []


def ship_order(message: dict[str, str]) -> str:
    if message["body"] == "poison":
        raise ValueError("cannot parse the order")
    shipped.append(message["body"])
    return f"shipped {message['body']}"


consumer = IdempotentConsumer(
    ship_order,
    store=store,
    key=lambda message: message["messageId"],
    name="orders.ship",  # keeps the keys when the function is renamed or moved
    max_attempts=3,  # the queue's maxReceiveCount, or fewer
    on_exhausted=lambda message, error: dead_letters.append(message),
)

order = {"messageId": "m-1", "body": "order-7"}
first = consumer.process(order, delivery_count=1)
assert (first.action, first.result) == ("ack", "shipped order-7")

again = consumer.process(order, delivery_count=2)  # the broker delivered it again
assert (again.action, again.replayed, again.result) == ("ack", True, "shipped order-7")
assert shipped == ["order-7"]  # shipped once

poison = {"messageId": "m-2", "body": "poison"}
retry = consumer.process(poison, delivery_count=1)
assert retry.action == "retry" and isinstance(retry.error, ValueError)
dead = consumer.process(poison, delivery_count=3)  # its last attempt
assert dead.action == "dead" and dead_letters == [poison]

# After fixing the bug, redrive it: forget its key (a dead key is already released,
# so this returns False) and deliver it again.
consumer.forget("m-2")
# --8<-- [end:show]
print("ok")
