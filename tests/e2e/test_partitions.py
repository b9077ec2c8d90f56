"""Network partitions on real servers: worker processes calling one ``idempotent`` function on
Redis and PostgreSQL, each through its own TCP fault proxy (tests/support/tcp_faults.py), one of
them cut off from the store mid-attempt.

What is checked comes from the handlers' own ledger (tests/support/partition_worker.py: every run
appends ``key owner pid``), not from what the store says:

- a key runs a second time only when its first owner lost its lease: it was cut off longer
  than ``lock_timeout_seconds`` plus the skew margin (the test waits for that, reading the
  record's ``lock_expires_at``, before the second caller goes);
- every caller's answer is its own run's result, the completed (replayed) result, or a
  documented refusal (``KeyInProgressError``, ``StoreUnavailableError``);
- once every attempt ended and the lock timeouts passed, the key is not in progress: a last
  caller gets the completed result.

Redis and PostgreSQL make those claims: their conditional writes are atomic. DynamoDB is
faulted through moto only to show the proxy serves its HTTP too (moto's threaded server does
not make conditional writes atomic: tests/contract/test_moto_atomicity.py).

Every wait is bounded; proxies and processes are stopped at the end of each test.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import DynamoDBStore, StoreUnavailableError, idempotent
from idempotency_middleware.functions.attempts import function_key_hash
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS
from idempotency_middleware.stores.records import COMPLETED, IN_PROGRESS, Record
from tests.conftest import REGION
from tests.support.db_stores import location, new_store
from tests.support.function_worker import read_lines
from tests.support.partition_worker import NAME, Job, Signals, call_once
from tests.support.race_processes import RACES
from tests.support.tcp_faults import TcpFaultProxy

LOCK_SECONDS = 1.0  # renewed every 1/3 s; taken over 1 s (the skew margin) after it lapses
SKEW_SECONDS = DEFAULT_CLOCK_SKEW_SECONDS
TIMEOUT = 15.0  # real seconds the test waits at most for a process or a store state
POLL = 0.005
REFUSALS = {"in_progress", "unavailable"}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    if not within(condition, timeout):
        raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")


def within(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition`` became true within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


@dataclass
class Worker:
    """One process behind its own proxy."""

    name: str
    proxy: TcpFaultProxy
    signals: Signals
    process: Any
    outcome: dict[str, Any] | None = None

    @property
    def pid(self) -> int:
        pid: int = self.process.pid
        return pid


class Scene:
    """One key, the worker processes calling it, their ledger, and a store of the test's own
    (no proxy) to read the record."""

    def __init__(self, kind: str, where: str, directory: Path, stack: contextlib.ExitStack):
        self.kind = kind
        self.where = where
        self.store = stack.enter_context(new_store(kind, where))
        self.key = f"key-{uuid.uuid4().hex[:8]}"
        self.key_hash = function_key_hash(NAME, self.key)
        self.ledger = str(directory / "ledger")
        self.results = RACES.Queue()
        self.workers: list[Worker] = []
        self.proxies: list[TcpFaultProxy] = []
        stack.callback(self._stop_all)

    def worker(
        self,
        *,
        hold: bool = False,
        timeout: float = 0.5,
        asynchronous: bool = False,
        linger: bool = False,
        lock_seconds: float = LOCK_SECONDS,
    ) -> Worker:
        """A connected worker process (not called yet) behind a proxy of its own, calling a
        plain function or (``asynchronous``) a coroutine function."""
        proxy = TcpFaultProxy(self.where).start()
        self.proxies.append(proxy)
        spec: dict[str, Any] = {"kind": self.kind, "timeout": timeout}
        if self.kind == "redis":
            spec.update(url=proxy.url, prefix=self.store.prefix)
        else:
            spec.update(dsn=proxy.url, table=self.store.table)
        job = Job(spec, self.key, self.ledger, lock_seconds, hold, asynchronous, linger)
        signals = Signals(*(RACES.Event() for _ in range(5)))
        process = RACES.Process(target=call_once, args=(job, signals, self.results), daemon=True)
        process.start()
        worker = Worker(f"w{len(self.workers) + 1}", proxy, signals, process)
        self.workers.append(worker)
        wait_for(
            lambda: signals.ready.is_set() or not process.is_alive(), f"{worker.name} to connect"
        )
        assert signals.ready.is_set(), f"{worker.name} died before connecting"
        return worker

    def go(self, worker: Worker) -> None:
        worker.signals.go.set()

    def wait_running(self, worker: Worker) -> None:
        wait_for(worker.signals.running.is_set, f"{worker.name}'s function to run")

    def outcome(self, worker: Worker) -> dict[str, Any]:
        """The worker's outcome (waiting for it); a worker that failed fails the test."""
        deadline = time.monotonic() + TIMEOUT
        while worker.outcome is None:
            found = self.results.get(timeout=max(0.0, deadline - time.monotonic()))
            for each in self.workers:
                if each.pid == found["pid"]:
                    each.outcome = found
        assert worker.outcome["outcome"] != "error", worker.outcome
        return worker.outcome

    def runs(self) -> list[tuple[str, int]]:
        """(owner, pid) of every run of the key, in order, from the handlers' ledger."""
        lines = [line.split() for line in read_lines(self.ledger)]
        return [(owner, int(pid)) for key, owner, pid in lines if key == self.key]

    def record(self) -> Record | None:
        record: Record | None = self.store.get(self.key_hash)
        return record

    def lease_lapsed(self) -> bool:
        """No live owner may hold the key: its lock ran out more than the skew margin ago."""
        record = self.record()
        return record is not None and time.time() > record.lock_expires_at + SKEW_SECONDS + 0.1

    def run_after_a_lost_claim(self) -> None:
        """After a claim whose owner never ran (its answer was lost): the key is free (the
        owner's background release landed) or held by that claim until its lock times out
        (a later caller is refused meanwhile); then a caller runs it, once."""
        later = self.worker(asynchronous=True)
        self.go(later)
        if self.outcome(later)["outcome"] == "in_progress":
            record = self.record()
            assert record is not None and record.status is IN_PROGRESS
            wait_for(self.lease_lapsed, "the lost claim's lock to time out", LOCK_SECONDS * 4)
            later = self.worker()
            self.go(later)
        assert self.outcome(later)["outcome"] == "ran"
        self.check(runs=1)

    def check(self, *, runs: int) -> str:
        """The invariants, with a last caller (no fault) that must get the completed result;
        that result."""
        last = self.worker()
        self.go(last)
        final = self.outcome(last)
        assert final["outcome"] == "replayed", final
        ledger = self.runs()
        assert len(ledger) == runs, ledger
        assert len({owner for owner, _ in ledger}) == len(ledger), f"an owner ran twice: {ledger}"
        results = {f"ran {owner} {pid}" for owner, pid in ledger}
        assert final["answer"] in results
        for worker in self.workers:
            answer = self.outcome(worker)
            if answer["outcome"] == "ran":
                assert answer["answer"] in results and answer["answer"].endswith(
                    f" {worker.pid}"
                ), (worker.name, answer)
            elif answer["outcome"] == "replayed":
                assert answer["answer"] == final["answer"], (worker.name, answer)
            else:
                assert answer["outcome"] in REFUSALS, (worker.name, answer)
        record = self.record()
        assert record is not None and record.status is COMPLETED, record
        return str(final["answer"])

    def _stop_all(self) -> None:
        """The processes first (through their proxies, so none waits on a closed port),
        then the proxies."""
        try:
            for worker in self.workers:
                worker.signals.release.set()
                worker.signals.leave.set()
                worker.signals.go.set()
            for worker in self.workers:
                worker.process.join(TIMEOUT)
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join(TIMEOUT)
        finally:
            for proxy in self.proxies:
                proxy.stop()


