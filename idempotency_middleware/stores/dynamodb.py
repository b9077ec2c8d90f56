"""DynamoDB request building and response parsing shared by the boto3 and aioboto3 stores.

Everything here is pure: the stores only send what these functions build, so both clients
issue byte-identical requests (the httpx ``Client``/``AsyncClient`` idea).

Item layout (one item per namespaced key)::

    pk               S     sha256 of method, route template, scope and client key
    status           S     "in_progress" | "deferred" | "completed"
    fingerprint      S     sha256 of the request (see fingerprint.py)
    owner            S     random token of the claim that wrote the item (fencing)
    lock_expires_at  N     epoch seconds, sub-second precision
    expires_at       N     epoch seconds, sub-second precision (checked on every read)
    ttl              N     whole epoch seconds, for DynamoDB's TTL sweeper only
    response         B     encoded response (records.encode_response), once completed
    response_ref     S     S3 object key of a response too large for the item (optional)
    response_size    N     body size in bytes
    too_large        BOOL  completed, but the response could not be kept
    response_json    S     a deferred key's final response as JSON, when a Step Functions
                           state (or anything but this package) completed it
    txn              S     the commit token of the transaction that completed the key
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD, BreakerOwner, CircuitBreaker
from ..clock import SYSTEM_CLOCK, Clock
from ..deferred import DeferredToken
from ..errors import TransactionConflictError, TransactionRejectedError
from ..records import (
    Record,
    Status,
    StoredResponse,
    decode_response,
    decode_response_document,
    encode_response,
)
from .base import ClaimRequest, Completion, StoreUnavailable
from .dynamodb_wire import OPERATIONS

# DynamoDB items are capped at 400 KB including attribute names; leave room for the rest.
MAX_ITEM_RESPONSE_BYTES = 350 * 1024

# The error code of a conditional write that lost (the request was fine, the item not).
CONDITION_FAILED = "ConditionalCheckFailedException"

# A claim whose conditional put fails without the holding item (a backend that ignores
# ReturnValuesOnConditionCheckFailure) reads the holder instead; when that read finds the key
# claimable again (the holder released or expired in between), it tries the put again, this
# many times in all before answering that the store is unavailable.
CLAIM_ATTEMPTS = 3

# DynamoDB caps a transaction's aggregate size at 4 MB.
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024

# How often create_table() asks whether a new table is ACTIVE yet.
TABLE_POLL_SECONDS = 0.5

Item = dict[str, dict[str, Any]]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableLayout:
    table_name: str
    key_attribute: str = "pk"
    ttl_attribute: str = "ttl"


def _number(value: float) -> dict[str, str]:
    return {"N": f"{value:.6f}"}


def _ttl(value: float) -> dict[str, str]:
    return {"N": str(math.ceil(value))}


# An in-progress claim's TTL is this long past its lock: the sweeper deletes by AWS's clock,
# and a live owner whose clock is behind may still hold its claim a little past the lock by
# AWS's time (a claim itself waits the clock-skew margin out). Expiry is checked on read.
IN_PROGRESS_TTL_GRACE_SECONDS = 60.0


def _claim_ttl(lock_expires_at: float) -> dict[str, str]:
    return _ttl(lock_expires_at + IN_PROGRESS_TTL_GRACE_SECONDS)


_NAMES = {
    "#pk": "",  # filled per layout
    "#status": "status",
    "#owner": "owner",
    "#lock": "lock_expires_at",
    "#exp": "expires_at",
    "#ttl": "",
    "#response": "response",
    "#size": "response_size",
    "#too_large": "too_large",
    "#response_ref": "response_ref",
    "#response_json": "response_json",
    "#txn": "txn",
}


def _names(layout: TableLayout, *used: str) -> dict[str, str]:
    names = dict(_NAMES, **{"#pk": layout.key_attribute, "#ttl": layout.ttl_attribute})
    return {alias: names[alias] for alias in used}


def claim_request(layout: TableLayout, request: ClaimRequest) -> dict[str, Any]:
    """One conditional PutItem: succeed when absent, expired, or an in-progress claim whose
    lock expired at least the claim's clock-skew margin ago.

    On failure DynamoDB returns the holding item in the same call (ALL_OLD), so a duplicate
    costs one round trip; on success ALL_OLD tells whether a dead owner was taken over.
    """
    return {
        "TableName": layout.table_name,
        "Item": {
            layout.key_attribute: {"S": request.key_hash},
            "status": {"S": Status.IN_PROGRESS.value},
            "fingerprint": {"S": request.fingerprint},
            "owner": {"S": request.owner},
            "lock_expires_at": _number(request.lock_expires_at),
            "expires_at": _number(request.expires_at),
            layout.ttl_attribute: _claim_ttl(request.expires_at),
        },
        "ConditionExpression": (
            "attribute_not_exists(#pk) OR (#status <> :in_progress AND #exp <= :now) "
            "OR (#status = :in_progress AND #lock <= :stale)"
        ),
        "ExpressionAttributeNames": _names(layout, "#pk", "#exp", "#status", "#lock"),
        "ExpressionAttributeValues": {
            ":now": _number(request.now),
            ":stale": _number(request.stale_before),
            ":in_progress": {"S": Status.IN_PROGRESS.value},
        },
        "ReturnValues": "ALL_OLD",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def claim_took_over(response: dict[str, Any]) -> bool:
    """Whether a successful claim replaced another owner's in-progress claim."""
    old = response.get("Attributes") or {}
    return bool(old.get("status", {}).get("S") == Status.IN_PROGRESS.value)


