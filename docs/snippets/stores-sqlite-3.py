# --8<-- [start:setup]
from fastapi import FastAPI

app = FastAPI()
# --8<-- [end:setup]
# --8<-- [start:show]
# FastAPI: the same store class, behind the ASGI middleware
from idempotency_middleware import IdempotencyMiddleware, SQLiteStore

app.add_middleware(IdempotencyMiddleware, store=SQLiteStore("/var/lib/myapp/idempotency.sqlite3"))
# --8<-- [end:show]
