# --8<-- [start:setup]
from fastapi import FastAPI

app = FastAPI()
# --8<-- [end:setup]
# --8<-- [start:show]
from idempotency_middleware import IdempotencyMiddleware, RedisStore, idempotent

store = RedisStore("redis://cache.internal:6379/0")  # builds its own clients
app.add_middleware(IdempotencyMiddleware, store=store)  # ASGI: the asyncio client
# WSGI (IdempotencyWSGIMiddleware) and @idempotent(store=store, ...) use the same object.
# --8<-- [end:show]
assert idempotent
