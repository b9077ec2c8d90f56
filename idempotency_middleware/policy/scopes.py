"""Ready-made ``scope`` callables: keep one client's keys apart from another's.

Without a scope, a key is shared by every client of a route: a client that guesses (or
reuses) a low-entropy key such as ``1`` would receive another client's stored response.
Scoping by credential makes keys per client; the storage key is a hash, so neither the key
nor the scope value is stored in clear.
"""

from __future__ import annotations

import hashlib

from .request_view import RequestView
from .rules import ScopeFunction


def scope_by_header(header: str = "Authorization") -> ScopeFunction:
    """Scope keys by a credential header (``Authorization``, ``X-Api-Key``).

    The value is hashed at once, so the credential never travels further than this call.
    A request without the header gets the empty scope (anonymous clients share keys).
    """
    name = header.lower()

    def scope(request: RequestView) -> str:
        value = request.headers.get(name)
        if not value:
            return ""
        return "h:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()

    scope.__name__ = f"scope_by_header_{name.replace('-', '_')}"
    return scope


def scope_by_tenant_header(header: str = "X-Tenant-Id") -> ScopeFunction:
    """Scope keys by a tenant identifier header that your gateway sets and trusts."""
    name = header.lower()

    def scope(request: RequestView) -> str:
        return "t:" + request.headers.get(name, "")

    scope.__name__ = f"scope_by_tenant_{name.replace('-', '_')}"
    return scope
