"""Pure decisions, no I/O: what the middleware does with a request at each step.

Both adapters drive the same sequence (data flows one way)::

    options.policy_for()      -> pass through | Policy
    admit(key header)         -> pass through | problem (400) | Admitted(policy, key)
    check_declared_length()   -> problem (413) | None
    begin_attempt(body)       -> Attempt: key namespaced, request fingerprinted
    cache / store.claim       -> Claimed: run the app, buffer, then completion_for()/release
                                 Held:    answer_held() -> replay | 409 | 422 | 410
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

from . import problems
from .events import EventKind
from .fingerprint import fingerprint_request
from .keys import InvalidKey, parse_idempotency_key, storage_key
from .options import Options, Policy
from .problems import Problem
from .records import Headers, Record, Status, StoredResponse, storable_headers
from .request_view import RequestView
from .stores.base import ClaimRequest, Completion

# A handler holding a key usually finishes within a second; a dead owner's claim is taken
# over at its lock timeout whatever a client waits, so a short hint serves both cases.
IN_PROGRESS_RETRY_AFTER = 1
STORE_UNAVAILABLE_RETRY_AFTER = 1

# Finishing (complete, release) after the handler ran is retried: losing it costs a second
# run after the lock timeout (complete) or a locked key until then (release).
FINISH_ATTEMPTS = 4
_FINISH_BASE_DELAY = 0.05

# A claim whose answer was lost (or whose request was cancelled in flight) may land later
# than the error: its owner releases it at these delays (seconds, cumulative), stopping at the
# first release that finds it. Each release is fenced by the owner token, so extra ones are
# harmless.
LOST_CLAIM_RELEASE_DELAYS = (0.0, 0.5, 1.0, 2.0, 4.0)

# A duplicate that waits for the first attempt (``wait_seconds``) polls the store at least
# this far apart, so a waiter never makes more than 10 store calls a second, backing off to
# at most a second between polls so a long wait costs little.
MIN_POLL_INTERVAL = 0.1
MAX_POLL_INTERVAL = 1.0


RefusalReason = Literal[
    "in_progress",
    "reused",
    "not_stored",
    "unavailable",
    "commit_unavailable",
    "transaction_conflict",
    "transaction_rejected",
]

# The HTTP status each refusal is answered with, and the event it is reported as.
_REFUSAL_STATUS: dict[str, int] = {
    "in_progress": 409,
    "reused": 422,
    "not_stored": 410,
    "unavailable": 503,
    "commit_unavailable": 503,
    "transaction_conflict": 409,
    "transaction_rejected": 500,
}
_REFUSAL_EVENT: dict[str, EventKind] = {
    "in_progress": "conflict",
    "reused": "mismatch",
    "not_stored": "not_stored",
    "transaction_conflict": "transaction_conflict",
    "transaction_rejected": "transaction_rejected",
}


class Refusal(NamedTuple):
    """Why an attempt does not run; each door words it (a problem response, an exception).

    ``in_progress``: another attempt holds the key; ``reused``: the key was used with other
    input; ``not_stored``: completed, but its response (``size`` bytes) was not kept;
    ``unavailable``: the store failed on the claim; ``commit_unavailable``: it failed on a
    transaction's commit, which then landed whole or not at all;
    ``transaction_conflict``: a condition of the handler's transaction failed, nothing was
    written; ``transaction_rejected``: DynamoDB cannot commit it as written (too large).
    """

    reason: RefusalReason
    retry_after: int | None = None
    size: int = 0
    # The error behind it: the store's (unavailable), the transaction's (transaction_*).
    error: BaseException | None = None

    @property
    def status(self) -> int:
        return _REFUSAL_STATUS[self.reason]

    @property
    def event_kind(self) -> EventKind:
        """The event it is reported as (an outage is reported as the store's error)."""
        return _REFUSAL_EVENT[self.reason]


KEY_IN_PROGRESS = Refusal("in_progress", IN_PROGRESS_RETRY_AFTER)
KEY_REUSED = Refusal("reused")
STORE_UNAVAILABLE = Refusal("unavailable", STORE_UNAVAILABLE_RETRY_AFTER)
COMMIT_UNAVAILABLE = Refusal("commit_unavailable", STORE_UNAVAILABLE_RETRY_AFTER)


class Admitted(NamedTuple):
    """A covered request carrying a valid key; ``route`` is the template, or the path when
    no rule matched."""

    policy: Policy
    route: str
    key: str


def admit(
    options: Options, policy: Policy, path: str, key_lines: Sequence[bytes]
) -> Admitted | Problem | None:
    """For a covered request (``policy`` from ``options.policy_for``): ``None`` when it passes
    straight through (no key, not required), a 400 problem, or ``Admitted``.

    ``key_lines`` holds the key header's raw lines as received.
    """
    try:
        key = parse_idempotency_key(key_lines)
    except InvalidKey as error:
        return problems.invalid_key(error.detail, options.header_name)
    if key is None:
        return problems.missing_key(options.header_name) if policy.required else None
    return Admitted(policy, path if policy.route is None else policy.route, key)


def check_declared_length(options: Options, content_length: bytes | str | None) -> Problem | None:
    """413 before reading a body whose declared length is already over the limit."""
    if content_length is None:
        return None
    try:
        declared = int(content_length)
    except ValueError:
        return None  # the server rejects a malformed Content-Length itself
    if declared > options.max_body_bytes:
        return problems.body_too_large(options.max_body_bytes)
    return None


class Attempt(NamedTuple):
    """One covered request with a valid key, fingerprinted and ready to claim."""

    method: str
    route: str
    policy: Policy
    claim: ClaimRequest

    @property
    def key_hash(self) -> str:
        return self.claim.key_hash


def begin_attempt(
    admitted: Admitted,
    *,
    method: str,
    path: str,
    query_string: bytes | str,
    content_type: bytes | str | None,
    body: bytes,
    request_view: Callable[[str], RequestView],
    now: float,
) -> Attempt:
    """Namespace the key (method, route template, scope) and fingerprint the request.

    ``request_view(route)`` builds the view a ``scope`` callable receives; it is only called
    when there is one.
    """
    policy, route, key = admitted
    scope_value = policy.scope(request_view(route)) if policy.scope is not None else None
    claim = ClaimRequest(
        storage_key(method, route, scope_value, key),
        fingerprint_request(method, path, query_string, content_type, body),
        new_owner(),
        now,
        policy.lock_timeout_seconds,
        policy.clock_skew_seconds,
    )
    return Attempt(method, route, policy, claim)


# Owner tokens fence a claim's finishing writes. A random per-process prefix and a counter
# make them unique without a system call per request; a forked child draws its own prefix,
# so parent and child never hand out the same token.
_owner_prefix = os.urandom(12).hex() + "-"
_owner_numbers = itertools.count()


def new_owner() -> str:
    """A fresh owner token for one attempt's claim."""
    return f"{_owner_prefix}{next(_owner_numbers):x}"


def _new_owner_prefix() -> None:
    global _owner_prefix
    _owner_prefix = os.urandom(12).hex() + "-"


os.register_at_fork(after_in_child=_new_owner_prefix)


def answer_held(record: Record, fingerprint: str) -> StoredResponse | Refusal:
    """What a request gets when another request holds its key."""
    if record.fingerprint != fingerprint:
        return KEY_REUSED
    if record.status is Status.IN_PROGRESS:
        return KEY_IN_PROGRESS
    if record.response is None:
        return Refusal("not_stored", size=record.response_size)
    return record.response


def is_waitable(record: Record, claim: ClaimRequest) -> bool:
    """A duplicate of an attempt still running: what ``wait_seconds`` waits out. A
    mismatched fingerprint is answered at once (422), never waited for."""
    return record.status is Status.IN_PROGRESS and record.fingerprint == claim.fingerprint


def poll_delay(number: int, remaining: float) -> float | None:
    """How long waiter poll ``number`` (0+) pauses, with ``remaining`` seconds of its wait
    left; ``None`` when too little is left for another poll. Exponential backoff with jitter
    between ``MIN_POLL_INTERVAL`` and ``MAX_POLL_INTERVAL``: never two polls closer than the
    minimum, and waiters of one key do not poll in lockstep."""
    if remaining < MIN_POLL_INTERVAL:
        return None
    ceiling = min(MIN_POLL_INTERVAL * 2 ** (min(number, 8) + 1), MAX_POLL_INTERVAL)
    return min(random.uniform(ceiling / 2, ceiling), remaining)


def is_own_claim(record: Record, claim: ClaimRequest) -> bool:
    """A held record that carries our own owner token is our claim: it landed, its answer
    was lost, and the client (botocore's retry) re-sent it, failing against itself."""
    return record.owner == claim.owner and record.status is Status.IN_PROGRESS


def held_event_kind(answer: StoredResponse | Refusal) -> EventKind:
    if isinstance(answer, StoredResponse):
        return "replayed"
    return answer.event_kind


def keeps_response(status: int) -> bool:
    """Responses below 500 are the outcome of the request; 5xx ones are released for retry."""
    return status < 500


def completion_for(
    attempt: Attempt,
    status: int,
    headers: Headers,
    body: bytes,
    now: float,
    *,
    streamed_size: int | None = None,
    writes: tuple[dict[str, Any], ...] = (),
    deferred: bool = False,
) -> Completion:
    """What to store for a finished response; ``streamed_size`` when it went out live,
    ``writes`` to commit with it, ``deferred`` when it is the interim response of work
    handed on."""
    claim = attempt.claim
    return Completion(
        claim.key_hash,
        claim.owner,
        now,
        attempt.policy.ttl_seconds,
        StoredResponse(status, storable_headers(headers), body),
        streamed_size is not None,
        streamed_size or 0,
        writes,
        deferred,
    )


def finish_delay(attempt_number: int) -> float:
    """Exponential backoff with full jitter before finishing attempt ``attempt_number`` (1+)."""
    return random.uniform(0, _FINISH_BASE_DELAY * (2 ** (attempt_number - 1)))


def gave_up(error: Exception, attempts: int) -> str:
    return (
        f"{error!r}; gave up after {attempts} attempts: the key stays claimed until its lock "
        "timeout, then a retry runs the handler again"
    )
