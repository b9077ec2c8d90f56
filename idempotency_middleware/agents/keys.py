"""What identifies an MCP tool call: its key, its scope and its fingerprint.

The key comes from the request's ``_meta`` (``idempotencyKey``, or ``idempotency-key`` as
some commerce protocols spell it), else from the tool argument named ``key_argument`` when
the tool declares one. Never from an id that changes on every retry (the JSON-RPC request
id, a model's per-turn tool-call id): a retry must carry the same key to be one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidKeyError
from ..functions.payloads import canonical_json
from ..policy.keys import storage_key

META_KEYS = ("idempotencyKey", "idempotency-key")
"""The ``_meta`` entries a key is read from, in this order."""

DEFAULT_KEY_ARGUMENT = "idempotency_key"

# A tool's keys are namespaced apart from every HTTP route and every function ("@" is no
# HTTP method, and functions have "@function").
TOOL_NAMESPACE = "@tool"


def call_key(
    tool: str, meta: Mapping[str, Any] | None, arguments: Mapping[str, Any], key_argument: str
) -> str | None:
    """The call's key, ``None`` when it carries none. ``InvalidKeyError`` for one that is
    not a non-empty string: a key sent wrongly is refused, never ignored."""
    for name in META_KEYS:
        if meta is not None and name in meta:
            return _checked(tool, meta[name], f"_meta[{name!r}]")
    if key_argument in arguments:
        found = arguments[key_argument]
        # (An argument left at its default, None or "", sends no key.)
        return None if found in (None, "") else _checked(tool, found, f"argument {key_argument!r}")
    return None


def _checked(tool: str, value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidKeyError(
            f"tool {tool}: the idempotency key in {where} must be a non-empty string, got {value!r}"
        )
    return value


def tool_fingerprint(tool: str, arguments: Mapping[str, Any], key_argument: str) -> str:
    """The fingerprint of a call: the tool's name and its arguments as canonical JSON, the
    key argument left out (the same work sent with its key is the same call)."""
    payload = {name: value for name, value in arguments.items() if name != key_argument}
    return hashlib.sha256(canonical_json([tool, payload])).hexdigest()


def tool_key_hash(namespace: str, scope: str | None, key: str) -> str:
    """The stored (hashed) key of ``key`` for the tool namespace ``namespace`` (the tool's
    name, or the door's ``name=``) under ``scope``."""
    return storage_key(TOOL_NAMESPACE, namespace, scope, key)


__all__ = [
    "DEFAULT_KEY_ARGUMENT",
    "META_KEYS",
    "TOOL_NAMESPACE",
    "call_key",
    "tool_fingerprint",
    "tool_key_hash",
]
