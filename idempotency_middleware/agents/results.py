"""Tool results as the MCP wire gives them, stored and replayed; and the door's own answers.

A result is handled in its wire form, a JSON object (``content``, ``structuredContent``,
``isError``, ``_meta``), whichever SDK made it: what is stored is what the client got, so a
replay is identical to it but for ``_meta["idempotentReplayed"]``. The door's refusals are
tool errors (``isError: true``) a model can read and act on: an agent sees a tool error as
the tool's answer, where a protocol error would end its step.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from ..functions.results import Serializer

WireResult = dict[str, Any]
"""A ``tools/call`` result in its JSON form (``CallToolResult`` dumped by alias)."""

REPLAYED = "idempotentReplayed"
"""The ``_meta`` entry a replayed result carries (``true``)."""

RETRY_AFTER = "retryAfter"
"""The ``_meta`` entry of a "still running" answer: the seconds to wait before retrying."""


def is_error(result: WireResult) -> bool:
    """Whether the tool answered an error: such a result is never stored."""
    return bool(result.get("isError"))


def encode(result: WireResult, serializer: Serializer | None) -> bytes:
    """The bytes stored for ``result`` (``serializer``'s when the door was given one)."""
    if serializer is not None:
        data = serializer[0](result)
        if not isinstance(data, bytes):
            raise TypeError(f"serializer's dumps returned {type(data).__qualname__}, not bytes")
        return data
    return orjson.dumps(result)


def decode(data: bytes, serializer: Serializer | None) -> WireResult:
    """The stored result ``data``, as it was encoded."""
    loaded = serializer[1](data) if serializer is not None else orjson.loads(data)
    if not isinstance(loaded, dict):
        raise TypeError(f"a stored tool result is a JSON object, got {type(loaded).__qualname__}")
    return loaded


def replayed(result: WireResult) -> WireResult:
    """``result`` given back to a retry: the same, marked in ``_meta``."""
    return {**result, "_meta": {**(result.get("_meta") or {}), REPLAYED: True}}


def tool_error(text: str, **meta: Any) -> WireResult:
    """A tool error result saying ``text``, with ``meta`` in its ``_meta``."""
    result: WireResult = {"content": [{"type": "text", "text": text}], "isError": True}
    if meta:
        result["_meta"] = meta
    return result


def still_running(tool: str, retry_after: float) -> WireResult:
    """The answer to a duplicate whose first call did not finish within ``wait_seconds``."""
    seconds = max(1, math.ceil(retry_after))
    return tool_error(
        f"tool {tool}: a call with this idempotency key is still running; it was not run "
        f"again. Retry with the same key in {seconds} s to get its result.",
        **{RETRY_AFTER: seconds},
    )


def key_reused(tool: str) -> WireResult:
    """The answer to a key sent again with other arguments (or to another tool)."""
    return tool_error(
        f"tool {tool}: this idempotency key was already used with other arguments; it was "
        "not run. Use a new key for new work, or send the same arguments to get the "
        "first call's result."
    )


def key_missing(tool: str, key_argument: str) -> WireResult:
    """The answer to a call without a key, where one is required."""
    return tool_error(
        f"tool {tool}: this tool needs an idempotency key and was not run. Send one in the "
        f'request\'s _meta ({{"idempotencyKey": "..."}}) or as the {key_argument!r} '
        "argument: derive it from the task (the same task, the same key), not from the turn."
    )


def not_run(tool: str, why: str) -> WireResult:
    """The answer to a call the door refused for any other reason: ``why``."""
    return tool_error(f"tool {tool}: not run: {why}")


__all__ = [
    "REPLAYED",
    "RETRY_AFTER",
    "WireResult",
    "decode",
    "encode",
    "is_error",
    "key_missing",
    "key_reused",
    "not_run",
    "replayed",
    "still_running",
    "tool_error",
]
