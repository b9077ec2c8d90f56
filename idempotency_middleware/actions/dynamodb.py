"""One-time actions on the DynamoDB stores: in the store's own table, beside its records.

An action's partition key is ``action#<id>``, which no record key (a hex hash) can equal.
Every step is one request: a conditional ``PutItem`` or ``UpdateItem`` that returns the new
item when it succeeds (``ReturnValues=ALL_NEW``) and the item as it was when its condition
fails (``ReturnValuesOnConditionCheckFailure=ALL_OLD``), so why a consume failed comes from
that same call, never from a second read. Requests are built and answers parsed here, once
for both stores, as a store flow (``step_flow``) the store runs (errors become
``StoreUnavailable`` as for the store's records, and count on its circuit breaker).

Item layout (times are epoch seconds, to the microsecond)::

    <key attribute>  S     "action#" + the action's id
    kind             S     "one-time-action"
    created_at       N
    active_at        N
    expires_at       N
    purge_at         N     when the action is forgotten (its expiry plus the retention)
    <ttl attribute>  N     purge_at in whole seconds, for DynamoDB's TTL sweeper
    data             S     the caller's JSON
    pin_hash         S     scrypt$n$r$p$<base64> (absent without a PIN)
    attempts_left    N     (absent without a PIN)
    consumed_at      N     (absent until consumed)
    consumed_reason  S     (absent unless given)
    canceled_at      N     (absent until canceled)
    created_by       S     the create's nonce
    consumed_by      S     the consume's nonce (absent until consumed)
"""

from __future__ import annotations

import math
from typing import Any

from ..stores.dynamodb import AsyncDynamoDBStore, DynamoDBStore
from ..stores.dynamodb import requests as ddb
from ..stores.dynamodb.errors import ConditionFailed, Item
from ..stores.dynamodb.ops import DYNAMODB
from ..stores.kit import Flow
from .model import ActionRecord
from .steps import Cancel, Insert, Read, SpendAttempt, Step, Written

KEY_PREFIX = "action#"
KIND = "one-time-action"

_NUMBERS = ("created_at", "active_at", "expires_at", "purge_at", "consumed_at", "canceled_at")
_STRINGS = ("data", "pin_hash", "consumed_reason", "created_by", "consumed_by")

# Open: present, neither consumed nor canceled, not expired (the same as ActionRecord.is_open).
_OPEN = (
    "attribute_exists(#pk) AND attribute_not_exists(consumed_at) "
    "AND attribute_not_exists(canceled_at) AND expires_at > :now"
)


def _number(value: float) -> dict[str, str]:
    return {"N": f"{value:.6f}"}


def action_key(layout: ddb.TableLayout, action_id: str) -> dict[str, dict[str, str]]:
    return {layout.key_attribute: {"S": KEY_PREFIX + action_id}}


def to_item(layout: ddb.TableLayout, record: ActionRecord) -> Item:
    item: Item = {
        **action_key(layout, record.action_id),
        "kind": {"S": KIND},
        layout.ttl_attribute: {"N": str(math.ceil(record.purge_at))},
    }
    for name in _NUMBERS:
        value = getattr(record, name)
        if value is not None:
            item[name] = _number(value)
    for name in _STRINGS:
        value = getattr(record, name)
        if value is not None:
            item[name] = {"S": value}
    if record.attempts_left is not None:
        item["attempts_left"] = {"N": str(record.attempts_left)}
    return item


def from_item(layout: ddb.TableLayout, item: Item | None) -> ActionRecord | None:
    if not item:
        return None

    def number(name: str) -> float | None:
        value = item.get(name, {}).get("N")
        return None if value is None else float(value)

    def string(name: str) -> str | None:
        value = item.get(name, {}).get("S")
        return None if value is None else str(value)

    attempts = item.get("attempts_left", {}).get("N")
    return ActionRecord(
        action_id=item[layout.key_attribute]["S"][len(KEY_PREFIX) :],
        created_at=float(item["created_at"]["N"]),
        active_at=float(item["active_at"]["N"]),
        expires_at=float(item["expires_at"]["N"]),
        purge_at=float(item["purge_at"]["N"]),
        data=item["data"]["S"],
        pin_hash=string("pin_hash"),
        attempts_left=None if attempts is None else int(attempts),
        consumed_at=number("consumed_at"),
        consumed_reason=string("consumed_reason"),
        canceled_at=number("canceled_at"),
        created_by=string("created_by"),
        consumed_by=string("consumed_by"),
    )


