# --8<-- [start:show]
# Flask
from flask import Flask

from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore

app = Flask(__name__)
app.wsgi_app = IdempotencyWSGIMiddleware(
    app.wsgi_app, store=SQLiteStore("/var/lib/myapp/idempotency.sqlite3")
)
# --8<-- [end:show]
