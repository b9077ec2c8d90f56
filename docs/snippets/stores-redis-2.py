# --8<-- [start:show]
import os

from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, RedisStore

store = RedisStore(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))  # its own clients
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=store)  # ASGI: the asyncio client
# WSGI (IdempotencyWSGIMiddleware) and @idempotent(store=store, ...) use the same object.
# --8<-- [end:show]