@pytest.fixture(params=["redis", "postgres"])
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    """A scene on the session's Redis or PostgreSQL server, in a namespace of its own."""
    yield from open_scene(request, request.param, tmp_path)


@pytest.fixture
def redis_scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    """A scene on Redis only (a timing its fast failures allow in a short test)."""
    yield from open_scene(request, "redis", tmp_path)


def open_scene(request: pytest.FixtureRequest, kind: str, directory: Path) -> Iterator[Scene]:
    with contextlib.ExitStack() as stack:
        yield Scene(kind, location(request, kind), directory, stack)


def test_answers_lost_after_the_completion_landed_run_nothing_twice(scene: Scene) -> None:
    # A long lease, so no renewal is in flight when answers start to be swallowed: one whose
    # answer was lost keeps the warm connection busy, and the completion then needs a new
    # connection, whose handshake answer is swallowed too, so the completion would never be
    # sent (what lands would be nothing; a loaded machine made that likely with renewals
    # every 1/3 s).
    # And a 2 s read timeout: the first claim's answer took longer than 0.5 s on a loaded
    # machine (make test beside other work), so the claim failed and nothing ran; the lost
    # completion answer only needs the timeout to end before TIMEOUT.
    first = scene.worker(hold=True, asynchronous=True, lock_seconds=60, timeout=2.0)
    duplicates = [scene.worker(), scene.worker(asynchronous=True)]
    scene.go(first)
    scene.wait_running(first)
    for duplicate in duplicates:
        scene.go(duplicate)
        # (Refused either way: "unavailable" where its claim's answer outlasted 0.5 s.)
        assert scene.outcome(duplicate)["outcome"] in REFUSALS

    first.proxy.set("swallow")  # the completion lands; its answer never comes back
    first.signals.release.set()
    wait_for(lambda: getattr(scene.record(), "status", None) is COMPLETED, "the completion")
    wait_for(lambda: first.proxy.answers_dropped > 0, "an answer to be dropped")
    first.proxy.set("pass")  # healed: the connection that lost the answer is reset

    assert scene.outcome(first)["outcome"] == "ran"
    assert scene.check(runs=1) == scene.outcome(first)["answer"]


