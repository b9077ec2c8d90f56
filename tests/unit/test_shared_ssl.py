"""``tests/support/shared_ssl.py``: httpx's transports build one default SSL context, shared
by every client made with the defaults, and still a context of its own for a client that
asks for other verification."""

from __future__ import annotations

import ssl

import httpx
from httpx._transports import default as transports

from tests.support.shared_ssl import share_default_ssl_context


def create(verify: ssl.SSLContext | bool = True, trust_env: bool = True) -> ssl.SSLContext:
    """What a transport calls for its SSL context."""
    build = transports.create_ssl_context  # type: ignore[attr-defined]
    context: ssl.SSLContext = build(verify=verify, cert=None, trust_env=trust_env)
    return context


def test_clients_with_httpx_defaults_share_one_context() -> None:
    share_default_ssl_context()  # (tests/conftest.py did already: sharing again is a no-op)
    assert create() is create()
    assert create(trust_env=False) is create(trust_env=False)
    with httpx.Client(), httpx.Client():
        assert create() is create()


def test_a_client_asking_for_other_verification_gets_its_own_context() -> None:
    own = ssl.create_default_context()
    assert create(verify=own) is own
    unverified = create(verify=False)
    assert unverified is not create()
    assert unverified.verify_mode == ssl.CERT_NONE
    assert create().verify_mode == ssl.CERT_REQUIRED
