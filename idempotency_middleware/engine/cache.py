"""An opt-in, per-process LRU of completed records: replays without a store call.

Only completed records are cached (an in-progress record changes under us), each until its
own ``expires_at`` and for at most ``ENTRY_SECONDS`` after it was read from the store. That
second bound is what a delete made elsewhere (the command line, another process's
``forget``) relies on: this process cannot be told of it, so it reads the store again at
least that often and then sees the key gone. ``forget`` in this process evicts at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..stores.records import COMPLETED, Record

# How long a cached record replays before the store is asked again: how long a key deleted
# from outside this process may still be replayed here. One store read per minute per hot
# key keeps nearly all of the saving.
ENTRY_SECONDS = 60.0


class ReplayCache:
    __slots__ = ("_entries", "_entry_seconds", "_lock", "_max_entries")

    def __init__(self, max_entries: int, entry_seconds: float = ENTRY_SECONDS) -> None:
        self._max_entries = max_entries
        self._entry_seconds = entry_seconds
        # key hash -> (record, the time after which it is read from the store again)
        self._entries: OrderedDict[str, tuple[Record, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now: float) -> Record | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            record, stale_at = entry
            if now >= stale_at or record.is_expired(now):
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return record

    def put(self, record: Record, now: float) -> None:
        """Keep ``record`` (read from the store at ``now``) when it is completed."""
        if record.status is not COMPLETED:
            return
        with self._lock:
            self._entries[record.key_hash] = (record, now + self._entry_seconds)
            self._entries.move_to_end(record.key_hash)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def discard(self, key: str) -> None:
        """Forget ``key``'s record (its key was deleted): the next attempt asks the store."""
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