@dataclass(frozen=True)
class CompletionPlan:
    """How to write one completion: the UpdateItem, and the overflow object to put in S3
    first when the response is too large for the item and the store has a bucket."""

    request: dict[str, Any]
    overflow_key: str | None = None
    overflow_body: bytes = b""


def plan_completion(
    layout: TableLayout,
    completion: Completion,
    overflow: OverflowSettings | None,
    *,
    force_overflow: bool = False,
) -> CompletionPlan:
    """Conditional on the owner token: a taken-over owner cannot overwrite the new record.

    A response too large for one item (or, with ``force_overflow``, one that would push a
    transaction past its size limit) goes to S3 when the store has a bucket; otherwise it
    is not kept, and the key is still marked completed so its handler never runs again
    within the TTL.

    A deferred key's interim completion, and a completion committed with a transaction,
    also require the claim to be still in progress: neither may overwrite a final response
    that is already there (a fast worker's, or this very commit's landed earlier).
    """
    encoded = b"" if completion.streamed else encode_response(completion.response)
    fits = (
        not completion.streamed and len(encoded) <= MAX_ITEM_RESPONSE_BYTES and not force_overflow
    )
    overflow_key = (
        overflow.object_key(completion.key_hash, completion.owner)
        if overflow is not None and not fits and not completion.streamed
        else None
    )
    status = Status.DEFERRED if completion.deferred else Status.COMPLETED
    values: dict[str, Any] = {
        ":owner": {"S": completion.owner},
        ":completed": {"S": status.value},
        ":exp": _number(completion.expires_at),
        ":ttl": _ttl(completion.expires_at),
        ":size": {"N": str(completion.body_size)},
        ":too_large": {"BOOL": not fits and overflow_key is None},
    }
    update = (
        "SET #status = :completed, #exp = :exp, #ttl = :ttl, #size = :size, #too_large = :too_large"
    )
    names = ["#status", "#exp", "#ttl", "#owner", "#size", "#too_large"]
    if fits:
        values[":response"] = {"B": encoded}
        update += ", #response = :response"
        names.append("#response")
    elif overflow_key is not None:
        values[":response_ref"] = {"S": overflow_key}
        update += ", #response_ref = :response_ref"
        names.append("#response_ref")
    condition = "#owner = :owner"
    if completion.writes or completion.deferred:
        condition += " AND #status = :in_progress"
        values[":in_progress"] = {"S": Status.IN_PROGRESS.value}
    if completion.writes:
        values[":txn"] = {"S": commit_token(completion.owner)}
        update += ", #txn = :txn"
        names.append("#txn")
    request = {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": completion.key_hash}},
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": _names(layout, *names),
        "ExpressionAttributeValues": values,
    }
    if completion.deferred:
        request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    if overflow_key is None:
        return CompletionPlan(request)
    return CompletionPlan(request, overflow_key, encoded)


