"""The store kit: what every store shares, written once (the "Writing a store" page).

A backend writes :class:`Operations` (one *flow* per store operation: a generator that
yields requests and returns the result, no I/O), a :class:`Transport` (runs flows sync and
async; its failures become :class:`StoreUnavailable`) and a :class:`KitStore`, which writes
every public method once over those. :class:`LoopLocal` keeps per-event-loop clients.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, Protocol, TypeVar

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import FIXES, IdempotencyError
from ..events import OnEvent
from .breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD, BreakerOwner, CircuitBreaker
from .encryption import Encryption, seal_final
from .observers import StoreObservers, ended
from .protocol import (
    ClaimRequest,
    ClaimResult,
    Completion,
    DeferredToken,
    HeaderPairs,
    StoreUnavailable,
    parse_token,
    prepare_final,
)
from .records import Record, StoredResponse, encode_response
from .wakeups import Wakeups

T = TypeVar("T")
V = TypeVar("V")
Self = TypeVar("Self", bound="ClosingStore")

logger = logging.getLogger(__name__)

Flow = Generator[Any, Any, T]
"""One store operation: yields requests, receives replies, returns the result."""


def require_modules(store: str, modules: tuple[str, ...], extra: str) -> None:
    """Fail at a store's construction, naming the extra that installs them, when its client
    libraries are missing (rather than with a bare ``ModuleNotFoundError`` at first use).
    Looked up, not imported: the import itself waits for the first connection."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # an import hook refusing it
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"{store} needs {module}, which is not installed: "
                f'pip install "idempotency-middleware[{extra}]"',
                name=module,
            )


# -- running flows ------------------------------------------------------------------------


def drive(flow: Flow[T], send: Callable[[Any], Any]) -> T:
    """Run ``flow``, sending each request with ``send``; a failure of ``send`` is thrown
    into the flow at its ``yield`` (a failed condition may be the answer it expects)."""
    try:
        request = next(flow)
        while True:
            try:
                reply = send(request)
            except Exception as error:
                request = flow.throw(error)
            else:
                request = flow.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


