"""One-time actions on a ``MemoryStore``: a dict beside its records, under its lock."""

from __future__ import annotations

import threading
import weakref

from ..stores.memory import MemoryStore
from .model import ActionRecord
from .steps import Insert, Read, Step, Written, apply

# Forgotten actions are dropped at most this often (by the steps' own time), on a create.
PURGE_INTERVAL_SECONDS = 60.0


class _Actions:
    __slots__ = ("next_purge", "records")

    def __init__(self) -> None:
        self.records: dict[str, ActionRecord] = {}
        self.next_purge = 0.0


# One table per store, living as long as the store: every OneTimeActions on one store sees
# the same actions, as with any other store.
_TABLES: weakref.WeakKeyDictionary[MemoryStore, _Actions] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


class MemoryActions:
    """Every step is a few dict operations under the store's own lock (no I/O, so the
    async flavour calls the sync one directly)."""

    def __init__(self, store: MemoryStore) -> None:
        self._lock = store.lock
        with _TABLES_LOCK:
            actions = _TABLES.get(store)
            if actions is None:
                actions = _TABLES[store] = _Actions()
        self._actions = actions

    def write(self, step: Step) -> Written:
        actions = self._actions
        with self._lock:
            written = apply(step, actions.records.get(step.action_id))
            if written.ok and not isinstance(step, Read):
                assert written.record is not None
                actions.records[step.action_id] = written.record
            if isinstance(step, Insert) and step.now >= actions.next_purge:
                actions.next_purge = step.now + PURGE_INTERVAL_SECONDS
                gone = [key for key, kept in actions.records.items() if kept.is_gone(step.now)]
                for key in gone:
                    del actions.records[key]
        return written

    async def awrite(self, step: Step) -> Written:
        return self.write(step)

    def __len__(self) -> int:
        with self._lock:
            return len(self._actions.records)