def claimed_by(item: Item, owner: str) -> bool:
    """Whether a claim that failed its condition found its own claim: the same PutItem sent
    again by a retry after its first answer was lost (a timeout, a cut connection, a 5xx
    after the write). The claim is this request's, not another's."""
    return (
        item.get("owner", {}).get("S") == owner
        and item.get("status", {}).get("S") == Status.IN_PROGRESS.value
    )


def finished_by(item: Item | None, owner: str) -> bool:
    """Whether a deferred interim completion that failed its condition finds its own key
    already past it: deferred (the same completion re-sent) or completed (the work's final
    response landed first). Either way the key is done and nothing needs writing."""
    if item is None or item.get("owner", {}).get("S") != owner:
        return False
    return item.get("status", {}).get("S") in (Status.DEFERRED.value, Status.COMPLETED.value)


# -- transactions: the business writes committed with the completion --------------------


def commit_token(owner: str) -> str:
    """The ``ClientRequestToken`` of an attempt's commit, derived from its owner token: the
    same for every retry of the commit (DynamoDB then applies it at most once), different
    for every attempt. Hex, 36 characters (DynamoDB's maximum)."""
    return hashlib.sha256(b"idempotency-commit:" + owner.encode()).hexdigest()[:36]


_TRANSACT_UPDATE_FIELDS = (
    "TableName",
    "Key",
    "UpdateExpression",
    "ConditionExpression",
    "ExpressionAttributeNames",
    "ExpressionAttributeValues",
)


def transaction_request(
    plan: CompletionPlan, writes: tuple[dict[str, Any], ...], owner: str
) -> dict[str, Any]:
    """One TransactWriteItems: the business writes in their order, then the completion
    (so a cancellation reason's index is the write's position). The completion returns
    the record on a failed condition, to tell a lost claim from this commit landed before."""
    update = {field: plan.request[field] for field in _TRANSACT_UPDATE_FIELDS}
    update["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return {
        "TransactItems": [*writes, {"Update": update}],
        "ClientRequestToken": commit_token(owner),
    }


def transaction_size(request: dict[str, Any]) -> int:
    """An upper estimate of a transaction's size as DynamoDB counts it: attribute names and
    values of every item, key and expression value it carries."""
    total = 0
    for entry in request["TransactItems"]:
        (body,) = entry.values()
        for part in ("Item", "Key", "ExpressionAttributeValues"):
            total += _attributes_size(body.get(part, {}))
        total += len(body.get("UpdateExpression", "")) + len(body.get("ConditionExpression", ""))
    return total


def _attributes_size(attributes: dict[str, Any]) -> int:
    return sum(len(name.encode()) + _value_size(value) for name, value in attributes.items())


def _value_size(value: dict[str, Any]) -> int:
    ((kind, content),) = value.items()
    if kind in ("S", "N"):
        return len(str(content).encode())
    if kind == "B":
        return len(content)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS"):
        return sum(len(str(member).encode()) for member in content)
    if kind == "BS":
        return sum(len(member) for member in content)
    if kind == "L":
        return 3 + sum(1 + _value_size(member) for member in content)
    return 3 + sum(1 + len(name.encode()) + _value_size(member) for name, member in content.items())


class TransactionCancelled(Exception):
    """A TransactWriteItems was cancelled; ``reasons`` has one entry per action, in order."""

    def __init__(self, reasons: list[dict[str, Any]]) -> None:
        super().__init__("transaction cancelled")
        self.reasons = reasons


# Cancellation codes that another try may clear (contention, capacity); the finishing
# retries try again. Any other code but a condition failure is a request DynamoDB will
# never accept as written.
_RETRYABLE_CANCELLATIONS = frozenset(
    {"TransactionConflict", "ProvisionedThroughputExceeded", "ThrottlingError", "None", ""}
)


