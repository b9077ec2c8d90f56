"""DynamoDB's (and S3's) failures, as the stores report them: :class:`ConditionFailed`,
:class:`TransactionCancelled`, or a classified :class:`StoreUnavailable`. The lean transport
raises botocore's own exceptions, so one translation serves both transports."""

from __future__ import annotations

import asyncio
from typing import Any

from ...errors import TransactionRejectedError
from ..kit import CLOSED_LOOP, off_its_loop
from ..protocol import StoreUnavailable
from .wire import CONDITION_FAILED

Item = dict[str, dict[str, Any]]


class TransactionCancelled(Exception):
    """A TransactWriteItems was cancelled; ``reasons`` has one entry per action, in order."""

    def __init__(self, reasons: list[dict[str, Any]]) -> None:
        super().__init__("transaction cancelled")
        self.reasons = reasons


def refused_outright(error: StoreUnavailable) -> bool:
    """A commit DynamoDB refused before applying anything, and will refuse again as it
    stands: ``ValidationException`` (two writes on one item, a malformed expression, an item
    over 400 KB), a business table that does not exist, or no permission on it."""
    return error.code == "ValidationException" or error.cause in ("no_table", "access_denied")


def rejected(error: StoreUnavailable) -> TransactionRejectedError:
    """The error of a commit :func:`refused_outright`, with DynamoDB's own message (the
    store's reason would name the idempotency table, not the business one)."""
    message = str(_response(error.__cause__).get("Error", {}).get("Message", ""))
    return TransactionRejectedError(
        f"DynamoDB rejected the transaction ({error.code}: {message or error}); "
        "nothing was written",
        reason=error.code,
    )


def _response(error: BaseException | None) -> dict[str, Any]:
    response = getattr(error, "response", None)
    return response if isinstance(response, dict) else {}


def error_code(error: BaseException) -> str:
    return str(_response(error).get("Error", {}).get("Code", ""))


def held_item(error: BaseException) -> Item | None:
    item = _response(error).get("Item")
    return item if isinstance(item, dict) and item else None


class ConditionFailed(Exception):
    """A conditional write lost; ``item`` is the holding item when DynamoDB returned it."""

    def __init__(self, item: Item | None) -> None:
        super().__init__("conditional check failed")
        self.item = item


def translate_error(operation: str, error: BaseException, table_name: str = "") -> Exception:
    """Map a botocore failure to ``ConditionFailed`` or a classified ``StoreUnavailable``. A
    ``RuntimeError`` other than a client used off its event loop is a bug, not an outage (a
    503, and a key left claimed by finishing retries): it is raised again as it is."""
    if isinstance(error, RuntimeError) and _loop_error(error) is None:
        raise error
    code = error_code(error)
    if code == CONDITION_FAILED:
        return ConditionFailed(held_item(error))
    if code == "TransactionCanceledException":
        return TransactionCancelled(list(_response(error).get("CancellationReasons") or []))
    cause, reason = classify(error, table_name)
    return StoreUnavailable(
        f"DynamoDB {operation} failed: {error!r}", code=code, cause=cause, reason=reason
    )


# Error codes DynamoDB (and S3, STS) answer with, by the cause they mean, and its phrase.
_CODES_BY_CAUSE = {
    "no_table": "ResourceNotFoundException",
    "no_bucket": "NoSuchBucket",
    "bad_credentials": "UnrecognizedClientException InvalidSignatureException "
    "IncompleteSignatureException MissingAuthenticationTokenException InvalidClientTokenId "
    "InvalidAccessKeyId SignatureDoesNotMatch ExpiredTokenException ExpiredToken",
    "access_denied": "AccessDeniedException AccessDenied",
    "throttled": "ThrottlingException Throttling ProvisionedThroughputExceededException "
    "RequestLimitExceeded LimitExceededException TooManyRequestsException SlowDown",
    "server_error": "InternalServerError InternalFailure InternalError ServiceUnavailable "
    "ServiceUnavailableException",
    # Contention on the item: another Region writes it (a multi-Region strong-consistency
    # global table; botocore retries it first), or a transaction holds it (a claim while its
    # owner commits completion_transaction()). The claim answers 503, finishing writes retry.
    "write_conflict": "ReplicatedWriteConflictException TransactionConflictException",
}
_CAUSES_BY_CODE = {
    code: cause for cause, codes in _CODES_BY_CAUSE.items() for code in codes.split()
}
_PHRASES = {
    "bad_credentials": "AWS credentials rejected",
    "access_denied": "access denied",
    "throttled": "throttled",
    "server_error": "server error",
    "write_conflict": "write conflict",
}


