import asyncio
import tempfile
from pathlib import Path

# --8<-- [start:show]
from idempotency_middleware import SQLiteStore, StoreUnavailableError

store = SQLiteStore("/var/lib/no-such-directory/idempotency.sqlite3")
try:
    store.check()  # or, on an event loop: await store.acheck()
except StoreUnavailableError as error:
    print(error.cause)  # cannot_open
    print(error)  # SQLiteStore is not usable: directory '/var/lib/no-such-directory' (of ...
    print(error.fix)  # create the directory '/var/lib/no-such-directory', or fix the path ...
    # --8<-- [end:show]
    assert error.cause == "cannot_open"
    assert str(error).startswith(
        "SQLiteStore is not usable: directory '/var/lib/no-such-directory'"
    )
    assert error.fix == (
        "create the directory '/var/lib/no-such-directory', "
        "or fix the path '/var/lib/no-such-directory/idempotency.sqlite3'"
    )
    assert str(error).endswith(f"; {error.fix}")
else:
    raise AssertionError("the check passed")

# A usable store passes, and the check creates nothing: the file is made on first use.
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "idempotency.sqlite3"
    SQLiteStore(path).check()
    asyncio.run(SQLiteStore(path).acheck())
    assert not path.exists()
from idempotency_middleware import MemoryStore

MemoryStore().check()
