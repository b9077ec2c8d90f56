"""Pure decisions, no I/O: what the middleware does with a request at each step.

Both adapters drive the same sequence (data flows one way)::

    admit(headers)            -> pass through | problem (400) | Admitted(policy, key)
    check_declared_length()   -> problem (413) | None
    claim_request_for(body)   -> ClaimRequest   (key namespaced, request fingerprinted)
    store.claim               -> Claimed: run the app, buffer, then completion_for()/release
                                 Held:    answer_held() -> replay | 409 | 422 | 410
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import problems
from .fingerprint import fingerprint_request
from .keys import InvalidKey, parse_idempotency_key, storage_key
from .options import Options, Policy
from .problems import Problem
from .records import Record, Status, StoredResponse, storable_headers
from .request_view import RequestView
from .stores.base import ClaimRequest, Completion

# A handler holding a key usually finishes within a second; a dead owner's claim is taken
# over at its lock timeout whatever a client waits, so a short hint serves both cases.
IN_PROGRESS_RETRY_AFTER = 1
STORE_UNAVAILABLE_RETRY_AFTER = 1


@dataclass(frozen=True)
class Admitted:
    """A covered request carrying a valid key."""

    policy: Policy
    key: str


def admit(
    options: Options, method: str, path: str, header_values: Sequence[bytes]
) -> Admitted | Problem | None:
    """``None`` when the request passes straight through, a 400 problem, or ``Admitted``."""
    policy = options.policy_for(method, path)
    if policy is None:
        return None
    try:
        key = parse_idempotency_key(header_values)
    except InvalidKey as error:
        return problems.invalid_key(error.detail, options.header_name)
    if key is None:
        return problems.missing_key(options.header_name) if policy.required else None
    return Admitted(policy, key)


def check_declared_length(options: Options, content_length: str | None) -> Problem | None:
    """413 before reading a body whose declared length is already over the limit."""
    if content_length is None:
        return None
    try:
        declared = int(content_length)
    except ValueError:
        return None  # the server rejects a malformed Content-Length itself
    return (
        problems.body_too_large(options.max_body_bytes)
        if declared > options.max_body_bytes
        else None
    )


def new_owner_token() -> str:
    return secrets.token_urlsafe(16)


def claim_request_for(
    admitted: Admitted,
    *,
    method: str,
    path: str,
    query_string: bytes | str,
    content_type: str | None,
    body: bytes,
    request_view: Callable[[], RequestView],
    now: float,
) -> ClaimRequest:
    """Namespace the key (method, route template, scope) and fingerprint the request."""
    policy = admitted.policy
    scope_value = policy.scope(request_view()) if policy.scope is not None else None
    return ClaimRequest(
        key=storage_key(method, policy.route, scope_value, admitted.key),
        fingerprint=fingerprint_request(method, path, query_string, content_type, body),
        owner=new_owner_token(),
        now=now,
        lock_timeout_seconds=policy.lock_timeout_seconds,
    )


def answer_held(record: Record, fingerprint: str, now: float) -> StoredResponse | Problem:
    """What a request gets when another request holds its key."""
    if record.fingerprint != fingerprint:
        return problems.fingerprint_mismatch()
    if record.status is Status.IN_PROGRESS:
        return problems.key_in_progress(IN_PROGRESS_RETRY_AFTER)
    if record.response is None:
        return problems.response_not_stored(record.response_size)
    return record.response


def keeps_response(status: int) -> bool:
    """Responses below 500 are the outcome of the request; 5xx ones are released for retry."""
    return status < 500


def completion_for(
    claim: ClaimRequest,
    policy: Policy,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    now: float,
) -> Completion:
    return Completion(
        key=claim.key,
        owner=claim.owner,
        now=now,
        ttl_seconds=policy.ttl_seconds,
        response=StoredResponse(status, storable_headers(headers), body),
    )


def store_unavailable() -> Problem:
    return problems.store_unavailable(STORE_UNAVAILABLE_RETRY_AFTER)
