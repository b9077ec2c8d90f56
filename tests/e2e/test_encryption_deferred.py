"""A deferral's final response, stored by the worker with
``store.complete_deferred(token, ..., encryption=...)``, is sealed like every other
response: no plaintext in the raw record of any store kind (SQLite, Redis, PostgreSQL,
DynamoDB on moto, MemoryStore), replayed through the encrypted door. The door is the WSGI
middleware on waitress; the worker calls the store from outside the request."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flask import Flask
from flask import Response as FlaskResponse

from idempotency_middleware import (
    IdempotencyWSGIMiddleware,
    MemoryStore,
    defer_completion,
)
from idempotency_middleware.handler.deferred import parse_token
from idempotency_middleware.stores.records import SealedResponse
from tests.e2e.test_encryption import ONLY_NEW, ROTATED, secret
from tests.support.raw_records import RAW_KINDS, RawStore, open_raw_store
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_wsgi

HEADERS = [(b"content-type", b"application/json")]


@pytest.fixture(params=RAW_KINDS)
def raw_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RawStore]:
    yield from open_raw_store(request, request.param, tmp_path)


@contextlib.contextmanager
def serve_jobs(store: Any, tokens: list[str], **options: Any) -> Iterator[httpx.Client]:
    """Flask behind the encrypted WSGI middleware: POST /jobs defers and answers 202."""
    app = Flask("sealed_jobs")

    @app.route("/jobs", methods=["POST"])
    def jobs() -> FlaskResponse:
        tokens.append(defer_completion())
        return FlaskResponse(b'{"state":"accepted"}', 202, content_type="application/json")

    app.wsgi_app = IdempotencyWSGIMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, store=store, encryption=ROTATED, **options
    )
    with (
        serve_wsgi(app) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False) as client,
    ):
        yield client


def post(client: httpx.Client, key: str) -> httpx.Response:
    return client.post("/jobs", json={"sku": "A-1"}, headers={"Idempotency-Key": key})


def test_a_final_response_completed_with_encryption_is_stored_sealed_and_replays(
    raw_store: RawStore,
) -> None:
    tokens: list[str] = []
    with serve_jobs(raw_store.store, tokens) as client:
        key = uuid.uuid4().hex
        assert post(client, key).status_code == 202
        [token] = tokens
        value = secret()
        final = f'{{"card":"{value}"}}'.encode()

        assert raw_store.store.complete_deferred(token, 200, HEADERS, final, encryption=ROTATED)

        raw = raw_store.raw(parse_token(token).key_hash)
        assert value.encode() not in raw
        assert b"2026-11" in raw
        replay = post(client, key)
        assert replay.status_code == 200 and replay.content == final
        assert replay.headers["idempotent-replayed"] == "true"
        # Spent: a second completion is refused, sealed or not.
        assert raw_store.store.complete_deferred(token, 201, encryption=ROTATED) is False
        assert post(client, key).content == final
        assert tokens == [token]


async def test_memory_store_seals_a_final_response_sync_and_async() -> None:
    store = MemoryStore()
    tokens: list[str] = []
    with serve_jobs(store, tokens) as client:
        keys = [uuid.uuid4().hex, uuid.uuid4().hex]
        for key in keys:
            assert post(client, key).status_code == 202
        sync_token, async_token = tokens

        assert store.complete_deferred(sync_token, 200, HEADERS, b'{"n":1}', encryption=ROTATED)
        assert await store.acomplete_deferred(
            async_token, 200, HEADERS, b'{"n":2}', encryption=ROTATED
        )

        for token in tokens:
            record = store.get(parse_token(token).key_hash)
            assert record is not None and type(record.response) is SealedResponse
        assert [post(client, key).content for key in keys] == [b'{"n":1}', b'{"n":2}']


def test_a_final_response_sealed_with_an_unknown_key_is_unreadable_never_rerun() -> None:
    store = MemoryStore()
    tokens: list[str] = []
    with serve_jobs(store, tokens) as client:
        key = uuid.uuid4().hex
        post(client, key)
        [token] = tokens
        other = type(ROTATED)(keys={"elsewhere": bytes(32)}, current="elsewhere")
        assert store.complete_deferred(token, 200, HEADERS, b"{}", encryption=other)

        retry = post(client, key)

        assert retry.status_code == 500
        assert retry.json()["type"].endswith("stored-response-unreadable")
        assert tokens == [token]


def test_without_encryption_the_final_response_stays_plain_and_still_replays() -> None:
    store = MemoryStore()
    tokens: list[str] = []
    with serve_jobs(store, tokens) as client:
        key = uuid.uuid4().hex
        post(client, key)
        [token] = tokens
        assert store.complete_deferred(token, 200, HEADERS, b'{"plain":1}')

        record = store.get(parse_token(token).key_hash)
        assert record is not None and type(record.response) is not SealedResponse
        assert post(client, key).content == b'{"plain":1}'


def test_a_token_that_no_longer_applies_is_false_without_writing(raw_store: RawStore) -> None:
    tokens: list[str] = []
    with serve_jobs(raw_store.store, tokens) as client:
        key = uuid.uuid4().hex
        post(client, key)
        [token] = tokens
        assert raw_store.store.release_deferred(token)

        assert raw_store.store.complete_deferred(token, 200, encryption=ONLY_NEW) is False
        assert raw_store.store.get(parse_token(token).key_hash) is None


def test_encryption_must_be_an_encryption() -> None:
    store = MemoryStore()
    tokens: list[str] = []
    with serve_jobs(store, tokens) as client:
        post(client, uuid.uuid4().hex)
        with pytest.raises(TypeError, match="encryption must be an Encryption"):
            store.complete_deferred(tokens[0], 200, encryption="key")  # type: ignore[arg-type]
