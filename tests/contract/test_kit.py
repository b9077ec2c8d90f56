"""The store kit itself: running flows, ``KitStore``'s shared methods (breaker accounting, the
half-open probe, deferred token checks) and ``LoopLocal``'s per-event-loop values.

The whole contract of a store written on the kit is in ``test_store_contract.py`` (the ``kv``
kinds run ``examples/kv_store.py`` through it); these are the kit's own guarantees.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from examples.kv_store import KeyValueOps, KeyValueStore
from idempotency_middleware.errors import IdempotencyError, TransactionConflictError
from idempotency_middleware.stores import CLAIMED, ClaimRequest
from idempotency_middleware.stores.kit import Flow, KitStore, LoopLocal, adrive, drive
from idempotency_middleware.stores.protocol import StoreUnavailable, new_token
from idempotency_middleware.stores.records import StoredResponse
from idempotency_middleware.testing import FakeClock

NOW = 1_800_000_000.0
KEY = "a" * 64


def claim_request(owner: str = "0a-1", now: float = NOW) -> ClaimRequest:
    return ClaimRequest(KEY, "fp", owner, now, 60.0)


# -- drive ----------------------------------------------------------------------------------


def asking_twice() -> Flow[list[Any]]:
    replies = [(yield "first")]
    try:
        replies.append((yield "second"))
    except KeyError as error:
        replies.append(f"caught {error.args[0]}")
    return replies


def test_drive_sends_each_request_and_returns_the_flows_result() -> None:
    assert drive(asking_twice(), str.upper) == ["FIRST", "SECOND"]


def test_drive_throws_a_failed_send_into_the_flow_at_its_yield() -> None:
    def send(request: str) -> str:
        if request == "second":
            raise KeyError("no second")
        return request

    assert drive(asking_twice(), send) == ["first", "caught no second"]


def test_a_failure_the_flow_does_not_catch_propagates() -> None:
    def send(request: str) -> str:
        raise ValueError(request)

    with pytest.raises(ValueError, match="first"):
        drive(asking_twice(), send)


async def test_adrive_awaits_each_send() -> None:
    async def send(request: str) -> str:
        await asyncio.sleep(0)
        return request * 2

    assert await adrive(asking_twice(), send) == ["firstfirst", "secondsecond"]


# -- KitStore -------------------------------------------------------------------------------


class SwitchedTransport:
    """Runs flows like the kv example's transport, or fails every call as told."""

    def __init__(self, store: KeyValueStore) -> None:
        self.inner = store._transport
        self.failure: Exception | None = None

    def run(self, operation: str, flow: Flow[Any]) -> Any:
        if self.failure is not None:
            flow.close()
            raise self.failure
        return self.inner.run(operation, flow)

    async def arun(self, operation: str, flow: Flow[Any]) -> Any:
        return self.run(operation, flow)

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def switched(clock: FakeClock) -> Iterator[tuple[KitStore, SwitchedTransport]]:
    transport = SwitchedTransport(KeyValueStore())
    store = KitStore(
        KeyValueOps(None), transport, clock=clock, breaker_threshold=2, breaker_cooldown_seconds=5
    )
    with store:
        yield store, transport


def outage() -> StoreUnavailable:
    return StoreUnavailable("down", cause="unreachable", reason="connection refused")


def test_outages_open_the_breaker_and_an_open_breaker_refuses_claims_without_a_call(
    switched: tuple[KitStore, SwitchedTransport],
) -> None:
    store, transport = switched
    transport.failure = outage()
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            store.claim(claim_request())
    assert store.breaker_state == "open"
    transport.failure = AssertionError("an open breaker must not call the store")
    with pytest.raises(StoreUnavailable) as refused:
        store.claim(claim_request())
    assert refused.value.cause == "breaker_open"


def test_an_answer_refused_as_written_counts_as_the_store_answering(
    switched: tuple[KitStore, SwitchedTransport],
) -> None:
    store, transport = switched
    transport.failure = outage()
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request())
    transport.failure = TransactionConflictError("no", position=0, reason="ConditionalCheckFailed")
    with pytest.raises(IdempotencyError):
        store.complete_deferred(new_token(KEY, "0a-1", NOW + 60), 200)
    transport.failure = outage()
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request())
    assert store.breaker_state == "closed"  # the count started again after the answer


def test_the_half_open_probe_closes_the_breaker_when_the_store_answers(
    switched: tuple[KitStore, SwitchedTransport], clock: FakeClock
) -> None:
    store, transport = switched
    transport.failure = outage()
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            store.claim(claim_request())
    clock.advance(5)
    transport.failure = None
    assert store.claim(claim_request()) == CLAIMED
    assert store.breaker_state == "closed"


async def test_a_failed_async_probe_opens_the_breaker_again(
    switched: tuple[KitStore, SwitchedTransport], clock: FakeClock
) -> None:
    store, transport = switched
    transport.failure = outage()
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            await store.aclaim(claim_request())
    clock.advance(5)
    with pytest.raises(StoreUnavailable):
        await store.aclaim(claim_request())  # the probe
    assert store.breaker_state == "open"


