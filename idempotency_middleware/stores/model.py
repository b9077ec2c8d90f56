"""The store protocol as a small pure model, and a Hypothesis state machine holding a store to it.

``StoreModel`` is the executable definition of what every store answers (``stores/protocol.py``):
a dict of records and the rules of claim, complete (deferred too), release, renew, the deferral
token's ``complete_deferred`` / ``release_deferred``, and the operator's ``get`` / ``delete``.
It does no I/O and reads no clock: every request carries its ``now``.

``check_store_against_model(store_factory)`` runs a store, sync or async, in lockstep with the
model over sequences Hypothesis chooses: claims by several owners, completions, releases and
renewals by live and by fenced owners, deferrals, operator reads and deletes, with time moved
exactly onto (and one tick either side of) every lock expiry, lock plus clock-skew margin, TTL
and token expiry. Every answer is compared field by field. Hypothesis is a test dependency of
this package, not a runtime one: it is imported when a check runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Literal, NamedTuple, TypeVar

from ..testing import FakeClock
from .protocol import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    ClaimResult,
    Completion,
    DeferredToken,
    Held,
    new_token,
    parse_token,
)
from .records import (
    COMPLETED,
    DEFERRED,
    IN_PROGRESS,
    Record,
    StoredResponse,
    deferred_by,
    handed_over,
)

T = TypeVar("T")

Flavour = Literal["sync", "async"]

# One tick: the step taken either side of a deadline. A power of two (as every lock, TTL and
# skew below), so each deadline is exact in binary and in the six decimals DynamoDB keeps.
TICK = 1 / 64
LOCKS = (0.5, 2.0, 5.0)
SKEWS = (0.0, 0.5, 1.0)
TTLS = (1.0, 3.0, 10.0)
STATUSES = (200, 201, 409, 500)
FINGERPRINTS = ("fp-a", "fp-b")
# Sequences start this far apart on the stores' clock, so no record of one is live in the next.
SEQUENCE_GAP = 100_000.0


class StoreModel:
    """The store protocol over a dict: what a store must answer, given the same requests.

    ``max_response_bytes``: the largest body the store keeps (``None``: any); a streamed
    response is never kept. A completion that is not kept still completes its key, with
    ``response_not_stored`` and the body's size, and leaves no earlier body behind.
    """

    def __init__(self, max_response_bytes: int | None = None) -> None:
        self.records: dict[str, Record] = {}
        self.max_response_bytes = max_response_bytes

    def keeps(self, size: int, streamed: bool) -> bool:
        return not streamed and (self.max_response_bytes is None or size <= self.max_response_bytes)

    def claim(self, request: ClaimRequest) -> ClaimResult:
        """Held by a live record; else the key is the claimer's (taken over from a dead
        owner when the record replaced was in progress)."""
        existing = self.records.get(request.key_hash)
        if existing is not None and not existing.is_claimable(
            request.now, request.clock_skew_seconds
        ):
            return Held(existing)
        lock = request.lock_expires_at
        self.records[request.key_hash] = Record(
            request.key_hash, IN_PROGRESS, request.fingerprint, request.owner, lock, lock
        )
        return TAKEN_OVER if existing is not None and existing.status is IN_PROGRESS else CLAIMED

    def complete(self, completion: Completion) -> bool:
        """The owner's record, whatever its status (a second completion: the last wins);
        an interim (deferred) one only over the claim in progress, and done (``True``,
        nothing written) when the key is already deferred or completed. An interim one
        handing the key to another owner (``deferred_to``) writes that owner, and is done
        when it finds the key that owner's and no longer in progress."""
        existing = self.records.get(completion.key_hash)
        if existing is None or existing.owner != completion.owner:
            return handed_over(existing, completion.deferred_to)
        if completion.deferred and existing.status is not IN_PROGRESS:
            return True
        status = DEFERRED if completion.deferred else COMPLETED
        size = completion.body_size
        finished = self._finished(
            existing, status, completion.expires_at, completion.response, size, completion.streamed
        )
        if completion.deferred_to is not None:
            finished = finished._replace(owner=completion.deferred_to)
        self.records[completion.key_hash] = finished
        return True

    def _finished(
        self,
        existing: Record,
        status: Any,
        expires_at: float,
        response: StoredResponse,
        size: int,
        streamed: bool,
    ) -> Record:
        kept = self.keeps(size, streamed)
        return existing._replace(
            status=status,
            expires_at=expires_at,
            response=response if kept else None,
            response_not_stored=not kept,
            response_size=size,
        )

    def _claim_of(self, key_hash: str, owner: str) -> Record | None:
        existing = self.records.get(key_hash)
        if existing is None or existing.owner != owner or existing.status is not IN_PROGRESS:
            return None
        return existing

    def release(self, key_hash: str, owner: str) -> bool:
        """Only the owner's claim still in progress."""
        if self._claim_of(key_hash, owner) is None:
            return False
        del self.records[key_hash]
        return True

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """Only the owner's claim still in progress; its expiry moves with its lock."""
        existing = self._claim_of(key_hash, owner)
        if existing is None:
            return False
        self.records[key_hash] = existing._replace(
            lock_expires_at=lock_expires_at, expires_at=lock_expires_at
        )
        return True

    def complete_deferred(self, token: DeferredToken, response: StoredResponse, now: float) -> bool:
        """The work's final response, by the token of the owner of a key not completed yet
        (deferred, or still in progress), until the token expires (by the store's clock)."""
        existing = self.records.get(token.key_hash)
        if token.expires_at <= now or not deferred_by(existing, token.owner):
            return False
        assert existing is not None
        self.records[token.key_hash] = self._finished(
            existing, COMPLETED, float(token.expires_at), response, len(response.body), False
        )
        return True

    def release_deferred(self, token: DeferredToken) -> bool:
        """Forget a key not completed yet, by its owner's token."""
        if not deferred_by(self.records.get(token.key_hash), token.owner):
            return False
        del self.records[token.key_hash]
        return True

    def get(self, key_hash: str) -> Record | None:
        return self.records.get(key_hash)

    def delete(self, key_hash: str) -> bool:
        return self.records.pop(key_hash, None) is not None


