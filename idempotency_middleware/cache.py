"""An opt-in, per-process LRU of completed records: replays without a store call.

Only completed records are cached (an in-progress record changes under us), each until its
own ``expires_at``. A record deleted from the store by an operator keeps replaying from this
cache until it expires or is evicted; size the cache (``replay_cache_size``) accordingly.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .records import COMPLETED, Record


class ReplayCache:
    __slots__ = ("_entries", "_lock", "_max_entries")

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[str, Record] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now: float) -> Record | None:
        with self._lock:
            record = self._entries.get(key)
            if record is None:
                return None
            if record.is_expired(now):
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return record

    def put(self, record: Record) -> None:
        if record.status is not COMPLETED:
            return
        with self._lock:
            self._entries[record.key_hash] = record
            self._entries.move_to_end(record.key_hash)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
