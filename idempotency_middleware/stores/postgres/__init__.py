"""PostgreSQL: ``PostgresStore`` (psycopg 3), one table shared by every host of a service."""

from .store import PostgresStore

__all__ = ["PostgresStore"]
