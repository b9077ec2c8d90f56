"""The store protocol shared by every backend, sync and async, and the deferred token.

A store does four things, each atomic: *claim* a key (or report the record that holds it),
*complete* a claim with its response, *release* a claim, *renew* a running claim's lock;
finishing and renewing are fenced by the claim's owner token. Operators also get, delete,
create the table and check (:class:`SyncOperations`). Writing a store: the "Writing a
store" page of the documentation, and the contract suite
(``tests/contract/test_store_contract.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

# Re-exported for store authors (``StoreUnavailable`` is ``StoreUnavailableError``).
from ..errors import StoreUnavailable as StoreUnavailable
from ..errors import StoreUnavailableError as StoreUnavailableError
from .encryption import Encryption, check_encryption
from .records import Headers, Record, StoredResponse, is_status, storable_headers

HeaderPairs = Iterable[tuple[bytes, bytes]]
"""A response's headers as ASGI carries them: ``(name, value)`` byte pairs."""


class ClaimRequest(NamedTuple):
    """Claim ``key_hash`` for ``owner`` at ``now``, holding it for ``lock_timeout_seconds``.

    The claim succeeds when the key is absent, its record expired, or it is an in-progress
    claim whose lock expired at least ``clock_skew_seconds`` ago (a dead owner's: the claim
    takes it over). The margin is the claimer's: a host whose clock runs ahead by less than
    it cannot take over a live owner's claim early.
    """

    key_hash: str
    fingerprint: str
    owner: str
    now: float
    lock_timeout_seconds: float
    clock_skew_seconds: float = 0.0

    @property
    def lock_expires_at(self) -> float:
        return self.now + self.lock_timeout_seconds

    @property
    def stale_before(self) -> float:
        """An in-progress claim whose lock expired by then may be taken over."""
        return self.now - self.clock_skew_seconds

    @property
    def expires_at(self) -> float:
        # An in-progress claim expires with its lock: past it the claim may be taken over
        # anyway, and DynamoDB's TTL sweeper may then remove an abandoned claim.
        return self.lock_expires_at


class Claimed(NamedTuple):
    """The caller now owns the key. ``taken_over`` when it replaced a dead owner's claim."""

    taken_over: bool = False


# The two possible answers of a successful claim, built once (stores return these).
CLAIMED = Claimed(taken_over=False)
TAKEN_OVER = Claimed(taken_over=True)


class Held(NamedTuple):
    """Someone else holds the key; ``record`` is what the store has for it."""

    record: Record


ClaimResult = Claimed | Held
"""What a claim answers: the caller owns the key, or someone else holds it."""


class Completion(NamedTuple):
    """``owner``'s claim on ``key_hash`` finished at ``now`` with ``response``, kept for
    ``ttl_seconds``."""

    key_hash: str
    owner: str
    now: float
    ttl_seconds: float
    response: StoredResponse
    # A streamed response went to its client live; only the fact that it completed is kept
    # (the key is completed, its body is not stored), like a response too large to store.
    streamed: bool = False
    streamed_size: int = 0
    # Business writes to commit in one transaction with the completion (``TransactItems``
    # entries); only DynamoDB stores receive any (``completion_transaction()`` refuses others).
    writes: tuple[dict[str, Any], ...] = ()
    # The handler deferred its work (``defer_completion()``): store ``response`` as the
    # interim response of a deferred key, to be completed later by the deferral's token.
    deferred: bool = False
    # A deferred key handed to another owner's token: an earlier attempt's, whose work
    # (a Step Functions execution) still runs after its process died and this attempt took
    # the key over. The interim completion, fenced by ``owner`` as any, writes this owner,
    # so that the running work's token finishes the key (None: the attempt's own).
    deferred_to: str | None = None

    @property
    def expires_at(self) -> float:
        return self.now + self.ttl_seconds

    @property
    def body_size(self) -> int:
        return self.streamed_size if self.streamed else len(self.response.body)


@runtime_checkable
class SyncStore(Protocol):
    """A store the WSGI middleware can use. Finishing and renewing answer ``False`` when
    the claim is no longer ``owner``'s."""

    def claim(self, request: ClaimRequest) -> ClaimResult: ...

    def complete(self, completion: Completion) -> bool: ...

    def release(self, key_hash: str, owner: str) -> bool: ...

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool: ...


@runtime_checkable
class AsyncStore(Protocol):
    """A store the ASGI middleware can use."""

    async def aclaim(self, request: ClaimRequest) -> ClaimResult: ...

    async def acomplete(self, completion: Completion) -> bool: ...

    async def arelease(self, key_hash: str, owner: str) -> bool: ...

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool: ...


# ``awaits_nothing``: the attribute marking an async store method that only returns what its
# sync twin returns (``sync_twin``).
_SYNC_TWIN = "__idempotency_sync_twin__"

_F = TypeVar("_F", bound=Callable[..., Any])


def awaits_nothing(sync_name: str) -> Callable[[_F], _F]:
    """Mark an async store method whose whole body is ``return self.<sync_name>(...)`` with
    the same arguments: a store that does no I/O (``MemoryStore``). The async driver then
    calls the sync method itself (``sync_twin``), saving a coroutine per call; nothing else
    differs, since such a coroutine never suspends."""

    def mark(method: _F) -> _F:
        setattr(method, _SYNC_TWIN, sync_name)
        return method

    return mark


