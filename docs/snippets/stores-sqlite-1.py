# Flask
from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore

app.wsgi_app = IdempotencyWSGIMiddleware(
    app.wsgi_app, store=SQLiteStore("/var/lib/myapp/idempotency.sqlite3")
)
