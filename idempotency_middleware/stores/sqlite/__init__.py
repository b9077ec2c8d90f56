"""``SQLiteStore``: ops.py, transport.py, errors.py and store.py on the store kit."""

from .store import SQLiteStore

__all__ = ["SQLiteStore"]