def sync_twin(store: object, async_name: str) -> Callable[..., Any] | None:
    """``store``'s sync method that its async method ``async_name`` only wraps (see
    ``awaits_nothing``), or ``None``: a subclass (or wrapper) that overrides the async method
    without the mark is awaited as it is."""
    sync_name = getattr(getattr(type(store), async_name, None), _SYNC_TWIN, None)
    return None if sync_name is None else getattr(store, sync_name, None)


@runtime_checkable
class SyncDeferrals(Protocol):
    """Finishing deferred keys (``defer_completion()``) by token: ``False`` when the token
    no longer applies (completed, expired, taken over), ``ValueError`` when malformed.
    ``encryption``: the doors' ``Encryption``, to store the final response encrypted.
    ``release_deferred``: the work did not happen, a retry runs the handler again."""

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: Any = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool: ...

    def release_deferred(self, token: str) -> bool: ...


@runtime_checkable
class AsyncDeferrals(Protocol):
    """:class:`SyncDeferrals` for an async store."""

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: Any = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool: ...

    async def arelease_deferred(self, token: str) -> bool: ...


@runtime_checkable
class SyncOperations(Protocol):
    """What an operator does with a sync store: ``get`` the record as stored (expired or
    not), ``delete`` one whoever owns it (``True`` when there was one), create the table
    (safe to repeat), ``check`` the store is usable (``StoreUnavailableError`` if not)."""

    def get(self, key_hash: str) -> Record | None: ...

    def delete(self, key_hash: str) -> bool: ...

    def create_table(self) -> None: ...

    def check(self) -> None: ...


@runtime_checkable
class AsyncOperations(Protocol):
    """:class:`SyncOperations` for an async store."""

    async def aget(self, key_hash: str) -> Record | None: ...

    async def adelete(self, key_hash: str) -> bool: ...

    async def acreate_table(self) -> None: ...

    async def acheck(self) -> None: ...


# -- the deferred completion token ---------------------------------------------------------
#
# A token is ``<key hash>.<owner>.<expires at>``: the stored (hashed) key, the claim's owner
# token that fences the finishing write, and the epoch second the key expires (the request's
# time plus its TTL), which the final response keeps. It names no client key and no scope
# (the key hash is a one-way digest of both), and it is made of letters, digits, ``.`` and
# ``-`` only, so a Step Functions state can split it with ``States.StringSplit``.

_TOKEN = re.compile(r"([0-9a-f]{64})\.([0-9a-f]{1,64}-[0-9a-f]{1,32})\.([0-9]{1,38})")


class DeferredToken(NamedTuple):
    key_hash: str
    owner: str
    expires_at: int


def new_token(key_hash: str, owner: str, expires_at: float) -> str:
    return f"{key_hash}.{owner}.{math.ceil(expires_at)}"


def parse_token(token: object) -> DeferredToken:
    if not isinstance(token, str):
        raise ValueError(f"a deferred completion token is a str, got {type(token).__name__}")
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise ValueError("malformed deferred completion token")
    key_hash, owner, expires_at = match.groups()
    return DeferredToken(key_hash, owner, int(expires_at))


def final_response(status: int, headers: HeaderPairs, body: bytes) -> StoredResponse:
    """The work's final response, checked: ``TypeError``/``ValueError`` naming what is wrong."""
    if not is_status(status):
        raise ValueError(f"status must be an HTTP status code (100-599), got {status!r}")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes, got {type(body).__name__}")
    checked: Headers = []
    for pair in headers:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(part, bytes) for part in pair)
        ):
            raise TypeError(f"headers must be (bytes, bytes) pairs as in ASGI, got {pair!r}")
        checked.append((pair[0].lower(), pair[1]))
    return StoredResponse(status, storable_headers(checked), bytes(body))


def prepare_final(
    token: str, status: int, headers: HeaderPairs, body: bytes, now: float, encryption: object
) -> tuple[DeferredToken, StoredResponse] | None:
    """What every store's ``complete_deferred`` checks before writing: the token
    (``ValueError``), the response and ``encryption`` (``TypeError``/``ValueError``), and
    the token's expiry at ``now`` (``None``: expired, nothing to write)."""
    parsed = parse_token(token)
    response = final_response(status, headers, body)
    check_encryption(encryption)
    if parsed.expires_at <= now:
        return None
    return parsed, response


class PushedChanges(Protocol):
    """What a store that publishes its completions and releases offers its waiters, as its
    ``wakeups`` attribute (``None`` or absent: they poll). ``mark()`` is read before each
    claim; a waiter's pause ends early when its key changed after that mark."""

    def mark(self) -> int: ...

    def wait(self, key: str, mark: int, timeout: float) -> None: ...

    def watch(self, key: str, mark: int) -> Any: ...  # an asyncio.Future of the running loop

    def unwatch(self, key: str, future: Any) -> None: ...


def pushed_changes(store: object) -> PushedChanges | None:
    """The store's ``wakeups``, if it has them."""
    wakeups: PushedChanges | None = getattr(store, "wakeups", None)
    return wakeups
