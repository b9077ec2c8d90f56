"""The DynamoDB stores: ``DynamoDBStore`` (boto3) and ``AsyncDynamoDBStore`` (aioboto3).

``requests`` builds the requests and reads the answers, ``ops`` strings them into one flow
per store operation, ``transport`` sends them (the lean client of ``wire*``, or the SDK),
``errors`` says what a failure means, ``store`` is the public classes' configuration.
"""

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
