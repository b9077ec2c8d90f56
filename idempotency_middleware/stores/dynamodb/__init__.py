"""The DynamoDB stores: ``requests`` builds and reads, ``ops`` makes flows of them,
``transport`` sends (the lean ``wire*`` client, or the SDK), ``errors`` explains failures."""

from .config import Transport
from .requests import MAX_ITEM_RESPONSE_BYTES, TableLayout
from .store import AsyncDynamoDBStore, DynamoDBStore, DynamoDBStoreBase

__all__ = [
    "MAX_ITEM_RESPONSE_BYTES",
    "AsyncDynamoDBStore",
    "DynamoDBStore",
    "DynamoDBStoreBase",
    "TableLayout",
    "Transport",
]
