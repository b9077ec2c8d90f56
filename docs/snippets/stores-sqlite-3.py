# --8<-- [start:show]
# FastAPI: the same store class, behind the ASGI middleware
from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, SQLiteStore

app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=SQLiteStore("/var/lib/myapp/idempotency.sqlite3"))
# --8<-- [end:show]
