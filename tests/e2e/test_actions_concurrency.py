"""Concurrent consumers of one action: exactly one wins, every other is told it was
already used; concurrent wrong PINs never get more tries than ``max_pin_attempts``.

Proven where conditional writes are atomic: SQLite across processes (several processes on
one file, each with several threads, released at one instant), MemoryStore across threads,
Redis and PostgreSQL (real servers) across threads, asyncio tasks and processes, and both
DynamoDB stores on DynamoDB Local (skipped unless ``scripts/dynamodb-local.sh`` runs them).
Not on moto: its threaded server does not apply conditional writes atomically
(tests/contract/test_moto_atomicity.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import OneTimeActions, SQLiteStore
from tests.support.action_stores import ActionsUnderTest, open_actions
from tests.support.action_workers import TIMEOUT, Outcome, StoreSpec, attempt, consume_in_threads
from tests.support.db_stores import location, new_store
from tests.support.race_processes import RACES
from tests.support.store_kinds import DB_KINDS, LOCAL_KINDS, MEMORY_KINDS

CONSUMERS = 50
# Each PIN guess costs a scrypt hash (16 MiB, tens of milliseconds): fewer, on a shared host.
GUESSERS = 20
PROCESSES = 5  # on SQLite: the contenders are spread over them, several threads each
MAX_ATTEMPTS = 5
PIN = "271828"


class Contenders:
    """Runs one consume per PIN at the same instant on one kind; the outcomes."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self._request = request

    def race(self, create: dict[str, Any], pins: list[str | None]) -> tuple[list[Outcome], Any]:
        """Create an action, race ``pins`` on it; the outcomes and the action afterwards."""
        if self.kind.endswith("-processes"):
            return self._race_processes(create, pins)
        opened = open_actions(self._request, self.kind, counted=False)
        under: ActionsUnderTest = next(opened)
        try:
            action = under.create(**create)
            if under.loop is not None:
                outcomes = under.run(self._race_tasks(under.actions, action.action_id, pins))
            else:
                outcomes = self._race_threads(under.actions, action.action_id, pins)
            return outcomes, under.get(action.action_id)
        finally:
            opened.close()  # the store, its loop and its proxy, now

    @staticmethod
    def _race_threads(
        actions: OneTimeActions, action_id: str, pins: list[str | None]
    ) -> list[Outcome]:
        barrier = threading.Barrier(len(pins), timeout=60)
        outcomes: list[Outcome] = []
        lock = threading.Lock()

        def consumer(number: int, pin: str | None) -> None:
            barrier.wait(TIMEOUT)
            outcome = attempt(actions, action_id, pin, f"thread-{number}")
            with lock:
                outcomes.append(outcome)

        threads = [threading.Thread(target=consumer, args=item) for item in enumerate(pins)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        return outcomes

    @staticmethod
    async def _race_tasks(
        actions: OneTimeActions, action_id: str, pins: list[str | None]
    ) -> list[Outcome]:
        async def consumer(number: int, pin: str | None) -> Outcome:
            try:
                consumed = await actions.aconsume(action_id, pin=pin, reason=f"task-{number}")
            except Exception as error:
                return type(error).__name__, getattr(error, "attempts_left", None)
            return "consumed", consumed.consumed_reason

        return list(await asyncio.gather(*(consumer(*item) for item in enumerate(pins))))

    def _race_processes(
        self, create: dict[str, Any], pins: list[str | None]
    ) -> tuple[list[Outcome], Any]:
        store: Any
        spec: StoreSpec
        if self.kind == "sqlite-processes":
            tmp_path: Path = self._request.getfixturevalue("tmp_path")
            path = str(tmp_path / "actions.sqlite3")
            store, spec = SQLiteStore(path), ("sqlite", path)
        else:
            db_kind = self.kind.removesuffix("-processes")
            where = location(self._request, db_kind)
            store = new_store(db_kind, where)
            namespace = store.prefix if db_kind == "redis" else store.table
            spec = (db_kind, where, namespace)
        with store:
            action = OneTimeActions(store).create(**create)
            return self._race_in(spec, action.action_id, pins), OneTimeActions(store).get(
                action.action_id
            )

    @staticmethod
    def _race_in(spec: StoreSpec, action_id: str, pins: list[str | None]) -> list[Outcome]:
        context = RACES
        ready, results, go = context.Queue(), context.Queue(), context.Event()
        share = len(pins) // PROCESSES
        processes = [
            context.Process(
                target=consume_in_threads,
                args=(spec, action_id, pins[n * share : (n + 1) * share], ready, go, results),
            )
            for n in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        try:
            for _ in processes:
                ready.get(timeout=TIMEOUT)
            go.set()  # every thread of every process waits on it: one instant for all
            return [outcome for _ in processes for outcome in results.get(timeout=TIMEOUT)]
        finally:
            for process in processes:
                process.join(TIMEOUT)
                if process.is_alive():
                    process.kill()


@pytest.fixture(
    params=[
        "sqlite-processes",
        *MEMORY_KINDS,
        *LOCAL_KINDS,
        *DB_KINDS,
    ]
)
def contenders(request: pytest.FixtureRequest) -> Iterator[Contenders]:
    yield Contenders(request.param, request)


def test_fifty_concurrent_consumers_exactly_one_wins(contenders: Contenders) -> None:
    outcomes, after = contenders.race({"expires_in": 600}, [None] * CONSUMERS)
    kinds = Counter(name for name, _ in outcomes)
    assert kinds == {"consumed": 1, "ActionAlreadyUsedError": CONSUMERS - 1}, outcomes
    (winner,) = [label for name, label in outcomes if name == "consumed"]
    assert after.consumed_reason == winner  # the one the store kept is the one told it won


@pytest.mark.parametrize("kind", ["redis-processes", "postgres-processes"])
def test_fifty_consumers_in_several_processes_on_one_server_exactly_one_wins(
    kind: str, request: pytest.FixtureRequest
) -> None:
    # Each process with its own store, client and connections, as separate hosts would be.
    pins: list[str | None] = [None] * CONSUMERS
    outcomes, after = Contenders(kind, request).race({"expires_in": 600}, pins)
    kinds = Counter(name for name, _ in outcomes)
    assert kinds == {"consumed": 1, "ActionAlreadyUsedError": CONSUMERS - 1}, outcomes
    (winner,) = [label for name, label in outcomes if name == "consumed"]
    assert after.consumed_reason == winner


def test_concurrent_consumers_with_the_right_pin_exactly_one_wins(
    contenders: Contenders,
) -> None:
    outcomes, after = contenders.race(
        {"expires_in": 600, "pin": PIN, "max_pin_attempts": MAX_ATTEMPTS}, [PIN] * GUESSERS
    )
    assert Counter(name for name, _ in outcomes) == {
        "consumed": 1,
        "ActionAlreadyUsedError": GUESSERS - 1,
    }, outcomes
    assert after.pin_attempts_left == MAX_ATTEMPTS


def test_concurrent_wrong_pins_get_exactly_max_pin_attempts_tries(contenders: Contenders) -> None:
    wrong: list[str | None] = [f"{n:06d}" for n in range(GUESSERS)]
    outcomes, after = contenders.race(
        {"expires_in": 600, "pin": PIN, "max_pin_attempts": MAX_ATTEMPTS}, wrong
    )
    invalid = sorted(left for name, left in outcomes if name == "InvalidPinError")
    assert invalid == list(range(MAX_ATTEMPTS)), outcomes  # 4, 3, 2, 1, 0: each once
    assert Counter(name for name, _ in outcomes)["ActionLockedError"] == GUESSERS - MAX_ATTEMPTS
    assert after.pin_attempts_left == 0 and after.consumed_at is None


def test_the_right_pin_among_concurrent_wrong_ones_never_gets_past_the_limit(
    contenders: Contenders,
) -> None:
    # Holders of the PIN race guessers: whoever comes first, no more than
    # max_pin_attempts PINs are ever checked before the action is locked or consumed.
    pins: list[str | None] = [PIN if n % 5 == 0 else f"{n:06d}" for n in range(GUESSERS)]
    outcomes, after = contenders.race(
        {"expires_in": 600, "pin": PIN, "max_pin_attempts": MAX_ATTEMPTS}, pins
    )
    kinds = Counter(name for name, _ in outcomes)
    assert set(kinds) <= {
        "consumed",
        "InvalidPinError",
        "ActionLockedError",
        "ActionAlreadyUsedError",
    }, outcomes
    assert kinds["consumed"] <= 1
    assert kinds["InvalidPinError"] <= MAX_ATTEMPTS
    assert kinds["InvalidPinError"] == MAX_ATTEMPTS - after.pin_attempts_left
    if kinds["consumed"] == 1:
        assert after.consumed_at is not None and after.pin_attempts_left > 0
    else:
        assert after.pin_attempts_left == 0 and after.consumed_at is None
