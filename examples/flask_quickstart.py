"""The Flask quick start, complete: a ``flask create-table`` command creates the table once,
and the store's client is closed when the process exits.

    pip install -e '.[boto3,flask]' waitress     (from a checkout)
    flask --app flask_quickstart create-table
    waitress-serve flask_quickstart:app      (from this repository: examples.flask_quickstart:app)

The AWS SDK finds credentials the usual way (environment, ~/.aws, an instance role);
``AWS_ENDPOINT_URL_DYNAMODB`` points it at a local DynamoDB instead of AWS.
"""

import atexit
from typing import Any
from uuid import uuid4

from flask import Flask, request

from idempotency_middleware import DynamoDBStore, IdempotencyWSGIMiddleware

store = DynamoDBStore("idempotency", region_name="eu-west-1")
atexit.register(store.close)  # the store's boto3 client and its connections

app = Flask(__name__)
app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=store)  # type: ignore[method-assign]


@app.cli.command("create-table")
def create_table() -> None:
    """Create the idempotency table (on-demand billing, TTL on); safe to repeat."""
    store.create_table()
    print("table idempotency is ready")


@app.post("/orders")
def create_order() -> tuple[dict[str, Any], int]:
    # Runs once per Idempotency-Key: a retry gets this response back, the same order_id.
    return {"order_id": uuid4().hex, **request.get_json()}, 201
