"""What a store keeps, read and written behind its back: the stored response of a key in a
SQLite file, a Redis hash, a PostgreSQL row, a DynamoDB item (moto) and an S3 object.

``RawStore`` is a store of one kind with two operations a test needs and no store offers:
``corrupt(key_hash, blob)`` puts bytes that are no stored response where the response is,
and ``raw(key_hash)`` returns everything the backend keeps for the key (the whole SQLite
file and its WAL, the Redis hash, the PostgreSQL row, the DynamoDB item and its S3 object),
for "never in clear" checks.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from idempotency_middleware import DynamoDBStore, SQLiteStore
from tests.conftest import REGION
from tests.support.db_stores import location, new_store
from tests.support.servers import StoreKind

# The kinds whose raw records these reach (MemoryStore keeps objects, not bytes).
RAW_KINDS: list[StoreKind] = ["sqlite", "redis", "postgres", "dynamodb"]


@dataclass
class RawStore:
    kind: str
    store: Any
    where: str  # the SQLite file, the Redis URL, the DSN, the DynamoDB endpoint
    bucket: str | None = None  # the DynamoDB store's S3 overflow bucket

    @property
    def table(self) -> str:
        """The DynamoDB table."""
        return str(self.store.layout.table_name if self.store is not None else "")

    def corrupt(self, key_hash: str, blob: bytes) -> None:
        """Overwrite the stored response of ``key_hash`` with ``blob``."""
        if self.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self.where)) as connection, connection:
                changed = connection.execute(
                    f'UPDATE "{self.store.table_name}" SET response = ? WHERE key = ?',
                    (blob, key_hash),
                ).rowcount
            assert changed == 1
        elif self.kind == "redis":
            import redis

            with contextlib.closing(redis.Redis.from_url(self.where)) as client:
                key = f"{self.store.prefix}{key_hash}"
                assert client.exists(key)
                client.hset(key, "response", blob)
        elif self.kind == "postgres":
            import psycopg

            with psycopg.connect(self.where) as pg:
                changed = pg.execute(
                    f'UPDATE "{self.store.table}" SET response = %s WHERE key = %s',
                    (blob, key_hash),
                ).rowcount
            assert changed == 1
        else:
            self._dynamodb().update_item(
                TableName=self.table,
                Key={"pk": {"S": key_hash}},
                UpdateExpression="SET #r = :r",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames={"#r": "response"},
                ExpressionAttributeValues={":r": {"B": blob}},
            )

    def set_field(self, key_hash: str, field: str, value: Any) -> None:
        """Overwrite one field of ``key_hash``'s record with ``value`` (a DynamoDB
        attribute value for DynamoDB), or remove it when ``value`` is ``None`` (Redis and
        DynamoDB: the other stores' columns cannot be NULL)."""
        if self.kind in ("sqlite", "postgres"):
            table = self.store.table_name if self.kind == "sqlite" else self.store.table
            update = f'UPDATE "{table}" SET "{field}" = ? WHERE key = ?'
            if self.kind == "sqlite":
                with contextlib.closing(sqlite3.connect(self.where)) as connection, connection:
                    changed = connection.execute(update, (value, key_hash)).rowcount
            else:
                import psycopg

                with psycopg.connect(self.where) as pg:
                    changed = pg.execute(update.replace("?", "%s"), (value, key_hash)).rowcount
            assert changed == 1
        elif self.kind == "redis":
            import redis

            with contextlib.closing(redis.Redis.from_url(self.where)) as client:
                key = f"{self.store.prefix}{key_hash}"
                assert client.exists(key)
                if value is None:
                    client.hdel(key, field)
                else:
                    client.hset(key, field, value)
        else:
            names = {"#f": field}
            if value is None:
                update_item: dict[str, Any] = {"UpdateExpression": "REMOVE #f"}
            else:
                update_item = {
                    "UpdateExpression": "SET #f = :v",
                    "ExpressionAttributeValues": {":v": value},
                }
            self._dynamodb().update_item(
                TableName=self.table,
                Key={"pk": {"S": key_hash}},
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames=names,
                **update_item,
            )

    def raw(self, key_hash: str) -> bytes:
        """Everything the backend keeps for ``key_hash`` (for SQLite: the whole file)."""
        if self.kind == "sqlite":
            files = [Path(self.where), Path(self.where + "-wal")]
            return b"".join(path.read_bytes() for path in files if path.exists())
        if self.kind == "redis":
            import redis

            with contextlib.closing(redis.Redis.from_url(self.where)) as client:
                fields: dict[bytes, bytes] = client.hgetall(f"{self.store.prefix}{key_hash}")  # type: ignore[assignment]
            assert fields, "no record"
            return b"".join(name + b"=" + value for name, value in fields.items())
        if self.kind == "postgres":
            import psycopg

            with psycopg.connect(self.where) as connection:
                rows = connection.execute(
                    f'SELECT * FROM "{self.store.table}" WHERE key = %s', (key_hash,)
                ).fetchall()
            assert rows, "no record"
            return repr(rows).encode() + b"".join(
                bytes(value) for value in rows[0] if isinstance(value, (bytes, memoryview))
            )
        item = self._dynamodb().get_item(TableName=self.table, Key={"pk": {"S": key_hash}})["Item"]
        raw = repr(item).encode() + bytes(item.get("response", {}).get("B", b""))
        ref = item.get("response_ref", {}).get("S")
        if ref:
            s3 = boto3.client("s3", endpoint_url=self.where, region_name=REGION)
            raw += s3.get_object(Bucket=self.bucket, Key=ref)["Body"].read()
        return raw

    def _dynamodb(self) -> Any:
        return boto3.client("dynamodb", endpoint_url=self.where, region_name=REGION)


@dataclass
class RawTable(RawStore):
    """A DynamoDB table whose stores a harness makes itself (one per server)."""

    table_name: str = ""

    @property
    def table(self) -> str:
        return self.table_name


def raw_store_of(harness: Any) -> RawStore:
    """The raw view of a ``tests.support.servers.Harness``'s store."""
    kind = harness.store_kind
    if kind == "sqlite":
        return RawStore(kind, harness.sqlite_store, harness.sqlite_store.path)
    if kind in ("redis", "postgres"):
        return RawStore(kind, harness.db_store, harness._db_location)
    return RawTable(kind, None, harness._dynamodb_endpoint, table_name=harness._table_name)


def open_raw_store(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path, **options: Any
) -> Iterator[RawStore]:
    """A sync store of ``kind`` (a fresh file, namespace or table), closed after."""
    if kind == "sqlite":
        path = str(tmp_path / "raw.sqlite3")
        store: Any = SQLiteStore(path, **options)
        raw = RawStore(kind, store, path)
    elif kind in ("redis", "postgres"):
        where = location(request, kind)
        raw = RawStore(kind, new_store(kind, where, **options), where)
    else:
        endpoint: str = request.getfixturevalue("moto_endpoint")
        table = f"idem-raw-{uuid.uuid4().hex[:10]}"
        bucket = f"raw-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket=bucket)
        store = DynamoDBStore(
            table,
            endpoint_url=endpoint,
            region_name=REGION,
            s3_bucket=bucket,
            s3_endpoint_url=endpoint,
            **options,
        )
        store.create_table()
        raw = RawStore(kind, store, endpoint, bucket)
    try:
        yield raw
    finally:
        raw.store.close()
