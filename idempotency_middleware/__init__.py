"""Make POST and PATCH endpoints (by default; PUT and DELETE when opted in), message consumers
and functions safe to retry with an ``Idempotency-Key`` header or a key of your own.

boto3 and aioboto3 are imported only when a DynamoDB store first connects (or an SQSWorker
makes its own client), so a Flask app needs only boto3 and a FastAPI app only aioboto3.
"""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it from here
# ([tool.setuptools.dynamic]), as does `idempotency-middleware --version`.
__version__ = "0.1.0"

from .actions import (
    Action,
    ActionAlreadyUsedError,
    ActionCanceledError,
    ActionError,
    ActionExistsError,
    ActionExpiredError,
    ActionLockedError,
    ActionNotActiveError,
    ActionNotFoundError,
    ActionState,
    InvalidPinError,
    OneTimeActions,
)
from .consumers.consumer import IdempotentConsumer, Outcome
from .consumers.lambda_batches import aprocess_lambda_batch, process_lambda_batch
from .consumers.sqs_worker import SQSWorker
from .errors import (
    IdempotencyError,
    InvalidKeyError,
    KeyInProgressError,
    KeyReusedError,
    ResultNotStoredError,
    StoredResultUnreadableError,
    StoreUnavailableError,
    TransactionConflictError,
    TransactionRejectedError,
)
from .events import IdempotencyEvent
from .functions.idempotent import IdempotentFunction, idempotent
from .handler.deferred import defer_completion
from .handler.transactions import Transaction, completion_transaction
from .policy.request_view import HeaderView, RequestView
from .policy.rules import IdempotencyRule
from .policy.scopes import scope_by_header, scope_by_tenant_header
from .stores.dynamodb import AsyncDynamoDBStore, DynamoDBStore
from .stores.encryption import Encryption
from .stores.memory import MemoryStore
from .stores.postgres import PostgresStore
from .stores.protocol import AsyncStore, StoreUnavailable, SyncStore
from .stores.redis import RedisStore
from .stores.sqlite import SQLiteStore
from .web.asgi import IdempotencyMiddleware
from .web.wsgi import IdempotencyWSGIMiddleware

__all__ = [
    "Action",
    "ActionAlreadyUsedError",
    "ActionCanceledError",
    "ActionError",
    "ActionExistsError",
    "ActionExpiredError",
    "ActionLockedError",
    "ActionNotActiveError",
    "ActionNotFoundError",
    "ActionState",
    "AsyncDynamoDBStore",
    "AsyncStore",
    "DynamoDBStore",
    "Encryption",
    "HeaderView",
    "IdempotencyError",
    "IdempotencyEvent",
    "IdempotencyMiddleware",
    "IdempotencyRule",
    "IdempotencyWSGIMiddleware",
    "IdempotentConsumer",
    "IdempotentFunction",
    "InvalidKeyError",
    "InvalidPinError",
    "KeyInProgressError",
    "KeyReusedError",
    "MemoryStore",
    "OneTimeActions",
    "Outcome",
    "PostgresStore",
    "RedisStore",
    "RequestView",
    "ResultNotStoredError",
    "SQLiteStore",
    "SQSWorker",
    "StoreUnavailable",
    "StoreUnavailableError",
    "StoredResultUnreadableError",
    "SyncStore",
    "Transaction",
    "TransactionConflictError",
    "TransactionRejectedError",
    "aprocess_lambda_batch",
    "completion_transaction",
    "defer_completion",
    "idempotent",
    "process_lambda_batch",
    "scope_by_header",
    "scope_by_tenant_header",
]
