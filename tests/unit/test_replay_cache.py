"""``replay_cache_size``: a per-process LRU of completed records, each kept until it expires."""

from __future__ import annotations

from idempotency_middleware.engine.cache import ENTRY_SECONDS, ReplayCache
from idempotency_middleware.stores.records import Record, Status, StoredResponse

NOW = 1_000_000.0


def completed(key_hash: str, *, expires_at: float = NOW + 60) -> Record:
    response = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id":1}')
    return Record(key_hash, Status.COMPLETED, "fp", "owner", NOW + 5, expires_at, response)


def test_a_completed_record_is_served_from_the_cache() -> None:
    cache = ReplayCache(4)
    record = completed("k")
    cache.put(record, NOW)
    assert cache.get("k", NOW) is record
    assert cache.get("other", NOW) is None


def test_an_in_progress_record_is_never_cached() -> None:
    cache = ReplayCache(4)
    cache.put(Record("k", Status.IN_PROGRESS, "fp", "owner", NOW + 5, NOW + 60), NOW)
    assert cache.get("k", NOW) is None
    assert len(cache) == 0


def test_a_record_is_dropped_once_it_expires() -> None:
    cache = ReplayCache(4)
    cache.put(completed("k", expires_at=NOW + 10), NOW)
    assert cache.get("k", NOW + 9.999) is not None
    assert cache.get("k", NOW + 10) is None
    assert len(cache) == 0  # dropped, not only hidden


def test_the_least_recently_used_record_is_evicted_beyond_the_size() -> None:
    cache = ReplayCache(2)
    cache.put(completed("a"), NOW)
    cache.put(completed("b"), NOW)
    assert cache.get("a", NOW) is not None  # a is now more recent than b
    cache.put(completed("c"), NOW)
    assert len(cache) == 2
    assert cache.get("b", NOW) is None
    assert cache.get("a", NOW) is not None
    assert cache.get("c", NOW) is not None


def test_putting_a_key_again_replaces_its_record_and_refreshes_it() -> None:
    cache = ReplayCache(2)
    cache.put(completed("a"), NOW)
    cache.put(completed("b"), NOW)
    newer = completed("a", expires_at=NOW + 120)
    cache.put(newer, NOW)
    cache.put(completed("c"), NOW)
    assert cache.get("a", NOW) is newer
    assert cache.get("b", NOW) is None


def test_a_record_is_read_from_the_store_again_once_its_entry_lifetime_ends() -> None:
    # A delete made elsewhere (the command line, another process) reaches this process only
    # through the store: an entry serves at most ENTRY_SECONDS, however long its TTL.
    cache = ReplayCache(4)
    cache.put(completed("k", expires_at=NOW + 86400), NOW)
    assert cache.get("k", NOW + ENTRY_SECONDS - 0.001) is not None
    assert cache.get("k", NOW + ENTRY_SECONDS) is None
    assert len(cache) == 0


def test_a_shorter_entry_lifetime_may_be_chosen() -> None:
    cache = ReplayCache(4, entry_seconds=5)
    cache.put(completed("k"), NOW)
    assert cache.get("k", NOW + 4.999) is not None
    assert cache.get("k", NOW + 5) is None


def test_discard_drops_a_key_and_ignores_one_it_does_not_hold() -> None:
    cache = ReplayCache(4)
    cache.put(completed("k"), NOW)
    cache.discard("k")
    cache.discard("never-cached")
    assert cache.get("k", NOW) is None
    assert len(cache) == 0
