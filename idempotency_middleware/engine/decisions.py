"""Pure decisions, no I/O: what the middleware does with a request at each step.

Every door drives the same sequence (data flows one way)::

    options.policy_for()      -> pass through | Policy                       (the rule)
    admit_request(key header) -> pass through | problem (400, 413) | Admitted (key, length)
    door reads the body       -> problem (413): body_too_large / check_body_size
    begin_attempt(body)       -> Attempt: key namespaced, request fingerprinted, claim built
    engine.flow.attempt       -> Claimed: run the app, buffer, then completion_for()/release
                                 Held:    answer_held() -> replay | 409 | 422 | 410
    refusals.problem_for / error_for: the door words a refusal

The ``idempotent`` function door reads its key and payload from the call's arguments and
joins at ``call_attempt``. Time (``now``) and randomness (``owner``, ``jitter``) are
arguments: the engine takes them from its clock and its ``entropy.Entropy``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..errors import StoredResultUnreadableError
from ..events import EventKind
from ..policy.fingerprint import fingerprint_request
from ..policy.keys import InvalidKey, parse_idempotency_key, storage_key
from ..policy.options import Options, Policy
from ..policy.request_view import RequestView
from ..stores.encryption import Encryption, open_response
from ..stores.protocol import ClaimRequest, Completion
from ..stores.records import (
    IN_PROGRESS,
    UNKNOWN_FINGERPRINT,
    Headers,
    Record,
    StoredResponse,
    UnreadableResponse,
    storable_headers,
)
from . import problems
from .problems import Problem
from .refusals import (
    COMMIT_UNAVAILABLE,
    IN_PROGRESS_RETRY_AFTER,
    KEY_IN_PROGRESS,
    KEY_REUSED,
    STORE_UNAVAILABLE,
    STORE_UNAVAILABLE_RETRY_AFTER,
    Refusal,
    RefusalReason,
)

# The refusals (``refusals.py``) are part of core's vocabulary: the engine decides them here.
__all__ = [
    "COMMIT_UNAVAILABLE",
    "IN_PROGRESS_RETRY_AFTER",
    "KEY_IN_PROGRESS",
    "KEY_REUSED",
    "STORE_UNAVAILABLE",
    "STORE_UNAVAILABLE_RETRY_AFTER",
    "Refusal",
    "RefusalReason",
]

# Finishing (complete, release) after the handler ran is retried: losing it costs a second
# run after the lock timeout (complete) or a locked key until then (release). A release is
# tried FINISH_ATTEMPTS times; a completion for as long as its lease lasts, at most
# FINISH_SECONDS: longer than the failovers of a replicated store (one to three seconds),
# short enough for a caller to wait for.
FINISH_ATTEMPTS = 4
FINISH_SECONDS = 5.0
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

# Hot-path NamedTuples are built with ``tuple.__new__`` (every field given, in order): calling
# the class runs its Python-level ``__new__``, about twice the instructions per tuple.
_new = tuple.__new__

# Events of a function call carry this as their ``method`` and its ``name`` as ``route``.
CALL_METHOD = "CALL"
# A function's keys are namespaced apart from every HTTP route: "@" is no HTTP method.
FUNCTION_NAMESPACE = "@function"


class Admitted(NamedTuple):
    """A covered request carrying a valid key; ``route`` is the template, or the path when
    no rule matched."""

    policy: Policy
    route: str
    key: str


def store_check(store: object, name: str) -> Callable[[], Any]:
    """The store's ``check`` or ``acheck`` (``name``), which ``check_store=True`` runs at
    start-up; ``TypeError`` at construction for a store that has none."""
    method: Callable[[], Any] | None = getattr(store, name, None)
    if not callable(method):
        raise TypeError(
            f"check_store=True needs a store with {name}(); {type(store).__name__} has none"
        )
    return method


def admit(
    options: Options, policy: Policy, path: str, key_lines: Sequence[bytes]
) -> Admitted | Problem | None:
    """For a covered request (``policy`` from ``options.policy_for``): ``None`` when it passes
    straight through (no key, not required), a 400 problem, or ``Admitted``.

    ``key_lines`` holds the key header's raw lines as received.
    """
    return admit_request(options, policy, path, key_lines, None)


def check_declared_length(options: Options, content_length: bytes | str | None) -> Problem | None:
    """413 before reading a body whose declared length is already over the limit."""
    if content_length is None:
        return None
    try:
        declared = int(content_length)
    except ValueError:
        return None  # the server rejects a malformed Content-Length itself
    if declared > options.max_body_bytes:
        return body_too_large(options)
    return None


def admit_request(
    options: Options,
    policy: Policy,
    path: str,
    key_lines: Sequence[bytes],
    content_length: bytes | str | None,
) -> Admitted | Problem | None:
    """The steps of a covered HTTP request before its body is read: ``admit`` its key, then
    refuse a declared length over the limit (``check_declared_length``). (``admit``'s work
    is done here, and ``admit`` calls this: one call less on every request with a key.)"""
    try:
        key = parse_idempotency_key(key_lines)
    except InvalidKey as error:
        return problems.invalid_key(error.detail, options.header_name)
    if key is None:
        return problems.missing_key(options.header_name) if policy.required else None
    if content_length is not None:
        too_large = check_declared_length(options, content_length)
        if too_large is not None:
            return too_large
    return _new(Admitted, (policy, path if policy.route is None else policy.route, key))


def body_too_large(options: Options) -> Problem:
    """413 for a body found over ``max_body_bytes`` while (or after) a door read it."""
    return problems.body_too_large(options.max_body_bytes)


def check_body_size(options: Options, size: int) -> Problem | None:
    """413 for a body read whole whose length was undeclared (chunked) or understated."""
    return body_too_large(options) if size > options.max_body_bytes else None


class Attempt(NamedTuple):
    """One covered request with a valid key, fingerprinted and ready to claim."""

    method: str
    route: str
    policy: Policy
    claim: ClaimRequest

    @property
    def key_hash(self) -> str:
        return self.claim.key_hash


def new_attempt(
    policy: Policy,
    method: str,
    route: str,
    key_hash: str,
    fingerprint: str,
    now: float,
    owner: str,
) -> Attempt:
    """The attempt every door hands the engine: its claim request, built in this one place."""
    claim = _new(
        ClaimRequest,
        (
            key_hash,
            fingerprint,
            owner,
            now,
            policy.lock_timeout_seconds,
            policy.clock_skew_seconds,
        ),
    )
    return _new(Attempt, (method, route, policy, claim))


def begin_attempt(
    admitted: Admitted,
    method: str,
    path: str,
    query_string: bytes | str,
    content_type: bytes | str | None,
    body: bytes,
    request_view: Callable[[str], RequestView] | None,
    now: float,
    owner: str,
) -> Attempt:
    """Namespace the key (method, route template, scope) and fingerprint the request.

    ``request_view(route)`` builds the view a ``scope`` callable receives; it is only called
    when there is one (``None`` will do when the policy has none). ``owner`` is a fresh token
    (``entropy.Entropy.owner``). (Positional arguments are accepted: a call by keyword costs
    more on every request.)
    """
    policy, route, key = admitted
    scope = policy.scope
    if scope is not None:
        assert request_view is not None, "a policy with a scope function needs a request view"
        scope_value = scope(request_view(route))
    else:
        scope_value = None
    return new_attempt(
        policy,
        method,
        route,
        storage_key(method, route, scope_value, key),
        fingerprint_request(method, path, query_string, content_type, body),
        now,
        owner,
    )


def call_attempt(
    policy: Policy, name: str, key: str, fingerprint: str, now: float, owner: str
) -> Attempt:
    """The attempt of one call of ``idempotent`` function ``name``: its keys live in a
    namespace of their own, apart from every HTTP route."""
    return new_attempt(
        policy,
        CALL_METHOD,
        name,
        storage_key(FUNCTION_NAMESPACE, name, None, key),
        fingerprint,
        now,
        owner,
    )


def answer_held(
    record: Record,
    fingerprint: str,
    encryption: Encryption | None = None,
    sealed_only: bool = False,
) -> StoredResponse | Refusal:
    """What a request gets when another request holds its key. A sealed response is opened
    with ``encryption``; one that cannot be read back (corrupt, or not opening) is refused,
    never replayed and never run again, as is a plain one when ``sealed_only``."""
    if record.fingerprint not in (fingerprint, UNKNOWN_FINGERPRINT):
        return KEY_REUSED
    if record.status is IN_PROGRESS:
        return KEY_IN_PROGRESS._replace(held_until=record.lock_expires_at)
    response = record.response
    if response is None:
        return Refusal("not_stored", size=record.response_size)
    if type(response) is not StoredResponse:  # sealed, or unreadable already
        response = open_response(response, encryption, record.key_hash, fingerprint)
        if type(response) is UnreadableResponse:
            return Refusal("unreadable", error=StoredResultUnreadableError(response.reason))
    elif sealed_only:
        return Refusal("unreadable", error=StoredResultUnreadableError(PLAIN_REFUSED))
    return response


# Why a door that unpickles results refuses a plain record: whoever can write the store
# could have written it, and unpickling it could run their code.
PLAIN_REFUSED = (
    "the record is not encrypted, and this door's serializer unpickles: only records "
    "encrypted with its keys are read back"
)


def is_waitable(record: Record, claim: ClaimRequest) -> bool:
    """A duplicate of an attempt still running: what ``wait_seconds`` waits out. A
    mismatched fingerprint is answered at once (422), never waited for."""
    return record.status is IN_PROGRESS and record.fingerprint == claim.fingerprint


def poll_delay(number: int, remaining: float, jitter: float) -> float | None:
    """How long waiter poll ``number`` (0+) pauses, with ``remaining`` seconds of its wait
    left; ``None`` when too little is left for another poll. Exponential backoff with jitter
    (``jitter``, a draw in ``[0, 1)``) between ``MIN_POLL_INTERVAL`` and
    ``MAX_POLL_INTERVAL``: never two polls closer than the minimum, and waiters of one key do
    not poll in lockstep."""
    if remaining < MIN_POLL_INTERVAL:
        return None
    ceiling = min(MIN_POLL_INTERVAL * 2.0 ** (min(number, 8) + 1), MAX_POLL_INTERVAL)
    return min(ceiling / 2 + jitter * (ceiling / 2), remaining)


def is_own_claim(record: Record, claim: ClaimRequest) -> bool:
    """A held record that carries our own owner token is our claim: it landed, its answer
    was lost, and the client (botocore's retry) re-sent it, failing against itself."""
    return record.owner == claim.owner and record.status is IN_PROGRESS


def held_event_kind(answer: StoredResponse | Refusal) -> EventKind:
    if isinstance(answer, StoredResponse):
        return "replayed"
    return answer.event_kind


def completion_for(
    attempt: Attempt,
    status: int,
    headers: Headers,
    body: bytes,
    now: float,
    streamed_size: int | None = None,
    writes: tuple[dict[str, Any], ...] = (),
    deferred: bool = False,
    deferred_to: str | None = None,
) -> Completion:
    """What to store for a finished response; ``streamed_size`` when it went out live,
    ``writes`` to commit with it, ``deferred`` when it is the interim response of work
    handed on (``deferred_to``: the owner whose token finishes it, when not the claim's)."""
    claim = attempt.claim
    return _new(
        Completion,
        (
            claim.key_hash,
            claim.owner,
            now,
            attempt.policy.ttl_seconds,
            _new(StoredResponse, (status, storable_headers(headers), body)),
            streamed_size is not None,
            streamed_size or 0,
            writes,
            deferred,
            deferred_to,
        ),
    )


# A completion retried for as long as its lease lasts tries again at most this far apart:
# well inside the skew margin, so a store back before the lease ended sees the completion
# before a takeover can.
MAX_FINISH_DELAY = 0.5


def finish_delay(attempt_number: int, jitter: float) -> float:
    """Exponential backoff with full jitter (``jitter``, a draw in ``[0, 1)``) before
    finishing attempt ``attempt_number`` (1+), at most ``MAX_FINISH_DELAY``."""
    return min(
        jitter * _FINISH_BASE_DELAY * (2.0 ** (min(attempt_number, 16) - 1)), MAX_FINISH_DELAY
    )


def gave_up(error: Exception, attempts: int) -> str:
    return (
        f"{error!r}; gave up after {attempts} attempts: the key stays claimed until its lock "
        "timeout, then a retry runs the handler again"
    )
