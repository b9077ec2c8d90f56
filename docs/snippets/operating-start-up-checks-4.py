# --8<-- [start:show]
# settings.py
from idempotency_middleware import SQLiteStore

IDEMPOTENCY = {"store": SQLiteStore("idempotency.sqlite3"), "check_store": True}
# --8<-- [end:show]
assert IDEMPOTENCY["check_store"] is True
