# --8<-- [start:show]
import os

from fastapi import FastAPI

from idempotency_middleware import IdempotencyMiddleware, PostgresStore

store = PostgresStore(os.environ["DATABASE_URL"], table="idempotency")  # postgresql://...
store.create_table()  # once (deploy step or start-up): safe to repeat, from many processes
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=store)  # ASGI: the async methods
# WSGI (Flask, Django) and @idempotent on plain functions use the same object's sync methods.
# --8<-- [end:show]
store.close()
