"""RFC 9457 ``application/problem+json`` responses made by the middleware itself.

Details are fixed sentences: client input is never echoed, so nothing needs escaping.
A problem's ``type`` is a URN built from its slug, or ``problem_base_url + slug`` when the
middleware has a base URL (validated by ``options.Options.build``).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..stores.records import Headers

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
    # RFC 9457 extension members, after the standard ones.
    extensions: tuple[tuple[str, str | int], ...] = ()

    @property
    def type(self) -> str:
        return PROBLEM_TYPE_BASE + self.slug

    def type_for(self, base_url: str | None) -> str:
        """The ``type`` member: the URN, or ``base_url + slug`` when a base URL is set."""
        return PROBLEM_TYPE_BASE + self.slug if base_url is None else base_url + self.slug

    def document(self, *, base_url: str | None = None) -> dict[str, str | int]:
        """The problem's members, as its body carries them."""
        document: dict[str, str | int] = {
            "type": self.type_for(base_url),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        document.update(self.extensions)
        return document

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


def stored_response_unreadable() -> Problem:
    # 500, not 410: the response was kept, but this server cannot read it back (corrupt in
    # the store, or encrypted under a key it does not have). Running again would be a second
    # run of work done once; the fix is the server's (restore the key, or forget the key).
    return Problem(
        500,
        "stored-response-unreadable",
        "Stored response of the original request cannot be read",
        "The request with this idempotency key was already processed, but its stored "
        "response cannot be read back. It will not be run again; the server's operators "
        "have been told.",
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


def store_misconfigured() -> Problem:
    # 503 as an outage is (the server cannot answer), but no Retry-After and another slug:
    # retrying fails the same way until an operator fixes the configuration, so a client
    # told "retry" would only spin. Which table or credentials is the server's log's to
    # say (with the fix), never the client's.
    return Problem(
        503,
        "store-misconfigured",
        "Idempotency store misconfigured",
        "The idempotency store is misconfigured, so the request was not processed. This is "
        "not retryable: a retry fails the same way until the service's operators fix the "
        "store's configuration (fix: the server's log names what is missing).",
    )


def commit_unavailable(retry_after: int) -> Problem:
    # The same slug as a claim's outage: a client treats both alike (retry with the key).
    return Problem(
        503,
        "store-unavailable",
        "Idempotency store unavailable",
        "The request was processed, but the idempotency store could not confirm its writes: "
        "they were committed whole or not at all. Retry with the same key: it replays the "
        "response, or runs the request again if nothing was committed.",
        retry_after=retry_after,
    )


def transaction_conflict(position: int, reason: str) -> Problem:
    # 409: the request conflicts with the current state of the data (a stock level, a
    # version); nothing was written and the key was released. Only the failed write's index
    # and DynamoDB's code are told, never the item's values.
    return Problem(
        409,
        "transaction-conflict",
        "A condition of the request's writes failed",
        "A condition of the request's writes did not hold, so nothing was written and the "
        "request was not completed. The idempotency key was released: a retry runs the "
        "request again.",
        extensions=(("position", position), ("reason", reason)),
    )


def transaction_rejected(reason: str) -> Problem:
    too_large = reason == "too_large"
    return Problem(
        500,
        "transaction-too-large" if too_large else "transaction-rejected",
        "The request's writes could not be committed",
        (
            "The request's writes and its response together exceed what one DynamoDB "
            "transaction can hold (4 MB)"
            if too_large
            else "DynamoDB rejected the request's writes as written"
        )
        + ", so nothing was written. The idempotency key was released.",
    )
