"""The store kinds the parametrized suites run over, named once.

A kind is a store and the flavour a test drives it through: ``memory`` is ``MemoryStore``'s
sync methods, ``memory-async`` its ``a``-prefixed ones; ``dynamodb`` is ``DynamoDBStore`` and
``dynamodb-async`` ``AsyncDynamoDBStore`` on moto's server; ``dynamodb-local`` and
``dynamodb-local-async`` the same classes on Amazon's DynamoDB Local (always generated, skipped
with the reason unless ``scripts/dynamodb-local.sh`` runs them: it selects ids containing
``dynamodb-local``); ``redis`` and ``postgres`` (and ``-async``) on the session's real servers
(tests/support/db_servers.py).
"""

from __future__ import annotations

MEMORY_KINDS = ["memory", "memory-async"]
SQLITE_KINDS = ["sqlite", "sqlite-async"]
MOTO_KINDS = ["dynamodb", "dynamodb-async"]
LOCAL_KINDS = ["dynamodb-local", "dynamodb-local-async"]
DYNAMODB_KINDS = [*MOTO_KINDS, *LOCAL_KINDS]
# The DynamoDB kinds above run on the stores' default transport; these keep the SDK path (a
# store given a boto3/aioboto3 session) under the DynamoDB-specific tests.
SDK_KINDS = ["dynamodb-sdk", "dynamodb-sdk-async"]
REDIS_KINDS = ["redis", "redis-async"]
POSTGRES_KINDS = ["postgres", "postgres-async"]
DB_KINDS = [*REDIS_KINDS, *POSTGRES_KINDS]
# Every store, sync and async.
STORE_KINDS = [*MEMORY_KINDS, *SQLITE_KINDS, *DYNAMODB_KINDS, *DB_KINDS]
# The stores whose conditional writes are atomic, where a concurrency claim is proven: every
# kind but moto's, whose threaded server runs two conditional writes on one item at once
# (tests/contract/test_moto_atomicity.py shows it).
ATOMIC_KINDS = [kind for kind in STORE_KINDS if kind not in MOTO_KINDS]
# The servers a command line names (``--redis``, ``--postgres``).
DB_SERVERS = ["redis", "postgres"]


def is_async(kind: str) -> bool:
    """A kind driven through the store's ``a``-prefixed methods."""
    return kind.endswith("-async")


def is_db_kind(kind: str) -> bool:
    """A Redis or PostgreSQL kind (``redis``, ``postgres-async`` ...)."""
    return kind.removesuffix("-async") in DB_SERVERS


def is_local(kind: str) -> bool:
    """A kind on Amazon's DynamoDB Local."""
    return kind in LOCAL_KINDS
