"""The consumers page's FastStream program on Kafka (run by tests/e2e/test_faststream_page.py
as pasted, imported as a module on FastStream's TestKafkaBroker: no Kafka server here)."""

# --8<-- [start:show]
import asyncio
import os

import httpx
from faststream import AckPolicy, FastStream
from faststream.kafka import KafkaBroker, KafkaMessage

from idempotency_middleware import SQLiteStore
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware

KAFKA_URL = os.environ.get("KAFKA_URL", "localhost:9092")
WAREHOUSE_URL = os.environ.get("WAREHOUSE_URL", "http://localhost:8080")

# Kafka does not count deliveries: a nack seeks back, so the partition's next record is
# the same one again. Counted here, per partition (a restart counts from 1 again: a record
# may get more attempts, never fewer).
last_read: dict[tuple[str, int], tuple[int, int]] = {}


def delivery_count(message: KafkaMessage) -> int:
    record = message.raw_message
    partition = (record.topic, record.partition)
    offset, count = last_read.get(partition, (-1, 0))
    count = count + 1 if offset == record.offset else 1
    last_read[partition] = (record.offset, count)
    return count


async def park(message: KafkaMessage, error: Exception) -> None:
    """A record still failing at its last attempt: copied to the topic orders-dead, before
    the middleware commits it (Kafka has no dead letters)."""
    await broker.publish(message.body, "orders-dead", headers=message.headers)


idempotency = IdempotencyFastStreamMiddleware(
    store=SQLiteStore("orders-idempotency.sqlite3"),  # one host; RedisStore, PostgresStore...
    max_attempts=3,
    delivery_count=delivery_count,
    on_exhausted=park,
)
broker = KafkaBroker(KAFKA_URL, middlewares=[idempotency])
app = FastStream(broker)


# A group and an ack policy: the offsets are committed when the middleware acks, and a
# nack seeks back to the record (without them FastStream commits on its own).
@broker.subscriber("orders", group_id="shipping", ack_policy=AckPolicy.NACK_ON_ERROR)
async def ship_order(order: dict[str, int]) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=WAREHOUSE_URL) as warehouse:
        response = await warehouse.post("/shipments", json=order)
    response.raise_for_status()  # a failure is a retry, and dead at the third delivery
    shipment: dict[str, str] = response.json()
    return shipment


if __name__ == "__main__":
    asyncio.run(app.run())
# --8<-- [end:show]
