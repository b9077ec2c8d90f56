"""The consumers page's FastStream program on RabbitMQ (run by
tests/e2e/test_faststream_page.py as pasted: a process against a real RabbitMQ server)."""

# --8<-- [start:show]
import asyncio
import os

import httpx
from faststream import FastStream
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue

from idempotency_middleware import SQLiteStore
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/")
WAREHOUSE_URL = os.environ.get("WAREHOUSE_URL", "http://localhost:8080")

idempotency = IdempotencyFastStreamMiddleware(
    store=SQLiteStore("orders-idempotency.sqlite3"),  # one host; RedisStore, PostgresStore...
    max_attempts=3,  # a quorum queue counts deliveries: x-delivery-count
)
broker = RabbitBroker(RABBITMQ_URL, middlewares=[idempotency])
app = FastStream(broker)

# A nack puts the message back in the queue at once; a reject sends it to the queue's
# dead-letter exchange, here the default one, which routes it to the queue orders-dead.
orders_dead = RabbitQueue("orders-dead", queue_type=QueueType.QUORUM, durable=True)
orders = RabbitQueue(
    "orders",
    queue_type=QueueType.QUORUM,
    durable=True,
    arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders-dead"},
)


@app.on_startup
async def declare_orders_dead() -> None:
    # RabbitMQ drops a dead letter with no queue to go to: declare it before consuming.
    await broker.connect()
    await broker.declare_queue(orders_dead)


@broker.subscriber(orders)
async def ship_order(order: dict[str, int]) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=WAREHOUSE_URL) as warehouse:
        response = await warehouse.post("/shipments", json=order)
    response.raise_for_status()  # a failure is a retry, and dead at the third delivery
    shipment: dict[str, str] = response.json()
    return shipment


if __name__ == "__main__":
    asyncio.run(app.run())
# --8<-- [end:show]
