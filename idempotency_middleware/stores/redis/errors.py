"""Why a Redis call failed: redis-py's exceptions mapped to ``StoreUnavailable`` causes.

A failure inside a script reaches the client wrapped ("Error running script ...: -READONLY
..."), so the server's error code is looked for in the message as well as in the type.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from ..kit import off_its_loop
from ..protocol import StoreUnavailable

# Server error codes, by the cause they mean (see errors.CAUSES).
_CAUSES_BY_CODE = {
    **dict.fromkeys(("NOAUTH", "WRONGPASS"), "bad_credentials"),
    "NOPERM": "access_denied",
    # A replica answers writes with READONLY: after a failover the client still talks to
    # the old primary. The write did not happen and the primary is elsewhere: for this
    # client, the store is unreachable until it finds the primary (an outage the breaker
    # counts), not a misconfiguration to fix by hand.
    "READONLY": "unreachable",
    **dict.fromkeys(
        ("OOM", "BUSY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"), "server_error"
    ),
}
_CODE = re.compile(r"(?:^|[\s:-])(" + "|".join(_CAUSES_BY_CODE) + r")\b")

_PHRASES = {
    "bad_credentials": "authentication failed (wrong or missing password or user)",
    "access_denied": "the Redis user may not run this (ACL: NOPERM)",
    "unreachable": "cannot connect",
    "timed_out": "timed out waiting for an answer",
    "server_error": "server error",
    "throttled": "the client's connection pool is exhausted",
    "loop_closed": "the client belongs to another event loop, or its loop is closed",
    "unknown": "request failed",
    "not_replicated": "not acknowledged by enough replicas in time",
}


def classify(error: BaseException) -> tuple[str, str]:
    """The cause of a redis-py failure, and the server's error code (or the type's name)."""
    from redis import exceptions as r

    found = _CODE.search(str(error))
    code = found.group(1) if found else ""
    name = type(error).__name__
    if off_its_loop(error):
        return "loop_closed", name
    if isinstance(error, r.AuthenticationError):
        return "bad_credentials", code or name
    if isinstance(error, (r.AuthorizationError, r.NoPermissionError)):
        return "access_denied", code or "NOPERM"
    if isinstance(error, r.ReadOnlyError):
        return "unreachable", "READONLY"
    if isinstance(error, (r.BusyLoadingError, r.OutOfMemoryError, r.ClusterDownError)):
        return "server_error", code or name
    if isinstance(error, r.MaxConnectionsError):
        return "throttled", name
    if isinstance(error, (r.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        # (Connecting that times out is a server not there, like a refused connection.)
        connecting = "connecting" in str(error).lower()
        return ("unreachable" if connecting else "timed_out"), name
    if isinstance(error, (r.ConnectionError, OSError)):
        return "unreachable", name
    if code:
        return _CAUSES_BY_CODE[code], code
    return "unknown", name


def translate(operation: str, error: BaseException, where: str) -> StoreUnavailable:
    """``error`` as a classified ``StoreUnavailable``; a ``RuntimeError`` that is not about
    event loops is a bug, raised again as it is."""
    cause, code = classify(error)
    if isinstance(error, RuntimeError) and cause != "loop_closed":
        raise error
    detail = str(error) or type(error).__name__
    return StoreUnavailable(
        f"Redis {operation} failed: {detail}",
        code=code,
        cause=cause,
        reason=f"{_PHRASES[cause]}: Redis at {where} ({detail})",
    )


def describe(client: Any) -> str:
    """Where a client points, for messages (never its password)."""
    kwargs: dict[str, Any] = {}
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if isinstance(service, str):  # a Sentinel client: the primary is wherever they say
        return f"sentinel:{service}"
    if pool is not None:
        kwargs = dict(getattr(pool, "connection_kwargs", {}) or {})
    else:  # a cluster client: the node it started from
        node = getattr(client, "get_default_node", lambda: None)()
        source = node if node is not None else client
        kwargs = {"host": getattr(source, "host", None), "port": getattr(source, "port", None)}
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
