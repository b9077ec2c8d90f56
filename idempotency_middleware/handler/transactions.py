"""Exactly-once business writes: DynamoDB writes committed in one ``TransactWriteItems``
together with the attempt's completion record.

A handler (or an ``idempotent`` function) adds its writes to ``completion_transaction()``
instead of sending them itself. When it returns, the engine commits them with the stored
response, conditioned on the claim's owner token: both land or neither does, and an owner
whose claim was taken over writes nothing. Writes are prepared (serialized, checked against
DynamoDB's limits) as they are added, so a mistake raises in the handler, where it was made.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .context import current_attempt

__all__ = ["MAX_WRITES", "Transaction", "completion_transaction"]

# DynamoDB takes 100 actions per TransactWriteItems; the completion record is one of them.
MAX_WRITES = 99

_Names = Mapping[str, str] | None
_Values = Mapping[str, Any] | None


def completion_transaction() -> Transaction:
    """The current attempt's :class:`Transaction` (the same one for every call in it).

    ``LookupError`` outside an attempt (including a request that carries no key);
    ``TypeError`` when the attempt's store is not a DynamoDB store.
    """
    attempt = current_attempt("completion_transaction()")
    transaction = attempt.transaction
    if transaction is None:
        from ..stores.dynamodb import DynamoDBStoreBase

        store = attempt.store
        if not isinstance(store, DynamoDBStoreBase):
            raise TypeError(
                "completion_transaction() needs a DynamoDB store (DynamoDBStore or "
                f"AsyncDynamoDBStore): the writes commit with the completion record in one "
                f"DynamoDB transaction; this attempt's store is {type(store).__name__}"
            )
        transaction = Transaction(attempt, store.layout.table_name, store.layout.key_attribute)
        attempt.transaction = transaction
    assert isinstance(transaction, Transaction)  # the only writes an attempt is given
    return transaction


class Transaction:
    """The writes an attempt commits together with its completion.

    Items, keys and values are Python values with the conventions of boto3's ``Table``
    resource (``Decimal`` for numbers, ``bytes`` for binary, sets for sets); a condition is
    an expression string with ``names``/``values``, or a ``boto3.dynamodb.conditions``
    object. At most :data:`MAX_WRITES` writes, no two on one item: ``ValueError`` at the
    write that breaks either rule.
    """

    __slots__ = ("_attempt", "_items", "_key_attribute", "_key_names", "_keys", "_table")

    def __init__(self, attempt: Any, table: str, key_attribute: str) -> None:
        self._attempt = attempt
        self._items: list[dict[str, Any]] = []
        # The identity of each keyed write, and the key attributes each table's writes named
        # (a put's key is found among its attributes by them).
        self._keys: list[tuple[str, str]] = []
        self._key_names: dict[str, frozenset[str]] = {table: frozenset({key_attribute})}
        self._table = table
        self._key_attribute = key_attribute

    # -- the writes ---------------------------------------------------------------------

    def put(
        self,
        table: str,
        item: Mapping[str, Any],
        *,
        condition: Any = None,
        names: _Names = None,
        values: _Values = None,
    ) -> None:
        """Write ``item`` whole (``PutItem``), if ``condition`` holds."""
        serialized = _serialize_map(item, "item")
        self._add("Put", table, serialized, condition, names, values, None, keyed=False)

    def update(
        self,
        table: str,
        key: Mapping[str, Any],
        update: str,
        *,
        condition: Any = None,
        names: _Names = None,
        values: _Values = None,
    ) -> None:
        """Apply the update expression ``update`` to the item at ``key`` (``UpdateItem``)."""
        if not isinstance(update, str) or not update.strip():
            raise ValueError("update must be a non-empty update expression string")
        self._add("Update", table, _serialize_map(key, "key"), condition, names, values, update)

    def delete(
        self,
        table: str,
        key: Mapping[str, Any],
        *,
        condition: Any = None,
        names: _Names = None,
        values: _Values = None,
    ) -> None:
        """Delete the item at ``key`` (``DeleteItem``), if ``condition`` holds."""
        self._add("Delete", table, _serialize_map(key, "key"), condition, names, values, None)

    def check(
        self,
        table: str,
        key: Mapping[str, Any],
        condition: Any,
        *,
        names: _Names = None,
        values: _Values = None,
    ) -> None:
        """Commit only if ``condition`` holds for the item at ``key`` (``ConditionCheck``);
        writes nothing to it."""
        if condition is None:
            raise ValueError("check needs a condition")
        serialized = _serialize_map(key, "key")
        self._add("ConditionCheck", table, serialized, condition, names, values, None)

    # -- what the store commits -----------------------------------------------------------

    @property
    def items(self) -> tuple[dict[str, Any], ...]:
        """The writes as ``TransactItems`` entries (low-level DynamoDB JSON), in order."""
        return tuple(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"<Transaction of {len(self._items)} writes>"

    # -- checks and serialization -----------------------------------------------------------

    def _add(
        self,
        action: str,
        table: str,
        target: dict[str, Any],
        condition: Any,
        names: _Names,
        values: _Values,
        update: str | None,
        *,
        keyed: bool = True,
    ) -> None:
        attempt = self._attempt
        if attempt.live:
            raise RuntimeError(
                "the response is already streaming to its client: writes must be added "
                "before the response starts, so that they land before its first byte"
            )
        if attempt.deferred:
            raise ValueError(
                "this request deferred its completion (defer_completion()): it cannot also "
                "commit writes with it, because its worker may finish the key first"
            )
        if attempt.finished:
            raise RuntimeError("this transaction's attempt has finished: it takes no more writes")
        if not isinstance(table, str) or not table:
            raise ValueError(f"table must be a table name, got {table!r}")
        if len(self._items) >= MAX_WRITES:
            raise ValueError(
                f"a transaction holds at most {MAX_WRITES} writes (DynamoDB's 100 actions, "
                "one of them the completion record)"
            )
        identity = self._identity(action, table, target, keyed)
        entry: dict[str, Any] = {"TableName": table}
        entry["Item" if action == "Put" else "Key"] = target
        if update is not None:
            entry["UpdateExpression"] = update
        expression_names = dict(names or {})
        expression_values = {
            placeholder: _serialize(value, f"values[{placeholder!r}]")
            for placeholder, value in (values or {}).items()
        }
        if condition is not None:
            entry["ConditionExpression"] = _condition(
                condition, expression_names, expression_values
            )
        if expression_names:
            entry["ExpressionAttributeNames"] = expression_names
        if expression_values:
            entry["ExpressionAttributeValues"] = expression_values
        self._items.append({action: entry})
        if identity is not None:
            self._keys.append(identity)

    def _identity(
        self, action: str, table: str, target: dict[str, Any], keyed: bool
    ) -> tuple[str, str] | None:
        """The write's item identity, after checking no other write targets that item."""
        if keyed:
            names = frozenset(target)
            self._key_names.setdefault(table, names)
            key = target
        else:
            names = self._key_names.get(table, frozenset())
            if not names or not names <= target.keys():
                return None  # a put on a table whose key no write named: DynamoDB checks it
            key = {name: target[name] for name in names}
        identity = (table, repr(sorted((name, _canonical(value)) for name, value in key.items())))
        own_record = {self._key_attribute: {"S": self._attempt.claim.key_hash}}
        if table == self._table and key == own_record:
            raise ValueError(
                "a transaction cannot write the attempt's own idempotency record: the "
                "completion writes it"
            )
        if identity in self._keys:
            raise ValueError(
                f"two writes on one item of {table!r} in one transaction: DynamoDB allows one "
                f"write per item ({action} of {identity[1]})"
            )
        return identity


