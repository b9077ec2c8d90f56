# FastAPI: the same store class, behind the ASGI middleware
from idempotency_middleware import IdempotencyMiddleware, SQLiteStore

app.add_middleware(IdempotencyMiddleware, store=SQLiteStore("/var/lib/myapp/idempotency.sqlite3"))