def commit_outcome(reasons: list[dict[str, Any]], writes: int, owner: str) -> bool:
    """What a cancelled commit means: ``True`` when it had landed already (a re-sent commit
    whose first try succeeded, on a backend that ignores ``ClientRequestToken``), ``False``
    when the claim is no longer ours; a business condition raises
    ``TransactionConflictError``, an unacceptable write ``TransactionRejectedError``,
    contention ``StoreUnavailable`` (retried)."""
    completion = reasons[writes] if len(reasons) > writes else {}
    if completion.get("Code") == "ConditionalCheckFailed":
        item = completion.get("Item") or {}
        return bool(item.get("txn", {}).get("S") == commit_token(owner))
    for position, reason in enumerate(reasons[:writes]):
        if reason.get("Code") == "ConditionalCheckFailed":
            raise TransactionConflictError(
                f"write {position} of the transaction failed its condition; nothing was written",
                position=position,
                reason="ConditionalCheckFailed",
            )
    for position, reason in enumerate(reasons[:writes]):
        code = str(reason.get("Code") or "")
        if code not in _RETRYABLE_CANCELLATIONS:
            raise TransactionRejectedError(
                f"DynamoDB rejected write {position} of the transaction ({code}: "
                f"{reason.get('Message', '')}); nothing was written",
                reason=code,
            )
    codes = sorted({str(reason.get("Code")) for reason in reasons} - {"None"})
    throttled = any("Throughput" in code or "Throttl" in code for code in codes)
    return _raise_unavailable(
        f"DynamoDB cancelled the transaction ({', '.join(codes) or 'no reason given'})",
        "throttled" if throttled else "server_error",
    )


def _raise_unavailable(message: str, cause: str) -> bool:
    raise StoreUnavailable(
        message, code="TransactionCanceledException", cause=cause, reason=message
    )


def refused_outright(error: StoreUnavailable) -> bool:
    """A commit DynamoDB refused before applying anything, and will refuse again as it
    stands: ``ValidationException`` (two writes on one item, a malformed expression, an item
    over 400 KB), a business table that does not exist, or no permission on it."""
    return error.code == "ValidationException" or error.cause in ("no_table", "access_denied")


def rejected(error: StoreUnavailable) -> TransactionRejectedError:
    """The error of a commit :func:`refused_outright`, with DynamoDB's own message (the
    store's reason would name the idempotency table, not the business one)."""
    cause = error.__cause__
    response = getattr(cause, "response", None)
    message = ""
    if isinstance(response, dict):
        message = str(response.get("Error", {}).get("Message", ""))
    return TransactionRejectedError(
        f"DynamoDB rejected the transaction ({error.code}: {message or error}); "
        "nothing was written",
        reason=error.code,
    )


def too_large(size: int) -> TransactionRejectedError:
    return TransactionRejectedError(
        f"the transaction would be about {size} bytes with the response, over DynamoDB's 4 MB; "
        "give the store an S3 bucket (s3_bucket=) for large responses, or write less",
        reason="too_large",
    )


# -- deferred keys: the work's final response, by token ----------------------------------


def plan_final_completion(
    layout: TableLayout,
    token: DeferredToken,
    response: StoredResponse,
    overflow: OverflowSettings | None,
) -> CompletionPlan:
    """UpdateItem storing a deferred key's final response, fenced by the token's owner, on
    a key not completed yet (deferred, or still in progress when the work finished before
    the interim response was stored). The key then expires at the token's time. A response
    too large for the item goes to S3 as in :func:`plan_completion`, under an object key of
    its own per call: a redelivered call that loses the race deletes only its own object,
    never the one the completed record points at."""
    encoded = encode_response(response)
    fits = len(encoded) <= MAX_ITEM_RESPONSE_BYTES
    overflow_key = (
        overflow.object_key(token.key_hash, f"{token.owner}-final-{uuid.uuid4().hex}")
        if overflow is not None and not fits
        else None
    )
    values: dict[str, Any] = {
        ":owner": {"S": token.owner},
        ":completed": {"S": Status.COMPLETED.value},
        ":exp": {"N": str(token.expires_at)},
        ":size": {"N": str(len(response.body))},
        ":too_large": {"BOOL": not fits and overflow_key is None},
    }
    update = (
        "SET #status = :completed, #exp = :exp, #ttl = :exp, #size = :size, #too_large = :too_large"
    )
    names = ["#status", "#exp", "#ttl", "#owner", "#size", "#too_large", "#response_json"]
    if fits:
        values[":response"] = {"B": encoded}
        update += ", #response = :response REMOVE #response_json, #response_ref"
        names += ["#response", "#response_ref"]
    elif overflow_key is not None:
        values[":response_ref"] = {"S": overflow_key}
        update += ", #response_ref = :response_ref REMOVE #response_json, #response"
        names += ["#response_ref", "#response"]
    else:
        update += " REMOVE #response_json, #response, #response_ref"
        names += ["#response", "#response_ref"]
    request = {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": token.key_hash}},
        "UpdateExpression": update,
        "ConditionExpression": "#owner = :owner AND #status <> :completed",
        "ExpressionAttributeNames": _names(layout, *names),
        "ExpressionAttributeValues": values,
    }
    if overflow_key is None:
        return CompletionPlan(request)
    return CompletionPlan(request, overflow_key, encoded)