def test_a_hang_shorter_than_the_lease_runs_nothing_twice(scene: Scene) -> None:
    # A 2 s lease: the duplicate's claim comes long before a takeover could (2 s after the
    # last renewal, plus the 1 s skew margin), however slow the machine.
    first = scene.worker(hold=True, asynchronous=True, lock_seconds=2.0)
    duplicate = scene.worker()
    scene.go(first)
    scene.wait_running(first)

    first.proxy.set("hang")
    scene.go(duplicate)
    assert scene.outcome(duplicate)["outcome"] == "in_progress"
    # A renewal went into the black hole: the owner really was cut off, for less than its
    # lease (renewed every 2/3 s).
    wait_for(lambda: first.proxy.requests_dropped > 0, "a renewal to be lost")
    first.proxy.set("pass")
    first.signals.release.set()

    assert scene.outcome(first)["outcome"] == "ran"
    scene.check(runs=1)


def test_an_owner_cut_off_past_its_lease_is_taken_over_once(scene: Scene) -> None:
    first = scene.worker(hold=True)
    second = scene.worker(asynchronous=True)
    scene.go(first)
    scene.wait_running(first)

    first.proxy.set("hang")
    # The one legitimate second run: the first owner's lease lapsed (no renewal got
    # through) and the skew margin passed, by the record the store keeps.
    wait_for(scene.lease_lapsed, "the first owner's lease to lapse", timeout=LOCK_SECONDS * 4)
    scene.go(second)
    assert scene.outcome(second)["outcome"] == "ran"

    dropped = first.proxy.requests_dropped
    first.signals.release.set()  # its completion goes into the black hole ...
    wait_for(lambda: first.proxy.requests_dropped > dropped, "the first completion to be lost")
    first.proxy.set("pass")  # ... and a retry after the heal reaches the store, fenced out
    assert scene.outcome(first)["outcome"] == "ran"

    final = scene.check(runs=2)
    assert final == scene.outcome(second)["answer"], "the fenced-out owner overwrote the result"
    assert [pid for _, pid in scene.runs()] == [first.pid, second.pid]


def test_a_claim_whose_answer_was_lost_runs_once_at_most(scene: Scene) -> None:
    first = scene.worker()
    first.proxy.set("swallow")  # the claim lands; its answer never comes back
    scene.go(first)
    assert scene.outcome(first)["outcome"] == "unavailable"
    assert first.proxy.answers_dropped > 0
    assert scene.runs() == []
    first.proxy.set("pass")

    scene.run_after_a_lost_claim()


def test_a_connection_reset_after_the_claim_landed(scene: Scene) -> None:
    # A long socket timeout: the reset, not the timeout, ends the wait for the answer.
    first = scene.worker(timeout=5.0)
    first.proxy.set("swallow")
    scene.go(first)
    wait_for(lambda: first.proxy.answers_dropped > 0, "the claim to land")
    # Back to pass, which resets the connections that lost an answer (the claim's): a client
    # that re-sends at once (redis-py does) finds the proxy passing. No reset() of every
    # connection after it: that would reset the re-sent claim's new connection too when the
    # client is quicker than this thread (its one retry used up, the claim refused).
    first.proxy.set("pass")

    outcome = scene.outcome(first)
    if scene.kind == "redis":
        # redis-py sends the claim again on a new connection; the script knows it as the
        # same owner's claim: Claimed, and it runs, once.
        assert outcome["outcome"] == "ran", outcome
        scene.check(runs=1)
    elif outcome["outcome"] == "ran":
        # The claim was sent again on a fresh connection once the faulted one was reset (no
        # longer a second reset to meet it): the same owner's claim, Claimed; it ran once.
        scene.check(runs=1)
    else:
        # psycopg reported the broken connection: a refusal, and the claim is released in
        # the background (or times out); nothing ran.
        assert outcome["outcome"] == "unavailable", outcome
        assert scene.runs() == []
        # (What follows a claim lost so: test_a_claim_whose_answer_was_lost_runs_once_at_most.)


