"""DynamoDB request building and response parsing, pure: the transports only send what
these build, so both issue byte-identical requests.

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
from typing import Any

from ...errors import TransactionConflictError, TransactionRejectedError
from ..protocol import ClaimRequest, Completion, DeferredToken, StoreUnavailable
from ..records import (
    Record,
    Status,
    StoredResponse,
    decode_response_document,
    encode_response,
    record_from_fields,
)
from .config import OverflowSettings
from .errors import Item

# DynamoDB items are capped at 400 KB including attribute names; leave room for the rest.
MAX_ITEM_RESPONSE_BYTES = 350 * 1024

# A claim whose conditional put fails without the holding item (a backend that ignores
# ReturnValuesOnConditionCheckFailure) reads the holder; finding the key claimable again, it
# tries the put again, this many times in all before answering that the store is unavailable.
CLAIM_ATTEMPTS = 3

# DynamoDB caps a transaction's aggregate size at 4 MB.
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024

# How often create_table() asks whether a new table is ACTIVE yet.
TABLE_POLL_SECONDS = 0.5

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


# An alias names its attribute ("#owner": owner), but for these and the layout's two.
_RENAMED = {"#lock": "lock_expires_at", "#exp": "expires_at", "#size": "response_size"}


# Where a record's response can be: a writer's forms, at most one kept by a completion.
_RESPONSE_FORMS = ("#response_json", "#response", "#response_ref")


# Each request's names, by its layout's two attributes and the aliases it uses: built once
# (the aliases come from this module's code, the layouts from the stores: a handful).
_NAMES: dict[tuple[str, str, tuple[str, ...]], dict[str, str]] = {}


def _names(layout: TableLayout, *used: str) -> dict[str, str]:
    known = (layout.key_attribute, layout.ttl_attribute, used)
    names = _NAMES.get(known)
    if names is None:
        aliases = dict(_RENAMED, **{"#pk": layout.key_attribute, "#ttl": layout.ttl_attribute})
        names = _NAMES[known] = {alias: aliases.get(alias, alias[1:]) for alias in used}
    return dict(names)  # the request's own copy (a before-call handler may change it)


def _keyed(layout: TableLayout, key_hash: str) -> dict[str, Any]:
    return {"TableName": layout.table_name, "Key": {layout.key_attribute: {"S": key_hash}}}


# The statuses as stored (an enum's .value is a Python-level lookup each time).
_IN_PROGRESS = Status.IN_PROGRESS.value
_COMPLETED = Status.COMPLETED.value
_DEFERRED = Status.DEFERRED.value
_CLAIM_CONDITION = (
    "attribute_not_exists(#pk) OR (#status <> :in_progress AND #exp <= :now) "
    "OR (#status = :in_progress AND #lock <= :stale)"
)


def claim_request(layout: TableLayout, request: ClaimRequest) -> dict[str, Any]:
    """One conditional PutItem: succeed when absent, expired, or an in-progress claim whose
    lock expired at least the claim's clock-skew margin ago. ALL_OLD: on failure the holding
    item comes back in the same call; on success it tells whether a dead owner was taken over.
    """
    # Every request builds one (a replay too): the fields written out, not looked up.
    now = request.now
    expires_at = now + request.lock_timeout_seconds  # an in-progress claim's expiry is its lock's
    expiry = f"{expires_at:.6f}"
    return {
        "TableName": layout.table_name,
        "Item": {
            layout.key_attribute: {"S": request.key_hash},
            "status": {"S": _IN_PROGRESS},
            "fingerprint": {"S": request.fingerprint},
            "owner": {"S": request.owner},
            "lock_expires_at": {"N": expiry},
            "expires_at": {"N": expiry},
            layout.ttl_attribute: _claim_ttl(expires_at),
        },
        "ConditionExpression": _CLAIM_CONDITION,
        "ExpressionAttributeNames": {
            "#pk": layout.key_attribute,
            "#exp": "expires_at",
            "#status": "status",
            "#lock": "lock_expires_at",
        },
        "ExpressionAttributeValues": {
            ":now": {"N": f"{now:.6f}"},
            ":stale": {"N": f"{now - request.clock_skew_seconds:.6f}"},
            ":in_progress": {"S": _IN_PROGRESS},
        },
        "ReturnValues": "ALL_OLD",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def claim_took_over(response: dict[str, Any]) -> bool:
    old = response.get("Attributes") or {}
    return bool(old.get("status", {}).get("S") == _IN_PROGRESS)


@dataclass(frozen=True)
class CompletionPlan:
    """One completion's UpdateItem, and the overflow object to put in S3 first, if any."""

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
    A response too large for one item (or, with ``force_overflow``, for the transaction)
    goes to S3 when the store has a bucket; otherwise it is not kept, and the key is still
    marked completed so its handler never runs again within the TTL. A deferred key's
    interim completion, and one with a transaction, also require the claim in progress: no
    final response already there is overwritten (a fast worker's, or this commit's landed).
    A deferred key handed to another owner (``deferred_to``) gets that owner."""
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
        ":completed": {"S": _COMPLETED if status is Status.COMPLETED else _DEFERRED},
        ":exp": _number(completion.expires_at),
        ":ttl": _ttl(completion.expires_at),
        ":size": {"N": str(completion.body_size)},
    }
    update, kept = _set_completed(values, ":ttl", encoded if fits else None, overflow_key)
    names = ["#status", "#exp", "#ttl", "#owner", "#size", "#too_large", *_RESPONSE_FORMS]
    condition = "#owner = :owner"
    if completion.writes or completion.deferred:
        condition += " AND #status = :in_progress"
        values[":in_progress"] = {"S": _IN_PROGRESS}
    if completion.writes:
        values[":txn"] = {"S": commit_token(completion.owner)}
        update += ", #txn = :txn"
        names.append("#txn")
    if completion.deferred_to is not None:
        # Handed to an earlier owner's token: the work its dead process started finishes it.
        values[":to"] = {"S": completion.deferred_to}
        update += ", #owner = :to"
    # The owner's completion again (the last wins): a response written before in another
    # form, or one this completion does not keep, would otherwise be left behind and replayed.
    update += " REMOVE " + ", ".join(form for form in _RESPONSE_FORMS if form not in kept)
    request = {
        **_keyed(layout, completion.key_hash),
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": _names(layout, *names),
        "ExpressionAttributeValues": values,
    }
    if completion.deferred:
        request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return CompletionPlan(request, overflow_key, encoded if overflow_key is not None else b"")


def _set_completed(
    values: dict[str, Any], ttl: str, encoded: bytes | None, overflow_key: str | None
) -> tuple[str, list[str]]:
    """The SET clause both completions write (``values`` gets the rest of its values): the
    response in the item (``encoded``), else in S3 (``overflow_key``), else neither
    (``too_large``). Also the response's alias, if one is set."""
    values[":too_large"] = {"BOOL": encoded is None and overflow_key is None}
    update = f"SET #status = :completed, #exp = :exp, #ttl = {ttl}, #size = :size, "
    update += "#too_large = :too_large"
    if encoded is not None:
        values[":response"] = {"B": encoded}
        return update + ", #response = :response", ["#response"]
    if overflow_key is not None:
        values[":response_ref"] = {"S": overflow_key}
        return update + ", #response_ref = :response_ref", ["#response_ref"]
    return update, []


