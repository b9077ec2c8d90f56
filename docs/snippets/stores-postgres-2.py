from idempotency_middleware import IdempotencyMiddleware, PostgresStore

store = PostgresStore("postgresql://app:secret@db.internal/app", table="idempotency")
store.create_table()  # once (deploy step or start-up): safe to repeat, from many processes
app.add_middleware(IdempotencyMiddleware, store=store)  # ASGI: the async methods
# WSGI (Flask, Django) and @idempotent on plain functions use the same object's sync methods.
