"""What a store author needs: the protocols, their values, ``ThreadedStore`` for a blocking
client, and the clock (the kit: ``stores.kit``). The stores themselves are imported from
``idempotency_middleware``; the contract suite (``tests/contract/test_store_contract.py``) is the
definition of a store."""

from __future__ import annotations

from ..clock import SYSTEM_CLOCK, Clock
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
from .records import Record, Status, StoredResponse
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
