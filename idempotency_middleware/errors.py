"""The exceptions an ``idempotent`` function raises instead of running (and the store's).

All share :class:`IdempotencyError`, so a consumer can tell "not run, by design" apart from
its own failures with one ``except``. None of them means the work ran twice.
"""

from __future__ import annotations


class IdempotencyError(Exception):
    """Base of every exception this package raises on purpose."""


class KeyInProgressError(IdempotencyError):
    """Another call holds the key and is still running (or did not finish within
    ``wait_seconds``). Retry after ``retry_after`` seconds; the function did not run."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class KeyReusedError(IdempotencyError):
    """The key was already used with another payload; the function did not run. Use a new
    key for new work."""


class InvalidKeyError(IdempotencyError, ValueError):
    """The key is missing (``None``), empty, or not a string while a key is required."""


# Why a store failed: each cause, and the phrase a log line or the command line says for it
# when the store gave none (a store usually does, naming its table, file or endpoint).
CAUSES: dict[str, str] = {
    "no_table": "no such table",
    "bad_schema": "the table is not the one the store expects",
    "no_bucket": "no such S3 bucket",
    "no_credentials": "no AWS credentials found",
    "bad_credentials": "the AWS credentials were rejected",
    "no_region": "no AWS region configured",
    "access_denied": "access denied",
    "cannot_open": "the database file cannot be opened",
    "loop_closed": "the client belongs to an event loop that is closed",
    "unreachable": "the store is unreachable",
    "timed_out": "the store did not answer in time",
    "throttled": "throttled",
    "server_error": "the store had an internal error",
    "busy": "the database is locked by another writer",
    "io_error": "the database could not be read or written",
    "write_conflict": "another write to the same item was in progress",
    "breaker_open": "the store failed repeatedly and the circuit breaker is open",
    "not_replicated": "the write was not acknowledged by the store's replicas in time",
    "unknown": "the store failed",
}

# Causes that a retry does not cure and a configuration change does: a missing table, bucket
# or file, credentials, region, permissions, a client used after its event loop ended.
MISCONFIGURED_CAUSES = frozenset(
    {
        "no_table",
        "bad_schema",
        "no_bucket",
        "no_credentials",
        "bad_credentials",
        "no_region",
        "access_denied",
        "cannot_open",
        "loop_closed",
    }
)


# What to do about each misconfiguration, for the message of a failed ``store.check()``.
FIXES: dict[str, str] = {
    # (A store that has one names the command line's create-table with its own table.)
    "no_table": "create it: store.create_table()",
    "bad_schema": "point the store at a table made by its create_table(), or recreate it",
    "no_bucket": "create the S3 bucket, or fix s3_bucket",
    "no_credentials": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
    "or run where an IAM role provides them",
    "bad_credentials": "check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, the password)",
    "no_region": "pass region_name=, or set AWS_REGION",
    "access_denied": "grant the credentials (or this process's user) access to the table or file",
    "cannot_open": "create the directory, or fix the path",
    "loop_closed": "use an async store on the event loop that serves the requests (make it, "
    "or its first call, inside that loop)",
    "unreachable": "check the store's URL or endpoint, and that the server is running",
    "timed_out": "check that the server is running and reachable",
}


class StoreUnavailableError(IdempotencyError):
    """The store could not answer, so the work was not started (fail closed).

    ``cause`` says why, one of :data:`CAUSES` (``"no_table"``, ``"no_credentials"``,
    ``"unreachable"``, ``"throttled"`` ...; ``"unknown"`` when the store did not say), and
    ``reason`` says it in words (``"no such table 'idempotency'"``). ``misconfigured`` is true
    when fixing the configuration fixes it and retrying does not; ``fix`` then says what to
    do, naming what the store was missing where it knows it (``"create it:
    idempotency-middleware create-table --table orders-idem --region eu-west-1"``), else the
    cause's general advice (:data:`FIXES`), and is empty for an outage. ``code`` carries the
    backend's error code when it sent one (``ThrottlingException``). ``retry_after`` is
    the seconds to wait before retrying when the store knows them (the circuit breaker's
    cool-down, cause ``"breaker_open"``), else ``None``.
    """

    code: str = ""
    cause: str = "unknown"
    retry_after: int | None = None

    def __init__(
        self,
        *args: object,
        code: str = "",
        cause: str = "unknown",
        reason: str = "",
        retry_after: int | None = None,
        fix: str = "",
    ) -> None:
        super().__init__(*args)
        # Instance attributes (not only class defaults), so a pickled error keeps them.
        self.code = code
        self.cause = cause if cause in CAUSES else "unknown"
        self._reason = reason
        self.retry_after = retry_after
        # (Set again by the store that raised it, which knows its table, file or server.)
        self.fix = fix or (FIXES.get(self.cause, "") if self.cause in MISCONFIGURED_CAUSES else "")

    @property
    def reason(self) -> str:
        """Why, in words: the store's own phrase, else the cause's, else the message."""
        if self._reason:
            return self._reason
        if self.cause != "unknown" or not self.args:
            return CAUSES[self.cause]
        return str(self)

    @property
    def misconfigured(self) -> bool:
        """Fixing the configuration (table, credentials, region, permissions) fixes it;
        retrying as it is does not."""
        return self.cause in MISCONFIGURED_CAUSES


class ResultNotStoredError(IdempotencyError):
    """The key completed, but its result was too large to keep, so it cannot be returned
    again. The function will not run again under this key; use a new key to repeat it."""

    def __init__(self, message: str, *, size: int) -> None:
        super().__init__(message)
        self.size = size


class StoredResultUnreadableError(IdempotencyError):
    """The key completed, but its stored result cannot be read back: its bytes are corrupt
    in the store, or it is encrypted and cannot be opened (its key id is not among the
    ``Encryption`` keys, or it was tampered with). It is never run again under this key:
    restore the missing key, or forget the key to run the work again."""


class TransactionConflictError(IdempotencyError):
    """A condition of the work's transaction failed, so nothing was written: not the
    business writes, not the result. The key was released; retrying runs the work again.

    ``position`` is the failed write's index (0-based, in the order the writes were added)
    and ``reason`` DynamoDB's code for it (``"ConditionalCheckFailed"``).
    """

    def __init__(self, message: str, *, position: int, reason: str) -> None:
        super().__init__(message)
        self.position = position
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        # (Keyword-only arguments: the default pickling would call cls(message) and fail.)
        return (_rebuild_conflict, (str(self), self.position, self.reason))


def _rebuild_conflict(message: str, position: int, reason: str) -> TransactionConflictError:
    return TransactionConflictError(message, position=position, reason=reason)


class TransactionRejectedError(IdempotencyError, ValueError):
    """DynamoDB cannot commit the transaction as it was written (over 4 MB with no S3
    bucket for the response, two writes on one item it could not tell apart beforehand, a
    malformed expression), so nothing was written and the key was released. A bug to fix,
    not a condition to retry: ``reason`` is ``"too_large"`` or DynamoDB's code."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_rejected, (str(self), self.reason))


def _rebuild_rejected(message: str, reason: str) -> TransactionRejectedError:
    return TransactionRejectedError(message, reason=reason)


# The name stores have raised since the first release; the same class.
StoreUnavailable = StoreUnavailableError

__all__ = [
    "CAUSES",
    "FIXES",
    "MISCONFIGURED_CAUSES",
    "IdempotencyError",
    "InvalidKeyError",
    "KeyInProgressError",
    "KeyReusedError",
    "ResultNotStoredError",
    "StoreUnavailable",
    "StoreUnavailableError",
    "StoredResultUnreadableError",
    "TransactionConflictError",
    "TransactionRejectedError",
]
