"""The fingerprint of a function call's payload: a hash of its canonical JSON.

Canonical: object keys sorted, no insignificant whitespace, so ``{"a": 1, "b": 2}`` and
``{"b": 2, "a": 1}`` are the same payload. Beside JSON values, what a consumer's arguments
usually hold is accepted as its JSON form: dataclasses, Pydantic models, dates and times
(ISO 8601), UUIDs, enums (their value), ``Decimal`` (its string), sets (sorted), bytes
(hex). Anything else is a ``TypeError`` naming the argument, raised before anything is
claimed.
"""

from __future__ import annotations

import dataclasses
import decimal
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def json_default(value: Any) -> Any:
    """The JSON form of what orjson does not encode itself but results and payloads both
    accept: Pydantic (v2) models, ``Decimal`` (its string)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__qualname__} is not JSON serializable")


def _canonical_default(value: Any) -> Any:
    """``json_default``, and what a payload accepts beside: sets and bytes (a fingerprint
    need not be read back, so one-way forms will do)."""
    if isinstance(value, (set, frozenset)):
        # Sorted by their own canonical form, so any mix of element types has one order.
        return sorted(value, key=canonical_json)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return json_default(value)


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON bytes; ``TypeError`` when part of it has no JSON form."""
    encoded = orjson.dumps(value, default=_canonical_default, option=_OPTIONS)
    if b"null" in encoded:
        # orjson writes NaN and the infinities as null, which would make them the same
        # payload as None; only a payload with a null in it needs the walk.
        _refuse_non_finite(value)
    return encoded


def _refuse_non_finite(value: Any) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{value!r} has no JSON form (JSON numbers are finite)")
    elif isinstance(value, dict):
        for item in value.values():
            _refuse_non_finite(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _refuse_non_finite(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _refuse_non_finite(getattr(value, field.name))


def fingerprint_arguments(function: str, arguments: Mapping[str, Any]) -> str:
    """The fingerprint of a call whose payload is its arguments, by parameter name."""
    try:
        encoded = canonical_json(arguments)
    except TypeError as error:
        name = next((name for name, value in arguments.items() if not _encodes(value)), "?")
        value = arguments.get(name)
        raise TypeError(
            f"idempotent function {function}: argument {name!r} ({type(value).__qualname__}) "
            f"has no JSON form to fingerprint ({error}); pass payload= to say what "
            "identifies the work"
        ) from error
    return hashlib.sha256(encoded).hexdigest()


def _encodes(value: Any) -> bool:
    try:
        canonical_json(value)
    except TypeError:
        return False
    return True


def fingerprint_payload(function: str, payload: Any) -> str:
    """The fingerprint of a call whose ``payload=`` callable returned ``payload``."""
    try:
        encoded = canonical_json(payload)
    except TypeError as error:
        raise TypeError(
            f"idempotent function {function}: the payload ({type(payload).__qualname__}) has "
            f"no JSON form to fingerprint ({error}); return JSON values, dataclasses or "
            "Pydantic models from payload="
        ) from error
    return hashlib.sha256(encoded).hexdigest()
