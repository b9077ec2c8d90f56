"""``store.check()`` / ``acheck()`` failing for each store's real causes, on real servers (a
ready store passing is in the contract suite), and the doors that run it at start-up
(``check_store=True``) or refuse a misspelled option.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
import uvicorn
from django.core.exceptions import ImproperlyConfigured
from fastapi import FastAPI
from starlette.applications import Starlette

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    SQLiteStore,
    StoreUnavailableError,
    idempotent,
)
from idempotency_middleware.fastapi import IdempotencyKey
from idempotency_middleware.stores import ThreadedStore
from idempotency_middleware.web.asgi import Message
from tests.conftest import REGION, new_table
from tests.support.db_stores import location, unreachable_store
from tests.support.ports import free_port


def failure(check: Any) -> StoreUnavailableError:
    """The error a failing ``check`` (or coroutine of ``acheck``) raises."""
    with pytest.raises(StoreUnavailableError) as raised:
        asyncio.run(check) if asyncio.iscoroutine(check) else check()
    return raised.value


# --- DynamoDB on moto's server -------------------------------------------------------------


def dynamodb(table: str, endpoint: str, **options: Any) -> DynamoDBStore:
    return DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION, **options)


def raw_client(endpoint: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)


def test_dynamodb_check_names_a_missing_table_and_how_to_create_it(moto_endpoint: str) -> None:
    with dynamodb("no-such-table", moto_endpoint) as store:
        error = failure(store.check)
    assert error.cause == "no_table" and error.misconfigured
    assert error.reason == "no such table 'no-such-table'"
    assert str(error).startswith("DynamoDBStore is not usable: no such table 'no-such-table'; ")
    assert "store.create_table()" in str(error)


def test_async_dynamodb_acheck_names_a_missing_table(moto_endpoint: str) -> None:
    store = AsyncDynamoDBStore("no-such-table", endpoint_url=moto_endpoint, region_name=REGION)

    async def check() -> None:
        async with store:
            await store.acheck()

    error = failure(check())
    assert error.cause == "no_table"
    assert "AsyncDynamoDBStore is not usable: no such table 'no-such-table'" in str(error)


def test_dynamodb_check_refuses_a_table_keyed_otherwise(moto_endpoint: str) -> None:
    table = f"other-{uuid.uuid4().hex[:8]}"
    raw_client(moto_endpoint).create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "id", "AttributeType": "S"},
            {"AttributeName": "at", "AttributeType": "N"},
        ],
        KeySchema=[
            {"AttributeName": "id", "KeyType": "HASH"},
            {"AttributeName": "at", "KeyType": "RANGE"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    with dynamodb(table, moto_endpoint) as store:
        error = failure(store.check)
    assert error.cause == "bad_schema" and error.misconfigured
    assert error.reason == (
        f"table {table!r} is keyed by id (HASH), at (RANGE), "
        "not by the string partition key 'pk' alone"
    )
    assert "recreate it" in str(error)


def test_dynamodb_check_refuses_a_table_without_ttl_then_passes_once_create_table_enabled_it(
    moto_endpoint: str,
) -> None:
    table = f"no-ttl-{uuid.uuid4().hex[:8]}"
    raw_client(moto_endpoint).create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with dynamodb(table, moto_endpoint) as store:
        error = failure(store.check)
        assert error.cause == "bad_schema"
        assert f"table {table!r} has no TTL on 'ttl'" in error.reason
        store.create_table()
        store.check()  # passes now


def test_dynamodb_check_with_another_key_attribute_than_the_table_has(moto_endpoint: str) -> None:
    with dynamodb(new_table(moto_endpoint), moto_endpoint, key_attribute="id") as store:
        error = failure(store.check)
    assert error.cause == "bad_schema"
    assert "keyed by pk (HASH), not by the string partition key 'id' alone" in error.reason


def test_dynamodb_check_without_credentials_says_how_to_give_them(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = new_table(moto_endpoint)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with dynamodb(table, moto_endpoint) as store:
        error = failure(store.check)
    assert error.cause == "no_credentials"
    assert "AWS_ACCESS_KEY_ID" in str(error)


def test_a_failed_check_neither_waits_for_nor_counts_in_the_breaker(moto_endpoint: str) -> None:
    with dynamodb("no-such-table", moto_endpoint, breaker_threshold=1) as store:
        failure(store.check)
        failure(store.check)  # not refused by an open breaker: sent again
        assert store.breaker_state == "closed"


# --- Redis and PostgreSQL ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["redis", "postgres", "redis-async", "postgres-async"])
def test_check_of_a_server_that_is_not_there_says_it_is_unreachable(kind: str) -> None:
    store = unreachable_store(kind, free_port())
    error = failure(store.acheck() if kind.endswith("-async") else store.check)
    store.close()
    assert error.cause == "unreachable"
    assert "127.0.0.1" in error.reason
    assert "check the store's URL or endpoint, and that the server is running" in str(error)


@pytest.mark.servers  # the session PostgreSQL server
def test_postgres_check_names_a_missing_table(request: pytest.FixtureRequest) -> None:
    from idempotency_middleware import PostgresStore

    with PostgresStore(location(request, "postgres"), table="no_such_table") as store:
        error = failure(store.check)
    assert error.cause == "no_table"
    assert "no such table 'no_such_table'" in error.reason
    assert "create it: store.create_table()" in str(error)


@pytest.mark.servers  # the session PostgreSQL server
def test_postgres_check_refuses_a_table_without_the_stores_columns(
    request: pytest.FixtureRequest,
) -> None:
    import psycopg

    from idempotency_middleware import PostgresStore

    dsn, table = location(request, "postgres"), f"other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, value text)")
    with PostgresStore(dsn, table=table) as store:
        error = failure(store.check)
    assert error.cause == "bad_schema"
    assert error.reason.startswith(f"table {table!r} lacks the store's columns")


# --- SQLite --------------------------------------------------------------------------------


def test_sqlite_check_of_a_new_file_passes_without_creating_it(tmp_path: Path) -> None:
    path = tmp_path / "idempotency.sqlite3"
    with SQLiteStore(path) as store:
        store.check()  # passes
        asyncio.run(store.acheck())
    assert not path.exists()


def test_sqlite_check_names_a_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "idempotency.sqlite3"
    with SQLiteStore(path) as store:
        error = failure(store.check)
        assert failure(store.acheck()).cause == "cannot_open"
    assert error.cause == "cannot_open"
    assert (
        error.reason == f"directory {str(tmp_path / 'missing')!r} (of {str(path)!r}) does not exist"
    )
    assert error.fix == (
        f"create the directory {str(tmp_path / 'missing')!r}, or fix the path {str(path)!r}"
    )
    assert str(error).endswith(f"; {error.fix}")
    assert not (tmp_path / "missing").exists()


def test_sqlite_check_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a database, but long enough to have a header " * 4)
    with SQLiteStore(path) as store:
        error = failure(store.check)
    assert error.cause == "io_error"
    assert str(path) in error.reason


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory this process cannot create files in: a read-only one, or where root
    writes anywhere, /proc/sys (the kernel refuses new files there)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return folder
    return Path("/proc/sys")


def test_sqlite_check_refuses_a_directory_it_cannot_write(tmp_path: Path) -> None:
    folder = unwritable_directory(tmp_path)
    if os.access(folder, os.W_OK):
        pytest.skip(f"{folder} is writable here")
    with SQLiteStore(folder / "idempotency.sqlite3") as store:
        error = failure(store.check)
    assert error.cause == "access_denied"
    assert error.reason == f"{str(folder)!r} is not writable by this process"
    assert str(error).endswith(
        f"; make {str(folder / 'idempotency.sqlite3')!r} and its directory {str(folder)!r} "
        "writable by this process"
    )


# --- the default check of a store on the kit or on ThreadedStore --------------------------


class FailingThreadedStore(ThreadedStore):
    """Every read fails as an unreachable backend does."""

    def get(self, key_hash: str) -> None:
        raise StoreUnavailableError("down", cause="unreachable", reason="cannot connect to x")

    claim = complete = release = renew = delete = create_table = get  # type: ignore[assignment]


def test_a_threaded_store_checks_by_reading_and_says_why_it_could_not() -> None:
    with FailingThreadedStore() as store:
        assert failure(store.check).reason == "cannot connect to x"
        error = failure(store.acheck())
    assert str(error).startswith("FailingThreadedStore is not usable: cannot connect to x; ")


# --- the doors: check_store=True -----------------------------------------------------------


def test_asgi_start_up_under_uvicorn_fails_with_the_checks_message(
    moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = AsyncDynamoDBStore("no-such-table", endpoint_url=moto_endpoint, region_name=REGION)
    app = Starlette()
    app.add_middleware(IdempotencyMiddleware, store=store, check_store=True)
    messages = serve_until_exit(app, caplog)
    assert any(
        message.startswith("AsyncDynamoDBStore is not usable: no such table 'no-such-table'")
        for message in messages
    ), messages


def test_asgi_start_up_with_a_usable_store_completes(moto_endpoint: str) -> None:
    table = new_table(moto_endpoint)
    store = AsyncDynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION)
    app = Starlette()
    app.add_middleware(IdempotencyMiddleware, store=store, check_store=True)
    incoming: list[Message] = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    async def lifespan() -> None:
        async with store:
            await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)

    asyncio.run(lifespan())
    assert [message["type"] for message in sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]


def serve_until_exit(app: Any, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Run ``app`` under uvicorn with ``--lifespan on``; the error lines of its failed
    start-up (it must fail)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_config=None)
    server = uvicorn.Server(config)
    with (
        caplog.at_level(logging.ERROR, logger="uvicorn.error"),
        pytest.raises(SystemExit) as exited,
    ):
        asyncio.run(server.serve())
    assert exited.value.code == 3  # uvicorn's STARTUP_FAILURE
    assert not server.started
    return [record.getMessage() for record in caplog.records] + [
        str(record.exc_info[1]) for record in caplog.records if record.exc_info
    ]


def test_wsgi_construction_raises_the_checks_error(moto_endpoint: str) -> None:
    def app(environ: Any, start_response: Any) -> list[bytes]:
        return []

    with dynamodb("no-such-table", moto_endpoint) as store:
        with pytest.raises(StoreUnavailableError, match="no such table 'no-such-table'"):
            IdempotencyWSGIMiddleware(app, store=store, check_store=True)
        assert IdempotencyWSGIMiddleware(app, store=MemoryStore(), check_store=True)


def test_check_store_with_a_store_that_cannot_check_is_refused_at_construction() -> None:
    class ProtocolOnly:
        def claim(self, request: Any) -> Any:
            return None

        def complete(self, completion: Any) -> bool:
            return False

        def release(self, key_hash: str, owner: str) -> bool:
            return False

        def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
            return False

    with pytest.raises(TypeError, match=r"check_store=True needs a store with check\(\)"):
        IdempotencyWSGIMiddleware(lambda e, s: [], store=ProtocolOnly(), check_store=True)


# --- the doors: a misspelled option --------------------------------------------------------

MISSPELLED = r"got unknown option 'ttl' \(did you mean 'ttl_seconds'\?\); its options are "


def test_asgi_names_a_misspelled_option() -> None:
    with pytest.raises(TypeError, match="IdempotencyMiddleware " + MISSPELLED) as raised:
        IdempotencyMiddleware(Starlette(), store=MemoryStore(), ttl=60)  # type: ignore[call-arg]
    assert "check_store, clock" in str(raised.value)


def test_asgi_misspelled_option_stops_uvicorn_with_lifespan_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Starlette()
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), ttl=60)  # type: ignore[call-arg]
    messages = serve_until_exit(app, caplog)
    assert any("did you mean 'ttl_seconds'?" in message for message in messages), messages


def test_wsgi_names_a_misspelled_option() -> None:
    with pytest.raises(TypeError, match="IdempotencyWSGIMiddleware " + MISSPELLED):
        IdempotencyWSGIMiddleware(lambda e, s: [], store=MemoryStore(), ttl=60)  # type: ignore[call-arg]


def test_idempotent_names_a_misspelled_option() -> None:
    with pytest.raises(TypeError, match=r"idempotent\(\) " + MISSPELLED):
        idempotent(store=MemoryStore(), key="order_id", ttl=60)  # type: ignore[call-arg]


def test_idempotency_key_names_a_misspelled_option() -> None:
    with pytest.raises(TypeError, match=r"IdempotencyKey got unknown option 'requried' "):
        IdempotencyKey(requried=True)  # type: ignore[call-arg]


def test_document_idempotency_names_a_misspelled_middleware_option() -> None:
    from idempotency_middleware.fastapi import document_idempotency

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), ttl=60)  # type: ignore[call-arg]
    document_idempotency(app)
    with pytest.raises(TypeError, match="IdempotencyMiddleware " + MISSPELLED):
        app.openapi()


def test_django_setting_names_a_misspelled_option() -> None:
    from django.test import override_settings

    from idempotency_middleware.web.django import configuration
    from tests.support import django_project  # noqa: F401  # configures Django's settings once

    with (
        override_settings(IDEMPOTENCY={"store": MemoryStore(), "ttl": 60}),
        pytest.raises(TypeError, match="the IDEMPOTENCY setting " + MISSPELLED) as raised,
    ):
        configuration()
    assert isinstance(raised.value, ImproperlyConfigured)


def test_django_check_store_fails_the_middlewares_construction(moto_endpoint: str) -> None:
    from django.test import override_settings

    from idempotency_middleware.web.django import configuration
    from tests.support import django_project  # noqa: F401

    with (
        dynamodb("no-such-table", moto_endpoint) as store,
        override_settings(IDEMPOTENCY={"store": store, "check_store": True}),
        pytest.raises(StoreUnavailableError, match="DynamoDBStore is not usable: no such table"),
    ):
        configuration()