# -- comparing answers ----------------------------------------------------------------------


Compare = Callable[[Record | None, Record | None], list[str]]
"""How a store's record is compared with the model's: the differences, empty if none."""


def record_differences(expected: Record | None, actual: Record | None) -> list[str]:
    """The fields in which a store's record differs from the model's (empty: the same)."""
    if expected is None or actual is None:
        if expected is actual:
            return []
        return [f"record: model {_shown(expected)}, store {_shown(actual)}"]
    return [
        f"{name}: model {_shown(want)}, store {_shown(got)}"
        for name, want, got in zip(Record._fields, expected, actual, strict=True)
        if want != got
    ]


def _shown(value: object) -> str:
    """``value`` for a message: a response's body by its size and digest, not its bytes."""
    if isinstance(value, StoredResponse):
        digest = hashlib.sha256(value.body).hexdigest()[:12]
        return (
            f"StoredResponse({value.status}, {value.headers!r}, <{len(value.body)} bytes {digest}>)"
        )
    if isinstance(value, Record):
        fields = ", ".join(
            f"{name}={_shown(part)}" for name, part in zip(Record._fields, value, strict=True)
        )
        return f"Record({fields})"
    return repr(value)


def claim_differences(
    expected: ClaimResult, actual: object, compare: Compare | None = None
) -> list[str]:
    """How a store's claim answer differs from the model's: the answer's kind, whether it
    took over, or the held record's fields."""
    if type(actual) is not type(expected):
        return [f"answer: model {_shown_claim(expected)}, store {_shown_claim(actual)}"]
    if isinstance(expected, Held):
        assert isinstance(actual, Held)
        return (compare or record_differences)(expected.record, actual.record)
    return [] if actual == expected else [f"taken_over: model {expected!r}, store {actual!r}"]


def _shown_claim(answer: object) -> str:
    return f"Held({_shown(answer.record)})" if isinstance(answer, Held) else repr(answer)


class Disagreement(AssertionError):
    """A store answered a request otherwise than the model."""


def agree(operation: str, differences: list[str]) -> None:
    if differences:
        raise Disagreement(f"{operation}: " + "; ".join(differences))


# -- driving a store, sync or async ---------------------------------------------------------


class Calls:
    """A store's methods called synchronously: as they are (``sync``), or its
    ``a``-prefixed twins run on an event loop of its own (``async``)."""

    def __init__(self, store: Any, flavour: Flavour) -> None:
        self.store = store
        self.prefix = "a" if flavour == "async" else ""
        self.loop = asyncio.new_event_loop() if flavour == "async" else None

    def __call__(self, name: str, *args: Any) -> Any:
        method = getattr(self.store, self.prefix + name)
        if self.loop is None:
            return method(*args)
        return self._run(method(*args))

    def _run(self, awaitable: Coroutine[Any, Any, T]) -> T:
        assert self.loop is not None
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        """Close the store (``close`` / ``aclose`` on its loop, when it has one), then the loop."""
        close = getattr(self.store, self.prefix + "close", None)
        try:
            if close is not None:
                done = close()
                if self.loop is not None:
                    self._run(done)
        finally:
            if self.loop is not None:
                self.loop.close()