def _loop_error(error: BaseException) -> str | None:
    """The RuntimeError message of a client used off its event loop (maybe wrapped), or None."""
    kwargs = getattr(error, "kwargs", None)
    inner = kwargs.get("error") if isinstance(kwargs, dict) else None
    for candidate in (error, inner):
        if off_its_loop(candidate, "inside a task"):  # (aiohttp's timer outside its loop)
            return str(candidate)
    return None


def classify(error: BaseException, table_name: str = "") -> tuple[str, str]:
    """The cause (``errors.CAUSES``) of a botocore failure, and a phrase saying it."""
    code = error_code(error)
    if code:
        return _classify_code(error, code, table_name)
    from botocore import exceptions as boto

    endpoint = getattr(error, "kwargs", {}).get("endpoint_url") or "the endpoint"
    loop_message = _loop_error(error)
    if loop_message is not None:
        if CLOSED_LOOP in loop_message:
            return "loop_closed", "event loop is closed: the client was made on a loop that ended"
        return "loop_closed", f"the client belongs to another event loop ({loop_message})"
    if isinstance(error, boto.NoRegionError):
        return "no_region", "no AWS region configured"
    if isinstance(error, boto.NoCredentialsError):
        return "no_credentials", "no AWS credentials found"
    if isinstance(error, (boto.PartialCredentialsError, boto.ProfileNotFound)):
        return "no_credentials", f"no usable AWS credentials: {error}"
    if isinstance(error, boto.CredentialRetrievalError):
        return "no_credentials", f"no AWS credentials found: {error}"
    # (asyncio.TimeoutError: before Python 3.11 not the builtin one; aiohttp's read
    # timeouts are of it, and are no OSError.)
    if isinstance(error, (boto.ReadTimeoutError, TimeoutError, asyncio.TimeoutError)):
        return "timed_out", f"timed out waiting for an answer from {endpoint}"
    if isinstance(error, boto.ConnectTimeoutError):
        return "unreachable", f"unreachable: connecting to {endpoint} timed out"
    if isinstance(error, (boto.ConnectionError, boto.ConnectionClosedError, OSError)):
        return "unreachable", f"unreachable: cannot connect to {endpoint}"
    return "unknown", str(error) or repr(error)


def _classify_code(error: BaseException, code: str, table_name: str) -> tuple[str, str]:
    response = _response(error)
    message = str(response.get("Error", {}).get("Message", "")).strip()
    detail = f"{code}: {message}" if message else code
    cause = _CAUSES_BY_CODE.get(code)
    if cause is None:
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        cause = "server_error" if isinstance(status, int) and status >= 500 else "unknown"
    if cause == "no_table":
        return cause, f"no such table {table_name!r}" if table_name else f"no such table ({detail})"
    if cause == "no_bucket":
        bucket = response.get("Error", {}).get("BucketName")
        return cause, f"no such S3 bucket {bucket!r}" if bucket else f"no such S3 bucket ({detail})"
    return cause, f"{_PHRASES.get(cause, 'request failed')} ({detail})"


def store_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean the store did not answer usefully; RuntimeError too, as
    aiobotocore raises it, unwrapped, for a client used off its own event loop; asyncio's
    TimeoutError, a class of its own before Python 3.11 (aiohttp's timeouts)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, OSError, TimeoutError, asyncio.TimeoutError, RuntimeError)
