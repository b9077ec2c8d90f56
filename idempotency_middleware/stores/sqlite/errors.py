"""SQLite's failures: which mean the database could not answer, and why."""

from __future__ import annotations

import sqlite3

from ..protocol import StoreUnavailable

# SQLite's primary result codes, by the cause they mean (see errors.CAUSES).
_CAUSES_BY_CODE = {
    **dict.fromkeys((3, 8, 23), "access_denied"),  # SQLITE_PERM, _READONLY, _AUTH
    **dict.fromkeys((5, 6), "busy"),  # SQLITE_BUSY, _LOCKED
    **dict.fromkeys((10, 11, 13, 26), "io_error"),  # SQLITE_IOERR, _CORRUPT, _FULL, _NOTADB
    14: "cannot_open",  # SQLITE_CANTOPEN
}
# Python 3.10's sqlite3 errors carry no code: SQLite's own messages for the same codes.
_CODES_BY_MESSAGE = (
    ("database is locked", 5),
    ("database table is locked", 6),
    ("readonly database", 8),
    ("disk i/o error", 10),
    ("malformed", 11),
    ("database or disk is full", 13),
    ("unable to open", 14),
    ("not a database", 26),
)


def _primary_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return int(code) & 0xFF
    message = str(error).lower()
    return next((number for text, number in _CODES_BY_MESSAGE if text in message), None)


def is_busy(error: BaseException) -> bool:
    return isinstance(error, sqlite3.Error) and _primary_code(error) in (5, 6)


def is_unavailable(error: sqlite3.Error) -> bool:
    """The database could not answer (not a bug in our SQL): OperationalError is a lock held
    past the busy timeout, an I/O error, a full disk, a file that cannot be opened; a bare
    DatabaseError a corrupt file or not a database."""
    return isinstance(error, sqlite3.OperationalError) or type(error) is sqlite3.DatabaseError


def unavailable(operation: str, error: sqlite3.Error, path: str) -> StoreUnavailable:
    cause = _CAUSES_BY_CODE.get(_primary_code(error) or 0, "unknown")
    reasons = {
        "busy": f"database {path!r} is locked by another writer (past busy_timeout_seconds)",
        "cannot_open": f"cannot open database file {path!r} ({error})",
        "access_denied": f"database {path!r} is not writable ({error})",
        "io_error": f"database {path!r} cannot be read or written ({error})",
        "unknown": f"database {path!r}: {error}",
    }
    return StoreUnavailable(
        f"SQLite {operation} failed: {error}",
        code=getattr(error, "sqlite_errorname", "") or type(error).__name__,
        cause=cause,
        reason=reasons[cause],
    )


def refused(cause: str, reason: str) -> StoreUnavailable:
    """A check's finding about the file, before SQLite is asked."""
    return StoreUnavailable(f"SQLite check failed: {reason}", cause=cause, reason=reason)