# -- the state machine ----------------------------------------------------------------------


class Exploration(NamedTuple):
    """What a check ran: how many sequences, and how many steps in all."""

    sequences: int
    steps: int


class Tally:
    """Counts the sequences and steps a machine class ran."""

    def __init__(self) -> None:
        self.sequences = 0
        self.steps = 0

    def exploration(self) -> Exploration:
        return Exploration(self.sequences, self.steps)


def body_of(size: int, number: int) -> bytes:
    """``size`` bytes that do not compress (a store's compression cannot make a body "too
    large" fit), different for each ``number``."""
    return random.Random(number).randbytes(size)


def _need_hypothesis(what: str) -> None:
    try:
        import hypothesis  # noqa: F401
    except ImportError as error:
        raise ModuleNotFoundError(
            f"{what} needs the hypothesis package, which is not installed: pip install hypothesis",
            name="hypothesis",
        ) from error


def store_model_machine(
    store_factory: Callable[[FakeClock], Any],
    *,
    flavour: Flavour = "sync",
    max_response_bytes: int | None = None,
    too_large_bytes: int | None = None,
    start: float | None = None,
    tally: Tally | None = None,
    compare: Compare = record_differences,
) -> type[Any]:
    """A ``hypothesis.stateful.RuleBasedStateMachine`` class driving the stores that
    ``store_factory(clock)`` makes (one per sequence, on a ``FakeClock`` the machine moves)
    in lockstep with :class:`StoreModel`; run it with ``run_state_machine_as_test`` or as a
    test through its ``TestCase``. See :func:`check_store_against_model` for the options.

    The store must not drop expired records on its own while a sequence runs (turn a purge
    off; a server-side TTL must run well past the deadlines): the model keeps them until a
    claim replaces them, and the protocol lets their owner still finish them.
    """
    _need_hypothesis("store_model_machine")
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

    sizes = _body_sizes(max_response_bytes, too_large_bytes)
    counts = tally if tally is not None else Tally()
    starts = itertools.count(
        float(math.floor(time.time() if start is None else start)), SEQUENCE_GAP
    )
    numbers = itertools.count()

    class StoreModelMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            counts.sequences += 1
            self.clock = FakeClock(next(starts))
            self.model = StoreModel(max_response_bytes)
            self.calls = Calls(store_factory(self.clock), flavour)
            sequence = uuid.uuid4().hex
            self.keys = [hashlib.sha256(f"{sequence}-{n}".encode()).hexdigest() for n in (1, 2)]
            # Owner tokens as the engine makes them (hex, a dash, a counter): a token needs it.
            self.owner_prefix = sequence[:24]
            self.owners: list[tuple[str, str]] = [(key, self._new_owner()) for key in self.keys]
            self.tokens: dict[str, str] = {}  # owner: its attempt's deferral token

        def _new_owner(self) -> str:
            return f"{self.owner_prefix}-{next(numbers):x}"

        @property
        def now(self) -> float:
            return self.clock.now()

        def _step(self) -> None:
            counts.steps += 1

        def _same_record(self, key: str) -> None:
            """After every write: the store holds what the model holds, field by field."""
            agree(f"get({key[:8]})", compare(self.model.get(key), self.calls("get", key)))

        # -- whom a request comes from -----------------------------------------------------

        def _owner(self, data: st.DataObject) -> tuple[str, str]:
            """Mostly a key's current holder (whose requests succeed), else any owner so far:
            a fenced one, one whose claim was held, or one that never claimed."""
            holders = [(key, record.owner) for key, record in self.model.records.items()]
            fenced = data.draw(st.sampled_from((False, False, True)), label="fenced")
            pool = self.owners if fenced or not holders else holders
            drawn: tuple[str, str] = data.draw(st.sampled_from(pool), label="owner")
            return drawn

        def _token(self, data: st.DataObject) -> str:
            """The current holder's deferral token, or any token so far."""
            owner = self._owner(data)[1]
            if owner in self.tokens:
                return self.tokens[owner]
            drawn: str = data.draw(st.sampled_from(list(self.tokens.values())), label="token")
            return drawn

        # -- the requests ----------------------------------------------------------------

        @rule(
            data=st.data(),
            fingerprint=st.sampled_from(FINGERPRINTS),
            lock=st.sampled_from(LOCKS),
            skew=st.sampled_from(SKEWS),
            ttl=st.sampled_from(TTLS),
            later=st.booleans(),
        )
        def claim(
            self,
            data: st.DataObject,
            fingerprint: str,
            lock: float,
            skew: float,
            ttl: float,
            later: bool,
        ) -> None:
            """A new attempt's claim, by a new owner; ``later``: at a deadline first."""
            self._step()
            if later:
                self._advance(data)
            key = data.draw(st.sampled_from(self.keys), label="key")
            owner = self._new_owner()
            request = ClaimRequest(key, fingerprint, owner, self.now, lock, skew)
            expected = self.model.claim(request)
            agree(
                f"claim {request}",
                claim_differences(expected, self.calls("claim", request), compare),
            )
            self.owners.append((key, owner))
            # The token a handler of this attempt would get from defer_completion().
            self.tokens[owner] = new_token(key, owner, self.now + ttl)
            self._same_record(key)

        @rule(
            data=st.data(),
            ttl=st.sampled_from(TTLS),
            status=st.sampled_from(STATUSES),
            size=st.sampled_from(sizes),
            streamed=st.booleans(),
            deferred=st.booleans(),
        )
        def complete(
            self,
            data: st.DataObject,
            ttl: float,
            status: int,
            size: int,
            streamed: bool,
            deferred: bool,
        ) -> None:
            self._step()
            key, owner = self._owner(data)
            completion = self._completion(key, owner, ttl, status, size, streamed, deferred)
            if deferred and data.draw(st.booleans(), label="handed over"):
                # A takeover adopting the work an earlier owner's dead process started.
                to = self._earlier_owner(data, key, owner, ttl)
                completion = completion._replace(deferred_to=to)
            expected = self.model.complete(completion)
            actual = self.calls("complete", completion)
            agree(f"complete by {owner} ({_described(completion)})", _answers(expected, actual))
            self._same_record(key)

        def _earlier_owner(self, data: st.DataObject, key: str, owner: str, ttl: float) -> str:
            """Another owner of ``key`` with a deferral token (one made now if none)."""
            earlier = [o for k, o in self.owners if k == key and o != owner and o in self.tokens]
            if earlier:
                drawn: str = data.draw(st.sampled_from(earlier), label="handed to")
                return drawn
            fresh = self._new_owner()
            self.owners.append((key, fresh))
            self.tokens[fresh] = new_token(key, fresh, self.now + ttl)
            return fresh

        def _completion(
            self,
            key: str,
            owner: str,
            ttl: float,
            status: int,
            size: int,
            streamed: bool,
            deferred: bool,
        ) -> Completion:
            number = next(numbers)
            headers = [(b"content-type", b"application/octet-stream"), (b"x-n", b"%d" % number)]
            if streamed:
                response = StoredResponse(200, [(b"content-type", b"text/event-stream")], b"")
                return Completion(key, owner, self.now, ttl, response, True, size, (), deferred)
            response = StoredResponse(status, headers, body_of(size, number))
            return Completion(key, owner, self.now, ttl, response, deferred=deferred)

        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            self._step()
            key, owner = self._owner(data)
            expected = self.model.release(key, owner)
            agree(f"release by {owner}", _answers(expected, self.calls("release", key, owner)))
            self._same_record(key)

        @rule(data=st.data(), lock=st.sampled_from(LOCKS))
        def renew(self, data: st.DataObject, lock: float) -> None:
            self._step()
            key, owner = self._owner(data)
            until = self.now + lock
            expected = self.model.renew(key, owner, until)
            actual = self.calls("renew", key, owner, until)
            agree(f"renew by {owner} until {until}", _answers(expected, actual))
            self._same_record(key)

        @precondition(lambda self: bool(self.tokens))
        @rule(
            data=st.data(),
            done=st.booleans(),
            status=st.sampled_from(STATUSES),
            size=st.sampled_from(sizes),
        )
        def finish_deferral(self, data: st.DataObject, done: bool, status: int, size: int) -> None:
            """A deferral's worker: the final response by token (``done``), or forgetting
            the key (the work did not happen)."""
            self._step()
            token = self._token(data)
            parsed = parse_token(token)
            if done:
                number = next(numbers)
                response = StoredResponse(
                    status, [(b"x-final", b"%d" % number)], body_of(size, number)
                )
                expected = self.model.complete_deferred(parsed, response, self.now)
                actual = self.calls(
                    "complete_deferred", token, status, response.headers, response.body
                )
                agree(f"complete_deferred({token}, size {size})", _answers(expected, actual))
            else:
                expected = self.model.release_deferred(parsed)
                actual = self.calls("release_deferred", token)
                agree(f"release_deferred({token})", _answers(expected, actual))
            self._same_record(parsed.key_hash)

        @rule(data=st.data())
        def delete(self, data: st.DataObject) -> None:
            """The operator's delete, whoever holds the key (reads follow every write)."""
            self._step()
            key = data.draw(st.sampled_from(self.keys), label="key")
            expected = self.model.delete(key)
            agree(f"delete({key[:8]})", _answers(expected, self.calls("delete", key)))
            self._same_record(key)

        # -- time ------------------------------------------------------------------------

        @rule(data=st.data())
        def advance(self, data: st.DataObject) -> None:
            self._step()
            self._advance(data)

        def _advance(self, data: st.DataObject) -> None:
            """Move to a deadline, or one tick either side of it: a lock's expiry, that
            plus each skew margin, a record's expiry, a token's expiry."""
            targets = _moments(self.model.records.values(), self.tokens.values(), self.now)
            target = data.draw(st.sampled_from(targets), label="time")
            self.clock.advance(target - self.now)

        def teardown(self) -> None:
            try:
                for key in self.keys:
                    self._same_record(key)
            finally:
                self.calls.close()

    return StoreModelMachine


