# --8<-- [start:show]
from fastapi import FastAPI
from flask import Flask

from idempotency_middleware import (
    AsyncDynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    SQLiteStore,
)

# ASGI: the lifespan start-up runs `await store.acheck()`; a failure fails the start-up.
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=AsyncDynamoDBStore("idempotency"), check_store=True)

# WSGI: the middleware's construction runs `store.check()` and raises its error.
flask_app = Flask(__name__)
flask_app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
    flask_app.wsgi_app, store=SQLiteStore("idempotency.sqlite3"), check_store=True
)
# --8<-- [end:show]

# A misspelled option is a TypeError naming it, where it is written.
try:
    IdempotencyWSGIMiddleware(flask_app.wsgi_app, store=SQLiteStore("x.sqlite3"), ttl=60)  # type: ignore[call-arg]
except TypeError as error:
    assert "got unknown option 'ttl' (did you mean 'ttl_seconds'?)" in str(error), error
else:
    raise AssertionError("the misspelled option was taken")
