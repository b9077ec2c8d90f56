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


class StoreUnavailableError(IdempotencyError):
    """The store could not answer (unreachable, timed out, throttled, server error), so the
    work was not started (fail closed). ``code`` carries the backend's error code when it
    sent one (``ThrottlingException``)."""

    code: str = ""


class ResultNotStoredError(IdempotencyError):
    """The key completed, but its result was too large to keep, so it cannot be returned
    again. The function will not run again under this key; use a new key to repeat it."""

    def __init__(self, message: str, *, size: int) -> None:
        super().__init__(message)
        self.size = size


# The name stores have raised since the first release; the same class.
StoreUnavailable = StoreUnavailableError

__all__ = [
    "IdempotencyError",
    "InvalidKeyError",
    "KeyInProgressError",
    "KeyReusedError",
    "ResultNotStoredError",
    "StoreUnavailable",
    "StoreUnavailableError",
]