def _body_sizes(max_response_bytes: int | None, too_large_bytes: int | None) -> list[int]:
    """The body sizes the machine completes with: empty, small, and (with a limit) the
    largest kept and the smallest never kept."""
    if max_response_bytes is None:
        return [0, 7]
    too_large = max_response_bytes + 1 if too_large_bytes is None else too_large_bytes
    if too_large <= max_response_bytes:
        raise ValueError("too_large_bytes must be over max_response_bytes")
    return [0, 7, max_response_bytes, too_large]


def _moments(records: Any, tokens: Iterable[str], now: float) -> list[float]:
    deadlines = [now + 1.0]
    for record in records:
        deadlines.append(record.expires_at)
        if record.status is IN_PROGRESS:
            deadlines.extend(record.lock_expires_at + skew for skew in SKEWS)
    deadlines.extend(float(parse_token(token).expires_at) for token in tokens)
    around = {deadline + step for deadline in deadlines for step in (-TICK, 0.0, TICK)}
    return sorted(moment for moment in around if moment > now)


def _answers(expected: bool, actual: object) -> list[str]:
    return [] if actual is expected else [f"model {expected!r}, store {actual!r}"]


def _described(completion: Completion) -> str:
    kind = "deferred" if completion.deferred else "final"
    if completion.deferred_to is not None:
        kind += f" handed to {completion.deferred_to}"
    streamed = "streamed " if completion.streamed else ""
    return f"{kind}, {streamed}{completion.body_size} bytes, ttl {completion.ttl_seconds}"


