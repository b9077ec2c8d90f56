"""The DynamoDB stores: ``DynamoDBStore`` (boto3) and ``AsyncDynamoDBStore`` (aioboto3).
``requests`` builds requests and reads answers, ``ops`` strings them into flows,
``transport`` sends them (the lean client of ``wire*``, or the SDK), ``errors`` says what a
failure means."""

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