def _update(
    layout: ddb.TableLayout,
    action_id: str,
    update: str,
    condition: str,
    values: dict[str, Any],
) -> dict[str, Any]:
    return {
        "TableName": layout.table_name,
        "Key": action_key(layout, action_id),
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {"#pk": layout.key_attribute},
        "ExpressionAttributeValues": values,
        "ReturnValues": "ALL_NEW",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def request_for(layout: ddb.TableLayout, step: Step) -> tuple[str, dict[str, Any]]:
    """The one DynamoDB request that carries out ``step``: its operation and parameters."""
    if isinstance(step, Read):
        return "get_item", {
            "TableName": layout.table_name,
            "Key": action_key(layout, step.action_id),
            "ConsistentRead": True,
        }
    if isinstance(step, Insert):
        return "put_item", {
            "TableName": layout.table_name,
            "Item": to_item(layout, step.record),
            # A free id: absent, or its old action past its retention (not swept yet).
            "ConditionExpression": "attribute_not_exists(#pk) OR purge_at <= :now",
            "ExpressionAttributeNames": {"#pk": layout.key_attribute},
            "ExpressionAttributeValues": {":now": _number(step.now)},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    now = {":now": _number(step.now)}
    if isinstance(step, Cancel):
        return "update_item", _update(layout, step.action_id, "SET canceled_at = :now", _OPEN, now)
    if isinstance(step, SpendAttempt):
        # Fenced by the count itself: concurrent wrong guesses each take one attempt, and
        # none is taken once it reaches 0.
        return "update_item", _update(
            layout,
            step.action_id,
            "SET attempts_left = attempts_left - :one",
            _OPEN + " AND attempts_left > :zero",
            {**now, ":one": {"N": "1"}, ":zero": {"N": "0"}},
        )
    values: dict[str, Any] = dict(now)
    update = "SET consumed_at = :now"
    if step.reason is not None:
        update += ", consumed_reason = :reason"
        values[":reason"] = {"S": step.reason}
    if step.nonce is not None:
        update += ", consumed_by = :by"
        values[":by"] = {"S": step.nonce}
    condition = _OPEN + " AND active_at <= :now"
    if step.pin_hash is None:
        condition += " AND attribute_not_exists(pin_hash)"
    else:
        condition += " AND pin_hash = :pin AND attempts_left > :zero"
        values[":pin"] = {"S": step.pin_hash}
        values[":zero"] = {"N": "0"}
    return "update_item", _update(layout, step.action_id, update, condition, values)


def written(layout: ddb.TableLayout, step: Step, response: dict[str, Any]) -> Written:
    """What a successful request answered, as the step's result."""
    if isinstance(step, Insert):
        return Written(True, step.record)
    if isinstance(step, Read):
        return Written(True, from_item(layout, response.get("Item")))
    return Written(True, from_item(layout, response.get("Attributes")))


def step_flow(layout: ddb.TableLayout, step: Step) -> Flow[Written]:
    """One step as a store flow: its request, and what the answer (or a lost condition,
    which carries the item as it was) means."""
    operation, request = request_for(layout, step)
    try:
        response = yield (DYNAMODB, operation, request)
    except ConditionFailed as failed:
        return Written(False, from_item(layout, failed.item))
    return written(layout, step, response)


class DynamoDBActions:
    """Steps on a ``DynamoDBStore``'s table, one request each."""

    def __init__(self, store: DynamoDBStore) -> None:
        self._store = store
        self._layout = store.layout

    def write(self, step: Step) -> Written:
        return self._store.run_flow("action", step_flow(self._layout, step))


class AsyncDynamoDBActions:
    """Steps on an ``AsyncDynamoDBStore``'s table, one request each."""

    def __init__(self, store: AsyncDynamoDBStore) -> None:
        self._store = store
        self._layout = store.layout

    async def awrite(self, step: Step) -> Written:
        return await self._store.arun_flow("action", step_flow(self._layout, step))