def release_deferred_request(layout: TableLayout, token: DeferredToken) -> dict[str, Any]:
    """DeleteItem of a deferred (or still in-progress) key, fenced by the token's owner."""
    return {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": token.key_hash}},
        "ConditionExpression": "#owner = :owner AND #status <> :completed",
        "ExpressionAttributeNames": _names(layout, "#owner", "#status"),
        "ExpressionAttributeValues": {
            ":owner": {"S": token.owner},
            ":completed": {"S": Status.COMPLETED.value},
        },
    }


@dataclass(frozen=True)
class OverflowSettings:
    """Where responses too large for a DynamoDB item go: an S3 bucket and key prefix.

    Objects are not deleted when their record expires: give the bucket a lifecycle rule
    that expires the prefix after your longest TTL.
    """

    bucket: str
    prefix: str = "idempotency/"
    endpoint_url: str | None = None

    def object_key(self, key_hash: str, owner: str) -> str:
        """The S3 object key of ``owner``'s response for ``key_hash``."""
        return f"{self.prefix}{key_hash}/{owner}"


def overflow_reference(item: Item) -> str | None:
    ref = item.get("response_ref", {}).get("S")
    return str(ref) if ref else None


def release_request(layout: TableLayout, key_hash: str, owner: str) -> dict[str, Any]:
    """DeleteItem conditional on the owner token, of a claim still in progress (never a
    final response a deferral's worker stored while the handler was still running)."""
    return {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": key_hash}},
        "ConditionExpression": "#owner = :owner AND #status = :in_progress",
        "ExpressionAttributeNames": _names(layout, "#owner", "#status"),
        "ExpressionAttributeValues": {
            ":owner": {"S": owner},
            ":in_progress": {"S": Status.IN_PROGRESS.value},
        },
    }


def renew_request(
    layout: TableLayout, key_hash: str, owner: str, lock_expires_at: float
) -> dict[str, Any]:
    """UpdateItem moving an in-progress claim's lock, conditional on the owner token."""
    return {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": key_hash}},
        "UpdateExpression": "SET #lock = :lock, #exp = :lock, #ttl = :ttl",
        "ConditionExpression": "#owner = :owner AND #status = :in_progress",
        "ExpressionAttributeNames": _names(layout, "#lock", "#exp", "#ttl", "#owner", "#status"),
        "ExpressionAttributeValues": {
            ":owner": {"S": owner},
            ":in_progress": {"S": Status.IN_PROGRESS.value},
            ":lock": _number(lock_expires_at),
            ":ttl": _claim_ttl(lock_expires_at),
        },
    }


def get_request(layout: TableLayout, key_hash: str) -> dict[str, Any]:
    """A strongly consistent GetItem (a claim's fallback read must see the latest write)."""
    return {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": key_hash}},
        "ConsistentRead": True,
    }


def delete_request(layout: TableLayout, key_hash: str) -> dict[str, Any]:
    """An unconditional DeleteItem returning the deleted item, so the caller knows whether
    there was one (in the same call)."""
    return {
        "TableName": layout.table_name,
        "Key": {layout.key_attribute: {"S": key_hash}},
        "ReturnValues": "ALL_OLD",
    }


def deleted_something(response: dict[str, Any]) -> bool:
    """Whether a :func:`delete_request` removed an item."""
    return bool(response.get("Attributes"))