async def adrive(flow: Flow[T], send: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`drive` with an awaitable ``send``."""
    try:
        request = next(flow)
        while True:
            try:
                reply = await send(request)
            except Exception as error:
                request = flow.throw(error)
            else:
                request = flow.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


class Transport(Protocol):
    """Runs a backend's flows; ``operation`` names the store operation in its errors."""

    def run(self, operation: str, flow: Flow[T]) -> T: ...

    async def arun(self, operation: str, flow: Flow[T]) -> T: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


class Operations(Protocol):
    """A backend's flows, one per store operation (the store protocol says what each must
    guarantee). A backend without deferral sets ``supports_deferral = False``; one may add
    a read-only ``check()`` flow (else :meth:`KitStore.check` reads an unused key)."""

    supports_deferral: bool

    def claim(self, request: ClaimRequest) -> Flow[ClaimResult]: ...

    def complete(self, completion: Completion) -> Flow[bool]: ...

    def release(self, key_hash: str, owner: str) -> Flow[bool]: ...

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> Flow[bool]: ...

    def complete_final(
        self, token: DeferredToken, response: StoredResponse, now: float
    ) -> Flow[bool]: ...

    def release_unfinished(self, token: DeferredToken) -> Flow[bool]: ...

    def get(self, key_hash: str) -> Flow[Record | None]: ...

    def delete(self, key_hash: str) -> Flow[bool]: ...

    def create_table(self) -> Flow[None]: ...


# -- what backends' operations and error maps share ---------------------------------------


def kept_blob(
    response: StoredResponse, streamed: bool, limit: int | None, largest: int
) -> bytes | None:
    """The encoded response to keep, or ``None``: the key completes without it when it was
    streamed, its body is over ``limit`` (``max_response_bytes``), or its encoding is over
    the ``largest`` value the backend can store."""
    if streamed or (limit is not None and len(response.body) > limit):
        return None
    blob = encode_response(response)
    return blob if len(blob) <= largest else None


class PurgeSchedule:
    """When the purge riding on writes is due: at most once per ``interval`` seconds
    (``None``: never) per process, by ``clock``; the first write of a process purges, and
    the write after a full batch (``batch_size`` rows) continues at once."""

    def __init__(self, interval: float | None, batch_size: int, clock: Clock) -> None:
        self.interval, self.batch_size, self._clock = interval, batch_size, clock
        self._lock = threading.Lock()
        self._next = 0.0

    def due(self) -> bool:
        if self.interval is None:
            return False
        with self._lock:
            tick = self._clock.now()
            if tick < self._next:
                return False
            self._next = tick + self.interval
            return True

    def purged(self, deleted: int, log: logging.Logger) -> None:
        if deleted >= self.batch_size:
            with self._lock:
                self._next = 0.0  # more to delete: the next write continues
        if deleted:
            log.debug("purged %d expired idempotency records", deleted)


def purge_all(batch: object, batch_size: int, count: Callable[[Any], int]) -> Flow[int]:
    """Send ``batch`` (one bounded delete; ``count`` reads its reply's row count) until one
    is not full, so other writers are never locked out for long; the total."""
    total = 0
    while True:
        deleted = count((yield batch))
        total += deleted
        if deleted < batch_size:
            return total


# What RuntimeError says when an asyncio client (aiohttp's, redis-py's) is used off the
# event loop it was made on, or after that loop closed.
CLOSED_LOOP = "Event loop is closed"
LOOP_MESSAGES = (CLOSED_LOOP, "different loop", "different event loop")


def off_its_loop(error: object, *more: str) -> bool:
    """Whether ``error`` is a client's RuntimeError about its event loop (or says ``more``)."""
    message = str(error)
    return isinstance(error, RuntimeError) and any(
        part in message for part in (*LOOP_MESSAGES, *more)
    )


# -- the store ----------------------------------------------------------------------------

# The key the default check reads: no claim makes it (claims use hex digests).
UNUSED_KEY = "store-check"


def unusable(store: object, error: StoreUnavailable) -> StoreUnavailable:
    """``error`` as a failed check says it: which store, why, and the fix (the store's own,
    naming its table or file, when it has ``fix_for``)."""
    fix_for = getattr(store, "fix_for", None)
    fix = fix_for(error.cause) if callable(fix_for) else FIXES.get(error.cause, "")
    message = f"{type(store).__name__} is not usable: {error.reason}" + (f"; {fix}" if fix else "")
    return StoreUnavailable(
        message,
        code=error.code,
        cause=error.cause,
        reason=error.reason,
        fix=fix if error.misconfigured else "",
    )


class ClosingStore:
    """Both context managers: ``close()`` after ``with``, ``await aclose()`` after
    ``async with``."""

    def close(self) -> None:  # pragma: no cover - every store defines its own
        raise NotImplementedError

    async def aclose(self) -> None:  # pragma: no cover - every store defines its own
        raise NotImplementedError

    def __enter__(self: Self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self: Self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class KitStore(ClosingStore, BreakerOwner):
    """Every public store method, written once over a backend's ``ops`` and ``transport``
    (what each does: protocol.py). The circuit breaker counts every operation, as the
    Circuit breaker page of the documentation says; only claims wait for it.

    ``kind`` names the store in metrics (``"redis"``...); ``on_event`` is the store's own
    hooks (``observers.StoreObservers``), which see every call run through the kit.
    """

    kind = "store"

    def __init__(
        self,
        ops: Operations,
        transport: Transport,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        on_event: OnEvent = None,
    ) -> None:
        self.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown_seconds, clock)
        self.observers = StoreObservers(self.kind, self.breaker, on_event)
        self._ops = ops
        self._transport = transport
        self.clock = clock
        # Set by a backend that publishes its completions and releases (wakeups.py).
        self.wakeups: Wakeups | None = None

    def fix_for(self, cause: str) -> str:
        """What fixes a misconfiguration of ``cause`` (``errors.FIXES``), for this store: a
        backend names what it was missing (its table, file, database) where it knows it."""
        return FIXES.get(cause, "")

    def _failed(self, error: Exception) -> None:
        if isinstance(error, StoreUnavailable):
            if error.misconfigured:
                # Said where every door reads it: the 503's log line, a function's exception.
                error.fix = self.fix_for(error.cause) or error.fix
            self.breaker.failed(error)
        elif isinstance(error, IdempotencyError):
            self.breaker.succeeded()  # refused as written: an answer

    def run_flow(self, operation: str, flow: Flow[T]) -> T:
        """Run ``flow`` on this store's transport, its failure counted by the breaker. For
        code written over the same backend (the one-time actions' backends, a backend's own
        operations such as ``create_table``): ``operation`` names it in errors and events,
        and to the store's observers."""
        ends = self.observers.started(operation) if self.observers.observers else ()
        try:
            result = self._transport.run(operation, flow)
        except BaseException as error:
            if isinstance(error, Exception):
                self._failed(error)
            ended(ends, error)
            raise
        self.breaker.succeeded()
        ended(ends, None)
        return result

    async def arun_flow(self, operation: str, flow: Flow[T]) -> T:
        """``run_flow`` on the async transport."""
        ends = self.observers.started(operation) if self.observers.observers else ()
        try:
            result = await self._transport.arun(operation, flow)
        except BaseException as error:
            if isinstance(error, Exception):
                self._failed(error)
            ended(ends, error)
            raise
        self.breaker.succeeded()
        ended(ends, None)
        return result

    def _admit(self) -> bool:
        """The breaker's ``admit``; a claim it refuses starts a background probe (see
        ``breaker.py``), so the breaker closes as soon as the store answers again. The probe
        runs on a thread of its own through the sync transport, for async claims too: on
        the claims' event loop it would compete with the requests the breaker is refusing
        fast (a store with no sync client is not probed; its breaker waits its cool-down)."""
        try:
            return self.breaker.admit()
        except StoreUnavailable:
            if self.breaker.background_probe_due():
                threading.Thread(
                    target=self._probe, name="idempotency-breaker-probe", daemon=True
                ).start()
            raise

    def _probe(self) -> None:
        try:
            self._transport.run("check", self._check_flow())
        except Exception as error:
            logger.debug("circuit breaker probe failed: %r", error)
        else:
            self.breaker.succeeded()
        finally:
            self.breaker.background_probe_ended()

    def claim(self, request: ClaimRequest) -> ClaimResult:
        if self._admit():  # the half-open breaker's probe
            try:
                return self.run_flow("claim", self._ops.claim(request))
            finally:
                self.breaker.end_probe()
        return self.run_flow("claim", self._ops.claim(request))

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        if self._admit():
            try:
                return await self.arun_flow("claim", self._ops.claim(request))
            finally:
                self.breaker.end_probe()
        return await self.arun_flow("claim", self._ops.claim(request))

    def complete(self, completion: Completion) -> bool:
        return self.run_flow("complete", self._ops.complete(completion))

    async def acomplete(self, completion: Completion) -> bool:
        return await self.arun_flow("complete", self._ops.complete(completion))

    def release(self, key_hash: str, owner: str) -> bool:
        return self.run_flow("release", self._ops.release(key_hash, owner))

    async def arelease(self, key_hash: str, owner: str) -> bool:
        return await self.arun_flow("release", self._ops.release(key_hash, owner))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return self.run_flow("renew", self._ops.renew(key_hash, owner, lock_expires_at))

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return await self.arun_flow("renew", self._ops.renew(key_hash, owner, lock_expires_at))

    def _deferrals(self) -> Operations:
        if not self._ops.supports_deferral:
            raise NotImplementedError(f"{type(self).__name__} does not support deferred completion")
        return self._ops

    def _final(
        self, token: str, status: int, headers: HeaderPairs, body: bytes, encryption: Any
    ) -> Flow[bool] | None:
        ops, now = self._deferrals(), self.clock.now()
        prepared = prepare_final(token, status, headers, body, now, encryption)
        if prepared is None:
            return None  # expired: nothing to write
        if encryption is None:
            return ops.complete_final(*prepared, now)
        return _sealed_final(ops, *prepared, now, encryption)

    def _unfinished(self, token: str) -> Flow[bool]:
        return self._deferrals().release_unfinished(parse_token(token))

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: HeaderPairs = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool:
        flow = self._final(token, status, headers, body, encryption)
        return False if flow is None else self.run_flow("complete_deferred", flow)

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: HeaderPairs = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool:
        flow = self._final(token, status, headers, body, encryption)
        return False if flow is None else await self.arun_flow("complete_deferred", flow)

    def release_deferred(self, token: str) -> bool:
        return self.run_flow("release_deferred", self._unfinished(token))

    async def arelease_deferred(self, token: str) -> bool:
        return await self.arun_flow("release_deferred", self._unfinished(token))

    def get(self, key_hash: str) -> Record | None:
        return self.run_flow("get", self._ops.get(key_hash))

    async def aget(self, key_hash: str) -> Record | None:
        return await self.arun_flow("get", self._ops.get(key_hash))

    def delete(self, key_hash: str) -> bool:
        return self.run_flow("delete", self._ops.delete(key_hash))

    async def adelete(self, key_hash: str) -> bool:
        return await self.arun_flow("delete", self._ops.delete(key_hash))

    def create_table(self) -> None:
        self.run_flow("create_table", self._ops.create_table())

    async def acreate_table(self) -> None:
        await self.arun_flow("create_table", self._ops.create_table())

    def _check_flow(self) -> Flow[object]:
        check = getattr(self._ops, "check", None)
        return check() if check is not None else self._ops.get(UNUSED_KEY)

    def check(self) -> None:
        """Check that the store is usable, reading only: the table exists with the key (and
        TTL) the store expects, the credentials are accepted, the SQLite file can be
        written, the server answers. For a health check, or at start-up (the middlewares'
        ``check_store=True``). It neither waits for nor counts in the circuit breaker.

        Raises:
            StoreUnavailableError: the store is not usable; ``cause`` and ``reason`` say
                why, the message also says what to fix (``"no_table"``: create it).

        Example:
            ``store.check()``, or ``await store.acheck()``: ``None`` when usable, else
            ``StoreUnavailableError: DynamoDBStore is not usable: no such table
            'idempotency'; create it: store.create_table(), ...``
        """
        try:
            self._transport.run("check", self._check_flow())
        except StoreUnavailable as error:
            raise unusable(self, error) from error

    async def acheck(self) -> None:
        """``check()``, awaited: for the async stores (``AsyncDynamoDBStore``, and the rest).

        Raises:
            StoreUnavailableError: as ``check()`` does.
        """
        try:
            await self._transport.arun("check", self._check_flow())
        except StoreUnavailable as error:
            raise unusable(self, error) from error

    def close(self) -> None:
        """Release the store's connections; using it again reconnects."""
        if self.wakeups is not None:
            self.wakeups.close()
        self._transport.close()

    async def aclose(self) -> None:
        """Release the running event loop's connections, and stop listening for pushed
        changes (``close()`` does both too); using it again reconnects."""
        if self.wakeups is not None:
            await self.wakeups.aclose()
        await self._transport.aclose()


def _sealed_final(
    ops: Operations,
    token: DeferredToken,
    response: StoredResponse,
    now: float,
    encryption: Encryption,
) -> Flow[bool]:
    """A deferral's final response sealed with ``encryption``: one read first, for the
    fingerprint the seal is bound to (see ``protocol.seal_final``)."""
    sealed = seal_final((yield from ops.get(token.key_hash)), token, response, encryption)
    return False if sealed is None else (yield from ops.complete_final(token, sealed, now))


# -- per-event-loop clients ---------------------------------------------------------------

# Bare yields a coroutine closing without a loop may make (aiobotocore's client makes one).
_STEPS_WITHOUT_LOOP = 100


def finish_without_loop(closing: Coroutine[Any, Any, Any]) -> bool:
    """Run ``closing`` to its end with no event loop; whether it got there.

    A client whose loop is closed can often still be closed without I/O (aiohttp only marks
    its session closed; a pool closes its sockets), by a coroutine that only yields bare
    ``None``s: those are stepped through here. A coroutine that waits for a real future (or
    raises) needs its loop, and is abandoned.
    """
    for _ in range(_STEPS_WITHOUT_LOOP):
        try:
            if closing.send(None) is not None:
                break
        except StopIteration:
            return True
        except Exception as error:
            logger.debug("closing a client of a closed event loop failed: %r", error)
            return False
    closing.close()
    return False


class _Entry(Generic[V]):
    """One event loop's value, and the watcher that closes it when the loop ends."""

    __slots__ = ("dropped", "loop", "ready", "value", "watcher")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.value: V | None = None
        # Set while the value is being made: the loop's other callers wait for it.
        self.ready: asyncio.Future[None] | None = loop.create_future()
        self.watcher: AsyncGenerator[None, None] | None = None
        self.dropped = False  # closed, or given up with its loop


class LoopLocal(Generic[V]):
    """One value per event loop (a client, a pool): made on the loop's first :meth:`get`
    by ``make``, and closed by ``close`` on that loop when the loop shuts down its async
    generators (``asyncio.run`` does), or by :meth:`aclose` on it.

    A loop closed without either leaves its value behind; the next :meth:`get` on any loop
    (or :meth:`release_closed_loops`) hands it to ``abandon``, which must not need the loop
    (see :func:`finish_without_loop`). Thread-safe: loops may run on several threads.
    """

    def __init__(
        self,
        make: Callable[[], Awaitable[V]],
        close: Callable[[V], Awaitable[object]],
        abandon: Callable[[V], object] | None = None,
    ) -> None:
        self._make = make
        self._close = close
        self._abandon = abandon
        self._entries: dict[asyncio.AbstractEventLoop, _Entry[V]] = {}
        self._lock = threading.Lock()
        # The last loop's entry: the usual single loop costs one comparison per call.
        self._current: _Entry[V] | None = None

    async def get(self) -> V:
        current = self._current
        if current is not None and current.loop is asyncio.get_running_loop():
            return current.value  # type: ignore[return-value]  # ready: set before current
        return await self._get_slowly()

    async def _get_slowly(self) -> V:
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._entries.get(loop)
            fresh = entry is None
            if entry is None:
                entry = self._entries[loop] = _Entry(loop)
        self.release_closed_loops()
        ready = entry.ready
        if not fresh:
            if ready is not None:
                # Another task of this loop is making it: wait for that, then look again
                # (a failed make left nothing behind, and this task tries for itself).
                await asyncio.wait([ready])
                return await self.get()
            self._current = entry
            return entry.value  # type: ignore[return-value]
        assert ready is not None
        try:
            entry.value = await self._make()
        except BaseException:
            self._forget(entry)
            raise
        finally:
            entry.ready = None
            ready.set_result(None)
        watcher = self._until_loop_ends(entry)
        entry.watcher = watcher
        await watcher.__anext__()  # runs to its yield at once
        self._current = entry
        return entry.value

    async def _until_loop_ends(self, entry: _Entry[V]) -> AsyncGenerator[None, None]:
        # An async generator left suspended for the loop's lifetime: the loop closes it
        # before it closes (shutdown_asyncgens), the last moment the value can be closed on
        # it. asyncio has no other hook for a loop's end.
        try:
            yield
        finally:
            if not entry.dropped:
                entry.dropped = True
                self._forget(entry)
                await self._close(entry.value)  # type: ignore[arg-type]

    def _forget(self, entry: _Entry[V]) -> None:
        with self._lock:
            if self._entries.get(entry.loop) is entry:
                del self._entries[entry.loop]
            if self._current is entry:
                self._current = None

    def release_closed_loops(self) -> None:
        """Hand the values of loops closed without closing them to ``abandon``: nothing can
        run on those loops any more."""
        with self._lock:
            ended = [entry for loop, entry in self._entries.items() if loop.is_closed()]
            for entry in ended:
                del self._entries[entry.loop]
                if self._current is entry:
                    self._current = None
        for entry in ended:
            entry.dropped = True
            if self._abandon is not None and entry.ready is None:
                self._abandon(entry.value)  # type: ignore[arg-type]
            if entry.watcher is not None:
                finish_without_loop(entry.watcher.aclose())

    async def aclose(self) -> None:
        """Close the running loop's value, if it has one; the next :meth:`get` makes another."""
        with self._lock:
            entry = self._entries.get(asyncio.get_running_loop())
        self.release_closed_loops()
        if entry is None or entry.dropped or entry.watcher is None:
            return
        await entry.watcher.aclose()  # forgets the value and closes it

    def values(self) -> list[V]:
        with self._lock:
            return [entry.value for entry in self._entries.values() if entry.ready is None]  # type: ignore[misc]