def owned_in(item: Item | None, owner: str, *statuses: Status) -> bool:
    """Whether a write that failed its condition finds ``owner``'s own item in one of
    ``statuses``: a claim its own claim (the same PutItem re-sent after its first answer was
    lost: a timeout, a cut connection, a 5xx after the write), in progress; a deferred
    interim completion its key done already, deferred (re-sent) or completed (the work's
    final response landed first). Either way nothing needs writing."""
    return (
        item is not None
        and item.get("owner", {}).get("S") == owner
        and item.get("status", {}).get("S") in statuses  # str enums: equal to their values
    )


def commit_token(owner: str) -> str:
    """The ``ClientRequestToken`` of an attempt's commit, derived from its owner token: the
    same for every retry of the commit (DynamoDB then applies it at most once), different
    for every attempt. Hex, 36 characters (DynamoDB's maximum)."""
    return hashlib.sha256(b"idempotency-commit:" + owner.encode()).hexdigest()[:36]


def transaction_request(
    plan: CompletionPlan, writes: tuple[dict[str, Any], ...], owner: str
) -> dict[str, Any]:
    """One TransactWriteItems: the business writes in their order, then the completion
    (so a cancellation reason's index is the write's position). The completion returns
    the record on a failed condition, to tell a lost claim from this commit landed before."""
    update = {**plan.request, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
    return {
        "TransactItems": [*writes, {"Update": update}],
        "ClientRequestToken": commit_token(owner),
    }


def transaction_size(request: dict[str, Any]) -> int:
    """An upper estimate of a transaction's size as DynamoDB counts it (names and values)."""
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


# Cancellation codes that another try may clear (contention, capacity); the finishing
# retries try again. Any other code but a condition failure is a request DynamoDB will
# never accept as written.
_RETRYABLE_CANCELLATIONS = frozenset(
    {"TransactionConflict", "ProvisionedThroughputExceeded", "ThrottlingError", "None", ""}
)


def commit_outcome(reasons: list[dict[str, Any]], writes: int, owner: str) -> bool:
    """What a cancelled commit means: ``True`` when it had landed already (a re-sent commit,
    on a backend that ignores ``ClientRequestToken``), ``False`` when the claim is no longer
    ours; raises ``TransactionConflictError`` for a business condition,
    ``TransactionRejectedError`` for an unacceptable write, ``StoreUnavailable`` otherwise."""
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
    message = f"DynamoDB cancelled the transaction ({', '.join(codes) or 'no reason given'})"
    cause = "throttled" if throttled else "server_error"
    raise StoreUnavailable(
        message, code="TransactionCanceledException", cause=cause, reason=message
    )


def too_large(size: int) -> TransactionRejectedError:
    return TransactionRejectedError(
        f"the transaction would be about {size} bytes with the response, over DynamoDB's 4 MB; "
        "give the store an S3 bucket (s3_bucket=) for large responses, or write less",
        reason="too_large",
    )


def plan_final_completion(
    layout: TableLayout,
    token: DeferredToken,
    response: StoredResponse,
    overflow: OverflowSettings | None,
) -> CompletionPlan:
    """UpdateItem storing a deferred key's final response, fenced by the token's owner, on a
    key not completed yet (deferred, or in progress if the work beat the interim response);
    it then expires at the token's time. A response too large for the item goes to S3 under
    an object key of its own per call: a redelivered call that loses the race deletes only
    its own object, never the one the completed record points at."""
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
    }
    update, kept = _set_completed(values, ":exp", encoded if fits else None, overflow_key)
    update += " REMOVE " + ", ".join(form for form in _RESPONSE_FORMS if form not in kept)
    names = ["#status", "#exp", "#ttl", "#owner", "#size", "#too_large", *_RESPONSE_FORMS]
    request = {
        **_keyed(layout, token.key_hash),
        "UpdateExpression": update,
        "ConditionExpression": "#owner = :owner AND #status <> :completed",
        "ExpressionAttributeNames": _names(layout, *names),
        "ExpressionAttributeValues": values,
    }
    return CompletionPlan(request, overflow_key, encoded if overflow_key is not None else b"")


