"""Presizing a response buffer trusts only a well-formed Content-Length."""

from __future__ import annotations

import pytest

from idempotency_middleware.stores.records import Headers
from idempotency_middleware.web.capture import scan_response_headers


def declared_length(headers: Headers) -> int | None:
    return scan_response_headers(headers)[1]


def test_the_declared_content_length_is_read_whatever_the_header_case() -> None:
    assert declared_length([(b"content-type", b"text/plain"), (b"Content-Length", b"12")]) == 12


@pytest.mark.parametrize("value", [b"twelve", b"", b"1.5", b"12, 12"])
def test_a_malformed_content_length_declares_nothing(value: bytes) -> None:
    assert declared_length([(b"content-length", value)]) is None


def test_no_content_length_declares_nothing() -> None:
    assert declared_length([(b"content-type", b"text/plain")]) is None
