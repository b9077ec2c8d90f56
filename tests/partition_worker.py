"""A worker process of tests/test_partitions.py: one call of an ``idempotent`` function on a
real store reached through the worker's own TCP fault proxy (tests/tcp_faults.py).

Its own small module, so the processes (forked from tests/race_processes.py's forkserver)
import the package and this, not the test module with its servers and proxies.

The function appends ``key owner pid`` to a ledger file when it runs (one O_APPEND write, so
processes never interleave): the runs are counted from what the handlers themselves did,
not from what the store says. It returns ``ran <owner> <pid>``, so a replay names its run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from idempotency_middleware import KeyInProgressError, StoreUnavailableError, idempotent
from idempotency_middleware.attempt_context import current_attempt
from tests.function_worker import append_line

NAME = "tests.partition_worker.work"  # the same in every process
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


@dataclass(frozen=True)
class Signals:
    """The worker's events, set by the test (``go``, ``release``) or the worker."""

    ready: Any  # connected: the store has a live connection through the proxy
    go: Any  # call now
    running: Any  # the function started (its ledger line is written)
    release: Any  # the function may return


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


def make_work(store: Any, job: Job, signals: Signals) -> Any:
    @idempotent(store=store, key="key", name=NAME, lock_timeout_seconds=job.lock_timeout_seconds)
    def work(key: str) -> str:
        owner = current_attempt("the partition worker").claim.owner
        append_line(job.ledger, f"{key} {owner} {os.getpid()}")
        signals.running.set()
        if job.hold and not signals.release.wait(PATIENCE_SECONDS):
            raise TimeoutError("never released by the test")
        return f"ran {owner} {os.getpid()}"

    return work


def call_once(job: Job, signals: Signals, results: Any) -> None:
    """Connect, say so, wait for ``go``, call once; the outcome as a dict on ``results``:
    ``{"pid", "outcome": "ran"|"replayed"|"in_progress"|"unavailable"|"error", "answer"}``."""
    pid = os.getpid()
    outcome: dict[str, Any] = {"pid": pid}
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
            outcome.update(call(work, job.key, pid))
        finally:
            store.close()
    except BaseException as error:  # reported to the test, which fails with it
        outcome.update(outcome="error", answer=repr(error))
    results.put(outcome)


def call(work: Any, key: str, pid: int) -> dict[str, Any]:
    try:
        answer = work(key)
    except KeyInProgressError as error:
        return {"outcome": "in_progress", "answer": repr(error)}
    except StoreUnavailableError as error:
        return {"outcome": "unavailable", "answer": repr(error)}
    ran_here = answer.endswith(f" {pid}")
    return {"outcome": "ran" if ran_here else "replayed", "answer": answer}