def release_deferred_request(layout: TableLayout, token: DeferredToken) -> dict[str, Any]:
    return _fenced(layout, token.key_hash, token.owner, "<>", Status.COMPLETED)


def _fenced(
    layout: TableLayout, key_hash: str, owner: str, test: str, status: Status
) -> dict[str, Any]:
    """A write to ``owner``'s item whose status compares (``test``) with ``status``."""
    return {
        **_keyed(layout, key_hash),
        "ConditionExpression": f"#owner = :owner AND #status {test} :status",
        "ExpressionAttributeNames": _names(layout, "#owner", "#status"),
        "ExpressionAttributeValues": {":owner": {"S": owner}, ":status": {"S": status.value}},
    }


def overflow_reference(item: Item) -> str | None:
    ref = item.get("response_ref", {}).get("S")
    return str(ref) if ref else None


def release_request(layout: TableLayout, key_hash: str, owner: str) -> dict[str, Any]:
    """DeleteItem of a claim still in progress (never a final response a deferral's worker
    stored while the handler was still running)."""
    return _fenced(layout, key_hash, owner, "=", Status.IN_PROGRESS)


def renew_request(
    layout: TableLayout, key_hash: str, owner: str, lock_expires_at: float
) -> dict[str, Any]:
    request = _fenced(layout, key_hash, owner, "=", Status.IN_PROGRESS)
    request["UpdateExpression"] = "SET #lock = :lock, #exp = :lock, #ttl = :ttl"
    request["ExpressionAttributeNames"] = _names(
        layout, "#lock", "#exp", "#ttl", "#owner", "#status"
    )
    values = {":lock": _number(lock_expires_at), ":ttl": _claim_ttl(lock_expires_at)}
    request["ExpressionAttributeValues"].update(values)
    return request


