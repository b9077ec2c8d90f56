"""The consumers page's FastStream program on Redis streams (run by
tests/e2e/test_faststream_page.py as pasted: a process against a real Redis server)."""

# --8<-- [start:show]
import asyncio
import os
import socket

import httpx
from faststream import FastStream
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub

from idempotency_middleware import RedisStore
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379")
WAREHOUSE_URL = os.environ.get("WAREHOUSE_URL", "http://localhost:8080")
WORKER = socket.gethostname()  # a consumer name per process of the group


async def park(message: RedisStreamMessage, error: Exception) -> None:
    """A message still failing at its last attempt: kept on the stream orders-dead (Redis
    has no dead letters), before the middleware acknowledges it."""
    await broker.publish(message.body, stream="orders-dead", headers=message.headers)


idempotency = IdempotencyFastStreamMiddleware(
    store=RedisStore(REDIS_URL),
    max_attempts=3,  # Redis counts deliveries: the pending entry's times_delivered
    on_exhausted=park,
)
broker = RedisBroker(REDIS_URL, middlewares=[idempotency])
app = FastStream(broker)

# One group, two subscribers: the reader takes new entries; the claimer takes back the
# entries left pending 5 s (a retry, or a worker that died), which is when a retry comes
# again. A subscriber with min_idle_time only claims: alone, it never reads a new entry.
reader = StreamSub("orders", group="shipping", consumer=WORKER)
claimer = StreamSub("orders", group="shipping", consumer=WORKER, min_idle_time=5_000)


@broker.subscriber(stream=reader)
@broker.subscriber(stream=claimer)
async def ship_order(order: dict[str, int]) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=WAREHOUSE_URL) as warehouse:
        response = await warehouse.post("/shipments", json=order)
    response.raise_for_status()  # a failure is a retry, and dead at the third delivery
    shipment: dict[str, str] = response.json()
    return shipment


if __name__ == "__main__":
    asyncio.run(app.run())
# --8<-- [end:show]