def test_deferred_tokens_are_checked_before_any_call(
    switched: tuple[KitStore, SwitchedTransport], clock: FakeClock
) -> None:
    store, transport = switched
    transport.failure = AssertionError("a bad or expired token must not reach the store")
    with pytest.raises(ValueError, match="malformed"):
        store.complete_deferred("not-a-token", 200)
    with pytest.raises(ValueError, match="malformed"):
        store.release_deferred("not-a-token")
    with pytest.raises(ValueError, match="status"):
        store.complete_deferred(new_token(KEY, "0a-1", NOW + 60), 99)
    assert store.complete_deferred(new_token(KEY, "0a-1", NOW), 200) is False  # expired


async def test_async_deferred_methods_finish_a_deferred_key(clock: FakeClock) -> None:
    store = KitStore(KeyValueOps(None), KeyValueStore()._transport, clock=clock)
    claim = claim_request()
    assert await store.aclaim(claim) == CLAIMED
    token = new_token(KEY, claim.owner, NOW + 60)
    assert await store.acomplete_deferred(token, 200, [(b"x-done", b"1")], b"done") is True
    record = await store.aget(KEY)
    assert record is not None
    assert record.response == StoredResponse(200, [(b"x-done", b"1")], b"done")
    assert await store.arelease_deferred(token) is False  # completed: nothing to release


def test_a_store_without_deferral_says_so() -> None:
    class NoDeferral(KeyValueOps):
        supports_deferral = False

    store = KitStore(NoDeferral(None), KeyValueStore()._transport)
    with pytest.raises(NotImplementedError, match="KitStore does not support deferred"):
        store.complete_deferred(new_token(KEY, "0a-1", NOW + 60), 200)
    with pytest.raises(NotImplementedError):
        store.release_deferred(new_token(KEY, "0a-1", NOW + 60))


# -- LoopLocal ------------------------------------------------------------------------------


class Resource:
    """Stands in for a client: counts its closes, and how."""

    made = 0

    def __init__(self) -> None:
        Resource.made += 1
        self.number = Resource.made
        self.closed = 0
        self.abandoned = 0


class Resources:
    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.made: list[Resource] = []
        self.local: LoopLocal[Resource] = LoopLocal(self.make, self.close, self.abandon)

    async def make(self) -> Resource:
        await asyncio.sleep(0)  # other tasks of the loop ask meanwhile
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("cannot connect")
        resource = Resource()
        self.made.append(resource)
        return resource

    async def close(self, resource: Resource) -> None:
        resource.closed += 1

    def abandon(self, resource: Resource) -> None:
        resource.abandoned += 1


def test_one_value_per_loop_made_once_however_many_tasks_ask_first() -> None:
    resources = Resources()

    async def main() -> list[Resource]:
        return list(await asyncio.gather(*(resources.local.get() for _ in range(5))))

    got = asyncio.run(main())
    assert len(resources.made) == 1
    assert all(value is resources.made[0] for value in got)


def test_a_value_is_closed_on_its_loop_when_asyncio_run_ends() -> None:
    resources = Resources()
    first = asyncio.run(resources.local.get())
    assert first.closed == 1
    second = asyncio.run(resources.local.get())
    assert second is not first
    assert second.closed == 1


def test_aclose_closes_the_running_loops_value_and_the_next_get_makes_another() -> None:
    resources = Resources()

    async def main() -> tuple[Resource, Resource]:
        first = await resources.local.get()
        await resources.local.aclose()
        await resources.local.aclose()  # twice: nothing more to close
        return first, await resources.local.get()

    first, second = asyncio.run(main())
    assert first.closed == 1
    assert second is not first
    assert second.closed == 1  # by asyncio.run's end


def test_loops_on_two_threads_get_their_own_values() -> None:
    resources = Resources()
    barrier = threading.Barrier(2, timeout=10)
    pairs: list[tuple[Resource, Resource]] = []

    async def on_a_thread() -> None:
        mine = await resources.local.get()
        await asyncio.to_thread(barrier.wait)  # both loops hold a value now
        pairs.append((mine, await resources.local.get()))

    threads = [threading.Thread(target=asyncio.run, args=(on_a_thread(),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(pairs) == 2
    assert all(first is again for first, again in pairs)
    assert pairs[0][0] is not pairs[1][0]
    assert len(resources.made) == 2
    assert all(value.closed == 1 for value in resources.made)


def test_the_value_of_a_loop_closed_without_closing_it_is_abandoned() -> None:
    resources = Resources()
    loop = asyncio.new_event_loop()
    first = loop.run_until_complete(resources.local.get())
    loop.close()  # no shutdown_asyncgens: the value was never closed on it
    second = asyncio.run(resources.local.get())
    assert first.abandoned == 1
    assert first.closed == 0
    assert second is not first
    gc.collect()


def test_a_failed_make_leaves_nothing_behind_and_waiters_try_again() -> None:
    resources = Resources(fail_first=1)

    async def main() -> list[Resource | BaseException]:
        return list(
            await asyncio.gather(*(resources.local.get() for _ in range(3)), return_exceptions=True)
        )

    got = asyncio.run(main())
    assert isinstance(got[0], ConnectionError)
    assert got[1] is got[2] is resources.made[0]
    assert len(resources.made) == 1
    assert resources.local.values() == []  # closed with its loop
