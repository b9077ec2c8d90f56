"""Stores: where claims and completed responses live, and the kit for writing one.

A store author needs these names only: the protocol (:class:`SyncStore`, :class:`AsyncStore`)
and the operator interface (:class:`SyncOperations`, :class:`AsyncOperations`), the values
they take and return, :class:`ThreadedStore` to derive the async half of a blocking store,
and the clock a store takes. See ``base.py`` for what a store must guarantee; the contract
suite (``tests/test_store_contract.py``) is its definition.

The stores themselves (``MemoryStore``, ``SQLiteStore``, ``DynamoDBStore``,
``AsyncDynamoDBStore``) are imported from ``idempotency_middleware``.
"""

from __future__ import annotations

from ..clock import SYSTEM_CLOCK, Clock
from ..records import Record, Status, StoredResponse
from .protocol import (
    CLAIMED,
    TAKEN_OVER,
    AsyncOperations,
    AsyncStore,
    Claimed,
    ClaimRequest,
    ClaimResult,
    Completion,
    Held,
    StoreUnavailable,
    StoreUnavailableError,
    SyncOperations,
    SyncStore,
)
from .threaded import ThreadedStore

__all__ = [
    "CLAIMED",
    "SYSTEM_CLOCK",
    "TAKEN_OVER",
    "AsyncOperations",
    "AsyncStore",
    "ClaimRequest",
    "ClaimResult",
    "Claimed",
    "Clock",
    "Completion",
    "Held",
    "Record",
    "Status",
    "StoreUnavailable",
    "StoreUnavailableError",
    "StoredResponse",
    "SyncOperations",
    "SyncStore",
    "ThreadedStore",
]