def _canonical(value: dict[str, Any]) -> tuple[str, object]:
    """A key value as DynamoDB compares it: numbers by value (1 and 1.0 and 1E+0 are one),
    binary by its bytes (bytes and bytearray alike)."""
    ((kind, content),) = value.items()
    if kind == "N":
        return kind, Decimal(content).normalize()
    if kind == "B":
        return kind, bytes(content)
    return kind, content


def _serialize(value: Any, what: str) -> dict[str, Any]:
    from boto3.dynamodb.types import TypeSerializer

    try:
        serialized: dict[str, Any] = TypeSerializer().serialize(value)
    except TypeError as error:
        raise TypeError(f"{what}: {error}") from None
    return serialized


def _serialize_map(mapping: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not isinstance(mapping, Mapping) or not mapping:
        raise ValueError(f"{what} must be a non-empty mapping of attribute names to values")
    return {str(name): _serialize(value, f"{what}[{name!r}]") for name, value in mapping.items()}


def _condition(condition: Any, names: dict[str, str], values: dict[str, Any]) -> str:
    """The condition's expression string; a ``boto3.dynamodb.conditions`` object is built into
    one, its placeholders merged into ``names``/``values`` (never overwriting the caller's)."""
    if isinstance(condition, str):
        if not condition.strip():
            raise ValueError("condition must be a non-empty expression")
        return condition
    from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

    if not isinstance(condition, ConditionBase):
        raise TypeError(
            "condition must be an expression string or a boto3.dynamodb.conditions object, "
            f"got {type(condition).__name__}"
        )
    built = ConditionExpressionBuilder().build_expression(condition)
    for placeholder in (*built.attribute_name_placeholders, *built.attribute_value_placeholders):
        if placeholder in names or placeholder in values:
            raise ValueError(
                f"placeholder {placeholder} is both in names/values and made by the condition "
                "object; name yours differently (not #n0, :v0 ...)"
            )
    names.update(built.attribute_name_placeholders)
    for placeholder, value in built.attribute_value_placeholders.items():
        values[placeholder] = _serialize(value, f"condition value {placeholder}")
    return str(built.condition_expression)
