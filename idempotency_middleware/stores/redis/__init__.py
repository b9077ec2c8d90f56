"""``RedisStore``: records in Redis, Valkey or Redis Cluster (see ``store.py``)."""

from .store import RedisStore

__all__ = ["RedisStore"]
