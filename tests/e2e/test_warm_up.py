"""A DynamoDB client is created at start-up, not by the first claim: creating it can take
seconds on a loaded machine, and a claim pays for it out of its own lease."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore, IdempotencyMiddleware
from tests.conftest import REGION
from tests.support.servers import serve_asgi


async def create(request: Request) -> JSONResponse:
    return JSONResponse({"created": True}, status_code=201)


def app_with(store: Any) -> Starlette:
    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=store)
    return app


def test_the_asgi_middleware_creates_the_dynamodb_client_at_lifespan_start_up(
    moto_endpoint: str, dynamodb_table: str
) -> None:
    store = AsyncDynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION)
    assert store._transport.clients.values() == []
    with serve_asgi(app_with(store), on_shutdown=store.aclose, lifespan=True) as url:
        # Started, and no request has been made yet.
        assert store._transport.clients.values() != []
        with httpx.Client(base_url=url, trust_env=False) as client:
            response = client.post("/orders", json={}, headers={"Idempotency-Key": "w-1"})
        assert response.status_code == 201


class FailingWarmUp:
    """An async store whose warm-up fails (a missing extra, say): start-up goes on."""

    def __init__(self) -> None:
        from idempotency_middleware import MemoryStore

        self._store = MemoryStore()
        self.aclaim = self._store.aclaim
        self.acomplete = self._store.acomplete
        self.arelease = self._store.arelease
        self.arenew = self._store.arenew

    async def awarm_up(self) -> None:
        raise ModuleNotFoundError("No module named 'aioboto3'")


def test_a_store_that_cannot_warm_up_is_logged_and_the_app_still_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.ERROR, logger="idempotency_middleware"),
        serve_asgi(app_with(FailingWarmUp()), lifespan=True) as url,
        httpx.Client(base_url=url, trust_env=False) as client,
    ):
        response = client.post("/orders", json={}, headers={"Idempotency-Key": "w-2"})
    assert response.status_code == 201
    assert any("could not be warmed up" in record.getMessage() for record in caplog.records)


def test_the_sync_store_warms_up_on_request(moto_endpoint: str, dynamodb_table: str) -> None:
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        assert store._transport.client is None
        store.warm_up()
        assert store._transport.client is not None
