"""PostgreSQL failures as ``StoreUnavailable``: the cause from the SQLSTATE, else from the
kind of client error. Imported only once psycopg is: it names psycopg's classes."""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout, TooManyRequests

from ..protocol import StoreUnavailable

# SQLSTATE (or its two-character class) -> cause. Exact codes are looked up first.
_CAUSES_BY_SQLSTATE = {
    "42P01": "no_table",  # undefined_table
    "3D000": "cannot_open",  # invalid_catalog_name: no such database
    "3F000": "no_table",  # invalid_schema_name
    "28P01": "bad_credentials",  # invalid_password
    "28000": "bad_credentials",  # invalid_authorization_specification (no such role)
    "28000-hba": "access_denied",  # (no pg_hba.conf entry) the server's host rules refuse us
    "42501": "access_denied",  # insufficient_privilege
    "40001": "write_conflict",  # serialization_failure
    "40P01": "write_conflict",  # deadlock_detected
    "55P03": "busy",  # lock_not_available (lock_timeout)
    "57014": "timed_out",  # query_canceled (statement_timeout)
    "57P01": "unreachable",  # admin_shutdown (server stopping, pg_terminate_backend)
    "57P02": "unreachable",  # crash_shutdown
    "57P03": "unreachable",  # cannot_connect_now (starting up, recovering)
    "57P05": "timed_out",  # idle_session_timeout
    "25P03": "timed_out",  # idle_in_transaction_session_timeout
}
_CAUSES_BY_CLASS = {
    "08": "unreachable",  # connection exception
    "28": "bad_credentials",
    "53": "throttled",  # insufficient resources: too many connections, out of memory
    "58": "io_error",  # system error (disk)
}

# A failed connection attempt carries no SQLSTATE (libpq reports only the server's text),
# so the cause is read from the message: (phrase, the SQLSTATE the server sent).
_CONNECT_PHRASES = (
    ("password authentication failed", "28P01"),
    ("no password supplied", "28P01"),
    ("does not exist", ""),  # a role (28000) or a database (3D000): see below
    ("no pg_hba.conf entry", "28000-hba"),
    ("permission denied", "42501"),
    ("too many clients", "53300"),
    ("connection slots are reserved", "53300"),
    ("the database system is", "57P03"),  # starting up, shutting down, in recovery
)


def sqlstate_of(error: BaseException) -> str:
    """The error's SQLSTATE, or the one its connection failure's message implies."""
    sqlstate: str = getattr(error, "sqlstate", None) or ""
    if not sqlstate and isinstance(error, psycopg.OperationalError):
        message = str(error)
        for phrase, implied in _CONNECT_PHRASES:
            if phrase in message:
                return implied or ("3D000" if 'database "' in message else "28000")
    return sqlstate


def cause_of(error: BaseException) -> str:
    """The cause (``errors.CAUSES``) of a psycopg or pool failure."""
    if isinstance(error, TooManyRequests):
        return "throttled"
    if isinstance(error, PoolTimeout):
        return "timed_out"
    if isinstance(error, PoolClosed) or not isinstance(error, psycopg.Error):
        # A pool the user gave, closed by them (only psycopg's and the pool's errors come here).
        return "unknown"
    sqlstate = sqlstate_of(error)
    cause = _CAUSES_BY_SQLSTATE.get(sqlstate) or _CAUSES_BY_CLASS.get(sqlstate[:2])
    if cause is not None:
        return cause
    if isinstance(error, psycopg.errors.ConnectionTimeout):
        return "timed_out"
    if isinstance(error, psycopg.OperationalError) and not sqlstate:
        # No answer from a server: refused, reset, closed, name not resolved.
        return "unreachable"
    return "server_error"


def unavailable(operation: str, error: BaseException, where: str, table: str) -> StoreUnavailable:
    """``error`` (raised by ``operation`` on the server at ``where``) as ``StoreUnavailable``."""
    cause, sqlstate = cause_of(error), sqlstate_of(error)
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reasons = {
        "no_table": (
            f"no such table {table!r} on {where}" if sqlstate == "42P01" else f"{detail} on {where}"
        ),
        "unreachable": f"cannot reach PostgreSQL at {where} ({detail})",
        "timed_out": f"PostgreSQL at {where} did not answer in time ({detail})",
        "bad_credentials": f"PostgreSQL at {where} refused the login ({detail})",
        "access_denied": f"PostgreSQL at {where} denied access to {table!r} ({detail})",
    }
    return StoreUnavailable(
        f"PostgreSQL {operation} failed: {detail}",
        code=sqlstate.removesuffix("-hba") or type(error).__name__,
        cause=cause,
        reason=reasons.get(cause, f"PostgreSQL at {where}: {detail}"),
    )
