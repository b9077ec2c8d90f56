"""The consumers page's FastStream example: a RabbitMQ app whose subscribers run each
message once. Run here on FastStream's in-memory test broker (tests/e2e/test_faststream.py runs
the middleware on real RabbitMQ, NATS and Redis servers)."""

import asyncio

# --8<-- [start:show]
from faststream import FastStream
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue

from idempotency_middleware import SQLiteStore
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware

store = SQLiteStore("orders-idempotency.sqlite3")  # RedisStore, PostgresStore... across hosts
dead_letters: list[bytes] = []

idempotency = IdempotencyFastStreamMiddleware(
    store=store,
    max_attempts=5,  # at the 5th delivery (a quorum queue counts them), reject the message
    on_exhausted=lambda message, error: dead_letters.append(message.body),
)
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[idempotency])
app = FastStream(broker)

orders = RabbitQueue(
    "orders",
    queue_type=QueueType.QUORUM,  # counts deliveries: x-delivery-count
    durable=True,
    arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders-dlq"},
)
shipped: list[int] = []


@broker.subscriber(orders)
async def ship_order(order: dict[str, int]) -> str:
    shipped.append(order["id"])
    return f"shipped {order['id']}"


# A producer names one logical operation with the Idempotency-Key header; without it the
# key is the message id (RabbitMQ's message_id property):
#   await broker.publish({"id": 7}, "orders", headers={"Idempotency-Key": "order-7"})
# --8<-- [end:show]


async def main() -> None:
    from faststream.rabbit import TestRabbitBroker

    async with TestRabbitBroker(broker) as test_broker:
        for _ in range(2):  # sent twice: shipped once
            await test_broker.publish({"id": 7}, orders, headers={"Idempotency-Key": "order-7"})
    assert shipped == [7], shipped


if __name__ == "__main__":
    asyncio.run(main())
    store.close()
    print("ok")
