"""RFC 9457 ``application/problem+json`` responses made by the middleware itself.

Details are fixed sentences: client input is never echoed, so nothing needs escaping.
A problem's ``type`` is a URN built from its slug, or ``problem_base_url + slug`` when the
middleware has a base URL (validated by ``options.Options.build``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from .records import Headers

if TYPE_CHECKING:
    from .core import Refusal

PROBLEM_TYPE_BASE = "urn:idempotency-middleware:problem:"

# The statuses whose problems point at their documentation with a Link header when there is
# a base URL: the draft Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header,
# "Error Scenarios") asks for a link on a missing key (400) and a reused key (422). The
# other problems say what to do in their detail and headers (Retry-After).
DESCRIBED_STATUSES = frozenset({400, 422})


@dataclass(frozen=True)
class Problem:
    status: int
    slug: str
    title: str
    detail: str
    retry_after: int | None = None

    @property
    def type(self) -> str:
        return PROBLEM_TYPE_BASE + self.slug

    def type_for(self, base_url: str | None) -> str:
        """The ``type`` member: the URN, or ``base_url + slug`` when a base URL is set."""
        return PROBLEM_TYPE_BASE + self.slug if base_url is None else base_url + self.slug

    def document(self, *, base_url: str | None = None) -> dict[str, str | int]:
        """The problem's members, as its body carries them."""
        return {
            "type": self.type_for(base_url),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }

    def body(self, *, base_url: str | None = None) -> bytes:
        return orjson.dumps(self.document(base_url=base_url))

    def headers(self, body: bytes, *, base_url: str | None = None) -> Headers:
        headers: Headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"cache-control", b"no-store"),
        ]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode("ascii")))
        if base_url is not None and self.status in DESCRIBED_STATUSES:
            # Options.build admits only URI characters in a base URL, so the value is ASCII
            # and cannot break out of the <...> of the header.
            link = f'<{base_url}{self.slug}>; rel="describedby"'
            headers.append((b"link", link.encode("ascii")))
        return headers


def invalid_key(detail: str, header_name: str) -> Problem:
    return Problem(400, "invalid-key", f"Invalid {header_name} header", detail)


def missing_key(header_name: str) -> Problem:
    return Problem(
        400,
        "missing-key",
        f"Missing {header_name} header",
        f"This endpoint requires an {header_name} header so the request can be retried safely.",
    )


def body_too_large(limit: int) -> Problem:
    return Problem(
        413,
        "body-too-large",
        "Request body too large",
        f"Requests with an idempotency key may carry at most {limit} bytes of body.",
    )


def key_in_progress(retry_after: int) -> Problem:
    return Problem(
        409,
        "key-in-progress",
        "Request with this idempotency key is in progress",
        "A request with the same idempotency key is still being processed; "
        "retry after the time given in Retry-After.",
        retry_after=retry_after,
    )


def fingerprint_mismatch() -> Problem:
    return Problem(
        422,
        "key-reused",
        "Idempotency key reused with a different request",
        "This idempotency key was already used with a different path, query or body. "
        "Use a new key for a new request.",
    )


def response_not_stored(size: int) -> Problem:
    # 410, not 409 (which invites retrying) and not 2xx: the work was done exactly once, but
    # its response was not kept (streamed live, or too large), so it cannot be replayed.
    return Problem(
        410,
        "response-not-stored",
        "Response of the original request is not available",
        f"The request with this idempotency key was already processed, but its response "
        f"({size} bytes) was not stored: it was streamed, or too large to keep. It will not be "
        "run again; use a new key to repeat the operation.",
    )


def store_unavailable(retry_after: int) -> Problem:
    return Problem(
        503,
        "store-unavailable",
        "Idempotency store unavailable",
        "The idempotency store could not be reached, so the request was not processed. "
        "Retry with the same key.",
        retry_after=retry_after,
    )


def for_refusal(refusal: Refusal) -> Problem:
    """The HTTP answer to an attempt the engine refused to run."""
    reason = refusal.reason
    if reason == "in_progress":
        return key_in_progress(refusal.retry_after or 1)
    if reason == "reused":
        return fingerprint_mismatch()
    if reason == "not_stored":
        return response_not_stored(refusal.size)
    return store_unavailable(refusal.retry_after or 1)