def item_to_record(layout: TableLayout, item: Item, overflow_blob: bytes | None = None) -> Record:
    """The record of an item; ``overflow_blob`` is its response fetched from S3, if any.

    An item whose S3 object could not be read is reported as completed without a response.
    """
    key_hash = item[layout.key_attribute]["S"]
    document = item.get("response_json", {}).get("S")
    if document is not None:
        # A final response written by a Step Functions state (or any other writer).
        try:
            response: StoredResponse | None = decode_response_document(document)
        except ValueError as error:
            logger.error("idempotency record %s: unreadable response_json: %s", key_hash, error)
            response = None
        return Record(
            key_hash,
            Status(item["status"]["S"]),
            item["fingerprint"]["S"],
            item["owner"]["S"],
            float(item["lock_expires_at"]["N"]),
            float(item["expires_at"]["N"]),
            response,
            response is None,
            len(response.body) if response is not None else len(document),
        )
    blob = item.get("response", {}).get("B")
    if blob is None:
        blob = overflow_blob
    too_large = bool(item.get("too_large", {}).get("BOOL", False)) or (
        blob is None and overflow_reference(item) is not None
    )
    return Record(
        key_hash=key_hash,
        status=Status(item["status"]["S"]),
        fingerprint=item["fingerprint"]["S"],
        owner=item["owner"]["S"],
        lock_expires_at=float(item["lock_expires_at"]["N"]),
        expires_at=float(item["expires_at"]["N"]),
        response=decode_response(bytes(blob)) if blob is not None else None,
        response_not_stored=too_large,
        response_size=int(item.get("response_size", {}).get("N", "0")),
    )


def create_table_request(layout: TableLayout) -> dict[str, Any]:
    """CreateTable: string partition key, on-demand billing."""
    return {
        "TableName": layout.table_name,
        "AttributeDefinitions": [{"AttributeName": layout.key_attribute, "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": layout.key_attribute, "KeyType": "HASH"}],
        "BillingMode": "PAY_PER_REQUEST",
    }


def table_request(layout: TableLayout) -> dict[str, Any]:
    """DescribeTable or DescribeTimeToLive: the table's name alone."""
    return {"TableName": layout.table_name}


def table_active(describe_table_response: dict[str, Any]) -> bool:
    """Whether DescribeTable says the table takes reads and writes."""
    return bool(describe_table_response["Table"]["TableStatus"] == "ACTIVE")


def enable_ttl_request(layout: TableLayout) -> dict[str, Any]:
    """UpdateTimeToLive enabling the sweeper on the TTL attribute."""
    return {
        "TableName": layout.table_name,
        "TimeToLiveSpecification": {"Enabled": True, "AttributeName": layout.ttl_attribute},
    }


def ttl_enabled(describe_ttl_response: dict[str, Any], layout: TableLayout) -> bool:
    """Whether DescribeTimeToLive says TTL is on (or turning on) for our attribute."""
    description = describe_ttl_response.get("TimeToLiveDescription", {})
    return description.get("TimeToLiveStatus") in ("ENABLED", "ENABLING") and (
        description.get("AttributeName") == layout.ttl_attribute
    )


def error_code(error: BaseException) -> str:
    """The DynamoDB error code of a botocore ``ClientError`` (empty for anything else)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def held_item(error: BaseException) -> Item | None:
    """The ALL_OLD item carried by a failed conditional claim."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    item = response.get("Item")
    return item if isinstance(item, dict) and item else None


