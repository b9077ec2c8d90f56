"""Shared fixtures: a real DynamoDB wire protocol (moto's server mode on 127.0.0.1)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from moto.server import ThreadedMotoServer

from idempotency_middleware import DynamoDBStore

# moto accepts any credentials; botocore only needs some to sign requests. Never a real AWS.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for _variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(_variable, None)

REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a moto server on 127.0.0.1 (a free port), for the whole test session."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def dynamodb_table(moto_endpoint: str) -> Iterator[str]:
    """A fresh idempotency table (created through our own ``create_table``); its name."""
    name = f"idem-{uuid.uuid4().hex[:12]}"
    with DynamoDBStore(name, endpoint_url=moto_endpoint, region_name=REGION) as store:
        store.create_table()
    yield name
