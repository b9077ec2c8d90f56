"""Business tables for the exactly-once write tests: an ``orders`` table (key ``id``, S) and
an ``inventory`` table (key ``sku``, S), made fresh (unique names) on a DynamoDB endpoint
(moto's server or DynamoDB Local), and read back with a plain boto3 client, never through
the package under test, so what a test sees is what DynamoDB holds.

    tables = business_tables(moto_endpoint)
    tables.set_stock("sku-1", 3)
    ...  # a handler or @idempotent function adds writes to completion_transaction()
    assert tables.stock("sku-1") == 2 and [o["id"] for o in tables.orders()] == ["o-1"]
    tables.close()

``create_business_tables`` is the same as a context manager that closes the client.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import boto3
from boto3.dynamodb.types import TypeDeserializer

__all__ = ["REGION", "BusinessTables", "business_tables", "create_business_tables"]

REGION = "us-east-1"

_DESERIALIZER = TypeDeserializer()


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    """A low-level DynamoDB item as Python values (numbers as ``Decimal``)."""
    return {name: _DESERIALIZER.deserialize(value) for name, value in item.items()}


@dataclass(frozen=True)
class BusinessTables:
    """The two tables of one test, and the boto3 client that made them."""

    orders_table: str
    inventory_table: str
    client: Any  # a boto3 DynamoDB client (botocore's clients are untyped)

    def orders(self) -> list[dict[str, Any]]:
        """Every item of the orders table (plain Python values), sorted by ``id``."""
        items: list[dict[str, Any]] = []
        request: dict[str, Any] = {"TableName": self.orders_table, "ConsistentRead": True}
        while True:
            page = self.client.scan(**request)
            items.extend(_plain(item) for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return sorted(items, key=lambda item: str(item["id"]))

    def order_ids(self) -> list[str]:
        """The ``id`` of every order, sorted."""
        return [str(item["id"]) for item in self.orders()]

    def stock(self, sku: str) -> int | None:
        """The ``stock`` of ``sku`` in the inventory table; ``None`` when it has no item."""
        response = self.client.get_item(
            TableName=self.inventory_table, Key={"sku": {"S": sku}}, ConsistentRead=True
        )
        item = response.get("Item")
        if item is None:
            return None
        value = _plain(item).get("stock")
        return None if value is None else int(Decimal(value))

    def set_stock(self, sku: str, count: int) -> None:
        """Write the inventory item of ``sku`` with ``stock = count`` (replacing it)."""
        self.client.put_item(
            TableName=self.inventory_table,
            Item={"sku": {"S": sku}, "stock": {"N": str(count)}},
        )

    def close(self) -> None:
        """Close the boto3 client's connections (the tables stay)."""
        self.client.close()


def _create(client: Any, name: str, key: str) -> None:
    client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
    )


def business_tables(endpoint: str, *, prefix: str = "biz") -> BusinessTables:
    """Create a fresh ``orders`` (key ``id``) and ``inventory`` (key ``sku``) table on
    ``endpoint``; their names are unique per call. The caller closes ``.client``
    (``close()``), or uses :func:`create_business_tables`."""
    client = boto3.session.Session(region_name=REGION).client("dynamodb", endpoint_url=endpoint)
    suffix = uuid.uuid4().hex[:12]
    tables = BusinessTables(f"{prefix}-orders-{suffix}", f"{prefix}-inventory-{suffix}", client)
    try:
        _create(client, tables.orders_table, "id")
        _create(client, tables.inventory_table, "sku")
    except BaseException:
        client.close()
        raise
    return tables


@contextlib.contextmanager
def create_business_tables(endpoint: str, *, prefix: str = "biz") -> Iterator[BusinessTables]:
    """:func:`business_tables` whose client is closed when the block ends."""
    tables = business_tables(endpoint, prefix=prefix)
    try:
        yield tables
    finally:
        tables.close()