@dataclass(frozen=True)
class ClientSettings:
    """Connection settings shared by both DynamoDB stores.

    The defaults keep a claim bounded: an unreachable endpoint answers 503 within about
    ``(connect_timeout or read_timeout) * max_attempts`` plus backoff, not after botocore's
    default of a minute per attempt.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    connect_timeout: float = 1.0
    read_timeout: float = 2.0
    max_attempts: int = 2
    max_pool_connections: int = 50

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValueError(f"max_attempts must be an integer, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")

    def botocore_config(self) -> Any:
        from botocore.config import Config

        return Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            # total_max_attempts counts the first try; botocore's "max_attempts" key does not.
            retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
            max_pool_connections=self.max_pool_connections,
        )

    def s3_client_arguments(self, overflow: OverflowSettings) -> dict[str, Any]:
        arguments: dict[str, Any] = {"config": self.botocore_config()}
        if overflow.endpoint_url is not None:
            arguments["endpoint_url"] = overflow.endpoint_url
        if self.region_name is not None:
            arguments["region_name"] = self.region_name
        return arguments

    def client_arguments(self, extra: dict[str, Any]) -> dict[str, Any]:
        arguments: dict[str, Any] = {"config": self.botocore_config()}
        if self.endpoint_url is not None:
            arguments["endpoint_url"] = self.endpoint_url
        if self.region_name is not None:
            arguments["region_name"] = self.region_name
        arguments.update(extra)
        return arguments


class ConditionFailed(Exception):
    """A conditional write lost; ``item`` is the holding item when DynamoDB returned it."""

    def __init__(self, item: Item | None) -> None:
        super().__init__("conditional check failed")
        self.item = item


def translate_error(operation: str, error: BaseException, table_name: str = "") -> Exception:
    """Map a botocore failure to ``ConditionFailed`` or a classified ``StoreUnavailable``.

    A ``RuntimeError`` other than a client used off its event loop is a bug, not the store
    failing: it is raised again as it is, instead of passing for an outage (a 503, and a
    key left claimed by finishing retries)."""
    if isinstance(error, RuntimeError) and _loop_error(error) is None:
        raise error
    code = error_code(error)
    if code == CONDITION_FAILED:
        return ConditionFailed(held_item(error))
    if code == "TransactionCanceledException":
        response = getattr(error, "response", {})
        return TransactionCancelled(list(response.get("CancellationReasons") or []))
    cause, reason = classify(error, table_name)
    return StoreUnavailable(
        f"DynamoDB {operation} failed: {error!r}", code=code, cause=cause, reason=reason
    )


# Error codes DynamoDB (and S3, STS) answer with, by the cause they mean.
_CAUSES_BY_CODE = {
    "ResourceNotFoundException": "no_table",
    "NoSuchBucket": "no_bucket",
    "UnrecognizedClientException": "bad_credentials",
    "InvalidSignatureException": "bad_credentials",
    "IncompleteSignatureException": "bad_credentials",
    "MissingAuthenticationTokenException": "bad_credentials",
    "InvalidClientTokenId": "bad_credentials",
    "InvalidAccessKeyId": "bad_credentials",
    "SignatureDoesNotMatch": "bad_credentials",
    "ExpiredTokenException": "bad_credentials",
    "ExpiredToken": "bad_credentials",
    "AccessDeniedException": "access_denied",
    "AccessDenied": "access_denied",
    "ThrottlingException": "throttled",
    "Throttling": "throttled",
    "ProvisionedThroughputExceededException": "throttled",
    "RequestLimitExceeded": "throttled",
    "LimitExceededException": "throttled",
    "TooManyRequestsException": "throttled",
    "SlowDown": "throttled",
    "InternalServerError": "server_error",
    "InternalFailure": "server_error",
    "InternalError": "server_error",
    "ServiceUnavailable": "server_error",
    "ServiceUnavailableException": "server_error",
    # Contention on the item: another Region writes it (a multi-Region strong-consistency
    # global table; botocore retries it first), or a transaction holds it (a claim while its
    # owner commits completion_transaction()). The claim answers 503, finishing writes retry.
    "ReplicatedWriteConflictException": "write_conflict",
    "TransactionConflictException": "write_conflict",
}

# What RuntimeError says when an aiohttp session is used on a loop other than its own.
_CLOSED_LOOP = "Event loop is closed"
_OTHER_LOOP = ("different loop", "different event loop", "inside a task")


def _loop_error(error: BaseException) -> str | None:
    """The RuntimeError message of a client used off its event loop (aiobotocore wraps it
    in ``HTTPClientError``), or ``None``."""
    kwargs = getattr(error, "kwargs", None)
    inner = kwargs.get("error") if isinstance(kwargs, dict) else None
    for candidate in (error, inner):
        if isinstance(candidate, RuntimeError):
            message = str(candidate)
            if _CLOSED_LOOP in message or any(part in message for part in _OTHER_LOOP):
                return message
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
        if _CLOSED_LOOP in loop_message:
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
    if isinstance(error, (boto.ReadTimeoutError, TimeoutError)):
        return "timed_out", f"timed out waiting for an answer from {endpoint}"
    if isinstance(error, boto.ConnectTimeoutError):
        return "unreachable", f"unreachable: connecting to {endpoint} timed out"
    if isinstance(error, (boto.ConnectionError, boto.ConnectionClosedError, OSError)):
        return "unreachable", f"unreachable: cannot connect to {endpoint}"
    return "unknown", str(error) or repr(error)


def _classify_code(error: BaseException, code: str, table_name: str) -> tuple[str, str]:
    response: dict[str, Any] = getattr(error, "response", {})
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
    phrases = {
        "bad_credentials": "AWS credentials rejected",
        "access_denied": "access denied",
        "throttled": "throttled",
        "server_error": "server error",
        "write_conflict": "write conflict",
        "unknown": "request failed",
    }
    return cause, f"{phrases.get(cause, 'request failed')} ({detail})"


def store_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean the store did not answer usefully.

    RuntimeError is among them because aiobotocore raises it, unwrapped, for a client used
    off its own event loop (classified ``loop_closed``); ``translate_error`` raises any other
    RuntimeError again as it is.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, OSError, TimeoutError, RuntimeError)


def require_modules(store: str, modules: tuple[str, ...], extra: str) -> None:
    """Fail at a store's construction, naming the extra that installs them, when its client
    libraries are missing (rather than with a bare ``ModuleNotFoundError`` at first use).
    Looked up, not imported: the import itself waits for the first connection."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # an import hook refusing it
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"{store} needs {module}, which is not installed: "
                f'pip install "idempotency-middleware[{extra}]"',
                name=module,
            )


