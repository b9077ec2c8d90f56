"""The consumers page's FastStream program on NATS JetStream (run by
tests/e2e/test_faststream_page.py as pasted: a process against a real NATS server)."""

# --8<-- [start:show]
import asyncio
import os

import httpx
from faststream import FastStream
from faststream.nats import JStream, NatsBroker, NatsMessage

from idempotency_middleware import SQLiteStore
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware

NATS_URL = os.environ.get("NATS_URL", "nats://localhost:4222")
WAREHOUSE_URL = os.environ.get("WAREHOUSE_URL", "http://localhost:8080")


async def park(message: NatsMessage, error: Exception) -> None:
    """A message still failing at its last attempt: kept under orders.dead, before the
    middleware terminates it (JetStream then never delivers it again)."""
    await orders_dead.publish(message.body, headers=message.headers)


idempotency = IdempotencyFastStreamMiddleware(
    store=SQLiteStore("orders-idempotency.sqlite3"),  # one host; RedisStore, PostgresStore...
    max_attempts=3,  # JetStream counts deliveries: num_delivered
    on_exhausted=park,
)
broker = NatsBroker(NATS_URL, middlewares=[idempotency])
app = FastStream(broker)
# A stream of its own for the dead: JetStream drops a message whose Nats-Msg-Id its stream
# has just stored, and the copy keeps the headers.
orders_dead = broker.publisher("orders.dead", stream=JStream("ORDERS_DEAD"))


# A durable consumer: JetStream delivers a nacked message again (after the delay the
# middleware gives, for a duplicate still running elsewhere), and one left unanswered
# after its ack_wait (a worker that died).
@broker.subscriber("orders", stream=JStream("ORDERS"), durable="shipping")
async def ship_order(order: dict[str, int]) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=WAREHOUSE_URL) as warehouse:
        response = await warehouse.post("/shipments", json=order)
    response.raise_for_status()  # a failure is a retry, and dead at the third delivery
    shipment: dict[str, str] = response.json()
    return shipment


if __name__ == "__main__":
    asyncio.run(app.run())
# --8<-- [end:show]