def check_store_against_model(
    store_factory: Callable[[FakeClock], Any],
    *,
    flavour: Flavour = "sync",
    max_response_bytes: int | None = None,
    too_large_bytes: int | None = None,
    max_examples: int = 50,
    steps: int = 30,
    start: float | None = None,
    compare: Compare = record_differences,
) -> Exploration:
    """Run the stores ``store_factory(clock)`` makes against :class:`StoreModel` over
    ``max_examples`` sequences of up to ``steps`` requests each, chosen by Hypothesis from a
    fixed seed (the same sequences each run); ``Disagreement`` (an ``AssertionError``) with
    the shortest failing sequence Hypothesis finds, else how much it explored.

    ``flavour``: call the store's sync methods, or its ``a``-prefixed ones on an event loop
    (a new one per sequence; the store is closed on it after). ``max_response_bytes``: the
    largest body the store keeps (``None``: any); ``too_large_bytes``: the smallest it never
    keeps, when its limit is not on the body alone (DynamoDB's is on the encoded item).
    ``start``: the clock's first time (default: now), each sequence far after the last.
    ``compare(expected, actual)``: the differences between the model's record of a key and
    the store's, read after every write (default: :func:`record_differences`, every field).
    The factory is called once per sequence; it may return the same store each time
    (every sequence uses keys of its own), which is closed after each and used again.
    """
    _need_hypothesis("check_store_against_model")
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    tally = Tally()
    machine = store_model_machine(
        store_factory,
        flavour=flavour,
        max_response_bytes=max_response_bytes,
        too_large_bytes=too_large_bytes,
        start=start,
        tally=tally,
        compare=compare,
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,
            database=None,
            # (Not the explain phase: it reruns the failing sequence many times to name the
            # lines only failures ran, which the sequence itself already shows.)
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
    return tally.exploration()


__all__ = [
    "Compare",
    "Disagreement",
    "Exploration",
    "Flavour",
    "StoreModel",
    "check_store_against_model",
    "claim_differences",
    "record_differences",
    "store_model_machine",
]
