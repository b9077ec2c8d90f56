"""``SQLiteStore`` on the store kit: ops.py (statements and flows), transport.py (a flow on
one connection, sync, on the store's threads, or inline on the event loop), errors.py
(SQLite's failures as ``StoreUnavailable``), store.py (the public class)."""

from .store import SQLiteStore

__all__ = ["SQLiteStore"]
