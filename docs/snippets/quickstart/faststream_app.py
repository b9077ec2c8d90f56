from faststream.rabbit import RabbitBroker

from idempotency_middleware import SQLiteStore
from idempotency_middleware.faststream import IdempotencyFastStreamMiddleware

store = SQLiteStore("idempotency.sqlite3")
store.check()  # a store that cannot work fails here, not at the first message
broker = RabbitBroker(middlewares=[IdempotencyFastStreamMiddleware(store=store)])


@broker.subscriber("orders")
async def charge(order: dict) -> dict:
    # Once per Idempotency-Key header (else message id); failures nacked, then rejected.
    return {"charged": order["id"]}
