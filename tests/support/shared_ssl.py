"""One SSL context for the tests' httpx clients, instead of one per client.

httpx builds a new SSL context for every client it makes, parsing the whole CA bundle each
time: about 20 ms of CPU, for clients that speak plain HTTP to servers on 127.0.0.1. The
suite makes thousands of them (a client or two per test through a real server), so the
bundle was parsed thousands of times. :func:`share_default_ssl_context` makes every client
built with httpx's defaults (``verify=True``, no client certificate) share the first such
context: an ``ssl.SSLContext`` is meant to be shared by connections. A client given its own
``verify`` or ``cert`` still gets its own context.
"""

from __future__ import annotations

import ssl
from typing import Any

from httpx._config import create_ssl_context as httpx_create_ssl_context
from httpx._transports import default as transports


def share_default_ssl_context() -> None:
    """Make httpx's transports share one default SSL context per ``trust_env`` value."""
    # The transports call the name they imported from httpx._config.
    if transports.create_ssl_context is not httpx_create_ssl_context:  # type: ignore[attr-defined]
        return  # shared already
    original = httpx_create_ssl_context
    shared: dict[bool, ssl.SSLContext] = {}

    def create_ssl_context(
        verify: Any = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is not True or cert is not None:
            return original(verify=verify, cert=cert, trust_env=trust_env)
        if trust_env not in shared:
            shared[trust_env] = original(verify=True, cert=None, trust_env=trust_env)
        return shared[trust_env]

    transports.create_ssl_context = create_ssl_context  # type: ignore[attr-defined]