def test_a_store_refusing_connections_refuses_callers_then_runs_once(scene: Scene) -> None:
    first = scene.worker(asynchronous=True)
    first.proxy.set("refuse")
    first.proxy.reset()  # its warm connection too: the server is gone for it
    scene.go(first)
    assert scene.outcome(first)["outcome"] == "unavailable"
    assert scene.record() is None  # nothing reached the store
    first.proxy.set("pass")
    second = scene.worker()
    scene.go(second)
    assert scene.outcome(second)["outcome"] == "ran"
    scene.check(runs=1)


# --- DynamoDB's HTTP through the same proxy (moto: the proxy's mechanics, not a race) ------


def test_the_proxy_faults_dynamodb_too(moto_endpoint: str, dynamodb_table: str) -> None:
    runs: list[str] = []
    with TcpFaultProxy(moto_endpoint) as proxy:
        store = DynamoDBStore(
            dynamodb_table,
            endpoint_url=proxy.url,
            region_name=REGION,
            # (moto, a Python server beside three test workers, may take a while to answer.)
            connect_timeout=2.0,
            read_timeout=2.0,
            max_attempts=1,
            breaker_threshold=0,
        )
        direct = DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION)
        with store, direct:

            @idempotent(store=store, key="key", name=NAME, lock_timeout_seconds=LOCK_SECONDS)
            def work(key: str) -> str:
                runs.append(key)
                return f"done {key}"

            assert work("a") == "done a"
            proxy.reset()
            proxy.set("refuse")
            with pytest.raises(StoreUnavailableError):
                work("b")
            proxy.set("hang")
            with pytest.raises(StoreUnavailableError):
                work("c")
            proxy.set("swallow")
            with pytest.raises(StoreUnavailableError):
                work("d")
            assert proxy.answers_dropped > 0  # the claim reached moto; its answer did not
            proxy.set("pass")
            assert work("a") == "done a"  # a replay, through a new connection
            assert work("e") == "done e"
    assert runs == ["a", "e"]


def test_a_lost_claim_is_released_once_the_partition_heals(scene: Scene) -> None:
    # A lease far longer than the test: the key is free again only if its owner, alive and
    # reconnected, releases the claim it never got the answer of. (Each driver on one
    # store, to keep the file short: the sync one on Redis, the async one on PostgreSQL.)
    asynchronous = scene.kind == "postgres"
    first = scene.worker(asynchronous=asynchronous, linger=True, lock_seconds=60)
    first.proxy.set("swallow")
    scene.go(first)
    assert scene.outcome(first)["outcome"] == "unavailable"
    assert first.proxy.answers_dropped > 0  # the claim landed; nobody runs it
    record = scene.record()  # (the release may have landed already, under the same fault)
    assert record is None or record.status is IN_PROGRESS, record
    first.proxy.set("pass")
    # Its background release retries for 7.5 s (0, 0.5, 1, 2, 4 s apart).
    wait_for(lambda: scene.record() is None, "the lost claim to be released", timeout=10)
    first.signals.leave.set()
    later = scene.worker()
    scene.go(later)
    assert scene.outcome(later)["outcome"] == "ran"
    scene.check(runs=1)


def test_a_partition_shorter_than_the_lease_during_the_completion_runs_nothing_twice(
    redis_scene: Scene,
) -> None:
    scene, lock_seconds = redis_scene, 4.0
    first = scene.worker(hold=True, lock_seconds=lock_seconds)
    scene.go(first)
    scene.wait_running(first)

    first.proxy.set("hang")
    cut_at = time.monotonic()
    first.signals.release.set()  # its completion goes into the black hole
    # The partition lasts until the owner answered its caller, or 2.5 s at most: shorter
    # than the lease either way (renewed every 4/3 s while the function ran).
    within(lambda: not first.process.is_alive(), 2.5)
    first.proxy.set("pass")
    partition = time.monotonic() - cut_at
    assert partition < lock_seconds - 1, partition
    assert scene.outcome(first)["outcome"] == "ran"

    # Nothing may run it again: once the completion landed, or the lease the owner held
    # through the partition is over (it finished its run long before), a caller replays.
    def settled() -> bool:
        record = scene.record()
        return record is not None and (record.status is COMPLETED or scene.lease_lapsed())

    wait_for(settled, "the key to be completed or its lease over", lock_seconds + 3)
    scene.check(runs=1)