def get_request(layout: TableLayout, key_hash: str) -> dict[str, Any]:
    # Strongly consistent: a claim's fallback read must see the latest write.
    return {**_keyed(layout, key_hash), "ConsistentRead": True}


def delete_request(layout: TableLayout, key_hash: str) -> dict[str, Any]:
    return {**_keyed(layout, key_hash), "ReturnValues": "ALL_OLD"}


_NONE: dict[str, Any] = {}  # an absent attribute's (empty) value


def item_to_record(layout: TableLayout, item: Item, overflow_blob: bytes | None = None) -> Record:
    """The record of an item; ``overflow_blob`` is its response fetched from S3, if any (an
    item whose S3 object could not be read is completed without a response)."""
    get = item.get
    key_hash = item[layout.key_attribute]["S"]
    document = get("response_json", _NONE).get("S")
    response: object = get("response", _NONE).get("B", overflow_blob)
    missing = bool(get("too_large", _NONE).get("BOOL", False)) or (
        response is None and overflow_reference(item) is not None
    )
    size: object = get("response_size", _NONE).get("N", "0")
    if document is not None:
        # A final response written by a Step Functions state (or any other writer).
        try:
            response = decode_response_document(document)
            size = len(response.body)
        except ValueError as error:
            logger.error("idempotency record %s: unreadable response_json: %s", key_hash, error)
            response, size = None, len(document)
        missing = response is None
    return record_from_fields(
        key_hash,
        get("status", _NONE).get("S"),
        get("fingerprint", _NONE).get("S"),
        get("owner", _NONE).get("S"),
        get("lock_expires_at", _NONE).get("N"),
        get("expires_at", _NONE).get("N"),
        response,
        missing,
        size,
    )


def create_table_request(layout: TableLayout) -> dict[str, Any]:
    return {
        "TableName": layout.table_name,
        "AttributeDefinitions": [{"AttributeName": layout.key_attribute, "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": layout.key_attribute, "KeyType": "HASH"}],
        "BillingMode": "PAY_PER_REQUEST",
    }


def enable_ttl_request(layout: TableLayout) -> dict[str, Any]:
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


def schema_problem(
    layout: TableLayout, table: dict[str, Any], describe_ttl_response: dict[str, Any]
) -> str | None:
    """What makes a described table unlike the one ``create_table()`` makes, or ``None``."""
    name, key = layout.table_name, layout.key_attribute
    keys = [(part["AttributeName"], part["KeyType"]) for part in table.get("KeySchema", ())]
    types = {a["AttributeName"]: a["AttributeType"] for a in table.get("AttributeDefinitions", ())}
    if keys != [(key, "HASH")] or types.get(key) != "S":
        shown = ", ".join(f"{attribute} ({kind})" for attribute, kind in keys)
        return f"table {name!r} is keyed by {shown}, not by the string partition key {key!r} alone"
    if not ttl_enabled(describe_ttl_response, layout):
        return (
            f"table {name!r} has no TTL on {layout.ttl_attribute!r}, so expired records are "
            "never deleted (store.create_table() enables it)"
        )
    return None