# What carries a store's request-path calls (see DynamoDBStoreBase).
Transport = Literal["auto", "lean", "sdk"]
TRANSPORTS: tuple[Transport, ...] = ("auto", "lean", "sdk")

# The calls the lean transport carries; anything else the stores send goes through the SDK.
REQUEST_PATH_OPERATIONS = frozenset(OPERATIONS)


def lean_transport(transport: str, session: Any, client_kwargs: dict[str, Any] | None) -> bool:
    """Whether a store's request path goes through the lean transport (see
    :class:`DynamoDBStoreBase`); a ``ValueError`` for an unknown or contradictory choice."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    customised = session is not None or bool(client_kwargs)
    if transport == "lean" and customised:
        raise ValueError(
            'transport="lean" cannot honour a session or client_kwargs: '
            'leave transport="auto" (the SDK carries them) or drop them'
        )
    return transport == "lean" or (transport == "auto" and not customised)


class DynamoDBStoreBase(BreakerOwner):
    """What both DynamoDB stores share: table layout, connection settings, S3 overflow, the
    clock, the circuit breaker (the httpx ``Client``/``AsyncClient`` idea: everything but the
    transport).

    ``clock`` times ``create_table()``'s wait for the table to become ACTIVE and the
    breaker's cool-down; claims and completions carry their own ``now``.

    ``transport`` chooses what carries the calls of the request path (PutItem, UpdateItem,
    DeleteItem, GetItem, TransactWriteItems): ``"lean"``, the package's own client (SigV4
    signed, botocore's credential chain, standard-mode retries, the same requests and errors,
    a tenth to a sixth of the SDK's CPU per call), or ``"sdk"``, boto3 / aioboto3.
    ``"auto"`` (the default) is ``"lean"`` unless the store is given a ``session`` or
    ``client_kwargs``, which only the SDK can honour, or a proxy applies to the endpoint.
    Table administration and S3 always use the SDK.
    """

    # The client libraries a flavour needs, and the extra that installs them (per flavour).
    _libraries: tuple[str, ...] = ()
    _extra = ""

    def __init__(
        self,
        table_name: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        connect_timeout: float = 1.0,
        read_timeout: float = 2.0,
        max_attempts: int = 2,
        max_pool_connections: int = 50,
        key_attribute: str = "pk",
        ttl_attribute: str = "ttl",
        session: Any = None,
        client_kwargs: dict[str, Any] | None = None,
        s3_bucket: str | None = None,
        s3_prefix: str = "idempotency/",
        s3_endpoint_url: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        transport: Transport = "auto",
    ) -> None:
        require_modules(type(self).__name__, self._libraries, self._extra)
        self._lean = lean_transport(transport, session, client_kwargs)
        self.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown_seconds, clock)
        self.layout = TableLayout(table_name, key_attribute, ttl_attribute)
        self._settings = ClientSettings(
            endpoint_url,
            region_name,
            connect_timeout,
            read_timeout,
            max_attempts,
            max_pool_connections,
        )
        self._session = session
        self._client_kwargs = dict(client_kwargs or {})
        self._client: Any = None
        self._s3_client: Any = None
        self._overflow = (
            OverflowSettings(s3_bucket, s3_prefix, s3_endpoint_url) if s3_bucket else None
        )
        self._errors = store_errors()
        self._clock = clock
        self._init_transport()

    def _init_transport(self) -> None:
        """Set up what the sync or async client needs (locks); called by ``__init__``."""
