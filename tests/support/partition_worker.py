"""A worker process of tests/e2e/test_partitions.py: one call of an ``idempotent`` function on a
real store reached through the worker's own TCP fault proxy (tests/support/tcp_faults.py).

Its own small module, so the processes (forked from tests/support/race_processes.py's forkserver)
import the package and this, not the test module with its servers and proxies.

The function appends ``key owner pid`` to a ledger file when it runs (one O_APPEND write, so
processes never interleave): the runs are counted from what the handlers themselves did,
not from what the store says. It returns ``ran <owner> <pid>``, so a replay names its run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from idempotency_middleware import KeyInProgressError, StoreUnavailableError, idempotent
from idempotency_middleware.handler.context import current_attempt
from tests.support.function_worker import append_line

NAME = "tests.support.partition_worker.work"  # the same in every process
REGION = "us-east-1"
# Real seconds a worker waits at most for the test (never a deadline of the scenario).
PATIENCE_SECONDS = 30.0


@dataclass(frozen=True)
class Job:
    """One call: the store (``kind`` redis/postgres/dynamodb and where, through the proxy),
    the key, the ledger file, the lease, and whether the function holds until released."""

    store: dict[str, Any]
    key: str
    ledger: str
    lock_timeout_seconds: float
    hold: bool = False
    asynchronous: bool = False  # a coroutine function on the store's asyncio half
    linger: bool = False  # stay after the call until told to leave


@dataclass(frozen=True)
class Signals:
    """The worker's events, set by the test (``go``, ``release``) or the worker."""

    ready: Any  # connected: the store has a live connection through the proxy
    go: Any  # call now
    running: Any  # the function started (its ledger line is written)
    release: Any  # the function may return
    leave: Any  # a lingering worker may close its store and exit


def open_store(spec: dict[str, Any]) -> Any:
    """A sync store with short timeouts, so a cut-off call fails within a second or two."""
    timeout = float(spec.get("timeout", 0.5))
    if spec["kind"] == "redis":
        from idempotency_middleware.stores.redis import RedisStore

        return RedisStore(
            spec["url"],
            prefix=spec["prefix"],
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
    if spec["kind"] == "postgres":
        from idempotency_middleware.stores.postgres import PostgresStore

        return PostgresStore(
            spec["dsn"],
            table=spec["table"],
            statement_timeout_seconds=timeout,
            connect_timeout=1,
            pool_timeout_seconds=1,
            max_size=3,
            purge_interval_seconds=None,
        )
    from idempotency_middleware import DynamoDBStore

    return DynamoDBStore(
        spec["table"],
        endpoint_url=spec["endpoint"],
        region_name=REGION,
        connect_timeout=timeout,
        read_timeout=timeout,
    )


def run_body(job: Job, signals: Signals) -> str:
    """What the function does: its ledger line, then hold until released (as told)."""
    owner = current_attempt("the partition worker").claim.owner
    append_line(job.ledger, f"{job.key} {owner} {os.getpid()}")
    signals.running.set()
    if job.hold and not signals.release.wait(PATIENCE_SECONDS):
        raise TimeoutError("never released by the test")
    return f"ran {owner} {os.getpid()}"


def make_work(store: Any, job: Job, signals: Signals) -> Any:
    decorate = idempotent(
        store=store, key="key", name=NAME, lock_timeout_seconds=job.lock_timeout_seconds
    )

    def work(key: str) -> str:
        return run_body(job, signals)

    async def awork(key: str) -> str:
        # Held in a thread, so the event loop stays free to renew the lease meanwhile.
        # (The attempt's context goes along: to_thread copies it.)
        return await asyncio.to_thread(run_body, job, signals)

    return decorate(awork if job.asynchronous else work)


def call_once(job: Job, signals: Signals, results: Any) -> None:
    """Connect, say so, wait for ``go``, call once; the outcome as a dict on ``results``:
    ``{"pid", "outcome": "ran"|"replayed"|"in_progress"|"unavailable"|"error", "answer"}``.
    A lingering worker then stays until ``leave``, its background work (a lost claim's
    release) going on as in a long-lived process."""
    pid = os.getpid()
    reported = False

    def report(outcome: dict[str, Any]) -> None:
        nonlocal reported
        if not reported:
            reported = True
            results.put({"pid": pid, **outcome})

    try:
        store = open_store(job.store)
        try:
            store.get("warm-up")  # a connection made through the proxy before any fault
            if hasattr(store, "warm_up"):
                # Redis: the scripts loaded, so a write under a fault is the write itself,
                # not a NOSCRIPT answer lost before the script is ever sent.
                store.warm_up()
            work = make_work(store, job, signals)
            signals.ready.set()
            if not signals.go.wait(PATIENCE_SECONDS):
                raise TimeoutError("never told to go")
            if job.asynchronous:
                asyncio.run(acall(store, work, job, signals, report))
            else:
                report(call(work, job.key))
                linger(job, signals)
        finally:
            store.close()
    except BaseException as error:  # reported to the test, which fails with it
        report({"outcome": "error", "answer": repr(error)})


def linger(job: Job, signals: Signals) -> None:
    if job.linger:
        signals.leave.wait(PATIENCE_SECONDS)


def call(work: Any, key: str) -> dict[str, Any]:
    try:
        return answered(work(key))
    except (KeyInProgressError, StoreUnavailableError) as error:
        return refused(error)


async def acall(
    store: Any, work: Any, job: Job, signals: Signals, report: Callable[[dict[str, Any]], None]
) -> None:
    try:
        try:
            outcome = answered(await work(job.key))
        except (KeyInProgressError, StoreUnavailableError) as error:
            outcome = refused(error)
        report(outcome)
        await asyncio.to_thread(linger, job, signals)
    finally:
        await store.aclose()  # this loop's clients, before asyncio.run closes it


def refused(error: Exception) -> dict[str, Any]:
    kind = "in_progress" if isinstance(error, KeyInProgressError) else "unavailable"
    return {"outcome": kind, "answer": repr(error)}


def answered(answer: str) -> dict[str, Any]:
    ran_here = answer.endswith(f" {os.getpid()}")
    return {"outcome": "ran" if ran_here else "replayed", "answer": answer}
