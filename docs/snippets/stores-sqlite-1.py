# --8<-- [start:setup]
from flask import Flask

app = Flask(__name__)
# --8<-- [end:setup]
# --8<-- [start:show]
# Flask
from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore

app.wsgi_app = IdempotencyWSGIMiddleware(
    app.wsgi_app, store=SQLiteStore("/var/lib/myapp/idempotency.sqlite3")
)
# --8<-- [end:show]
