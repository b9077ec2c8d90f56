"""A child process for tests/e2e/test_function_concurrency.py: one call of an ``idempotent``
function, its outcome printed as one JSON line.

    python -m tests.support.function_worker '{"store": {...}, "key": "...", ...}'

The job description (one JSON argument):

- ``store``: ``{"kind": "sqlite", "path": ...}``,
  ``{"kind": "dynamodb", "endpoint": ..., "table": ...}``,
  ``{"kind": "redis", "url": ..., "prefix": ...}`` or
  ``{"kind": "postgres", "dsn": ..., "table": ...}``;
- ``key``, ``lock_timeout_seconds``, ``wait_seconds``;
- ``runs``: a file the function appends ``ran <pid>`` to when it runs (O_APPEND, so lines
  from several processes never interleave): runs counted across processes;
- ``hold``: what the function waits for before returning, ``{"until_file": path}`` (the
  parent creates it) or ``{"until_held": n, "log": path}`` (until ``n`` other processes'
  claims found the key held: every claim here appends ``held <pid>`` to ``log``);
- ``fail``: the function raises (``WorkFailed``) after its hold instead of returning.

The function and the store wrapper are used by the parent test process too, with the same
``NAME``, so parent and children share the keys.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idempotency_middleware import (
    DynamoDBStore,
    IdempotencyEvent,
    KeyInProgressError,
    SQLiteStore,
    SyncStore,
    idempotent,
)
from idempotency_middleware.clock import SYSTEM_CLOCK, Clock
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult, Completion, Held

NAME = "tests.support.function_worker.work"  # the same in every process (whatever __name__ is)
REGION = "us-east-1"
HOLD_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.01


class WorkFailed(Exception):
    """What the function raises when told to fail."""


def append_line(path: str | Path, line: str) -> None:
    """One ``write`` on an O_APPEND descriptor: atomic between processes for short lines."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def read_lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []


class ObservedStore:
    """Forwards to a store (sync and async halves) and calls ``on_held`` in the caller's
    thread or task whenever a claim finds the key held by someone else: how a running
    function knows the other callers have really tried while it held the key."""

    def __init__(self, inner: Any, on_held: Callable[[], None]) -> None:
        self.inner = inner
        self.on_held = on_held

    def claim(self, request: ClaimRequest) -> ClaimResult:
        result: ClaimResult = self.inner.claim(request)
        if isinstance(result, Held):
            self.on_held()
        return result

    def complete(self, completion: Completion) -> bool:
        return bool(self.inner.complete(completion))

    def release(self, key_hash: str, owner: str) -> bool:
        return bool(self.inner.release(key_hash, owner))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return bool(self.inner.renew(key_hash, owner, lock_expires_at))

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        result: ClaimResult = await self.inner.aclaim(request)
        if isinstance(result, Held):
            self.on_held()
        return result

    async def acomplete(self, completion: Completion) -> bool:
        return bool(await self.inner.acomplete(completion))

    async def arelease(self, key_hash: str, owner: str) -> bool:
        return bool(await self.inner.arelease(key_hash, owner))

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return bool(await self.inner.arenew(key_hash, owner, lock_expires_at))


def build_store(spec: dict[str, Any], clock: Clock = SYSTEM_CLOCK) -> Any:
    """The store a job description names (sync and async methods alike)."""
    if spec["kind"] == "sqlite":
        return SQLiteStore(spec["path"], clock=clock)
    if spec["kind"] == "redis":
        from idempotency_middleware.stores.redis import RedisStore

        return RedisStore(spec["url"], prefix=spec["prefix"], clock=clock)
    if spec["kind"] == "postgres":
        from idempotency_middleware.stores.postgres import PostgresStore

        return PostgresStore(spec["dsn"], table=spec["table"], clock=clock)
    return DynamoDBStore(
        spec["table"], endpoint_url=spec["endpoint"], region_name=REGION, clock=clock
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HOLD_TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(POLL_SECONDS)


def make_work(
    store: SyncStore,
    *,
    runs: str | Path,
    hold: dict[str, Any] | None = None,
    lock_timeout_seconds: float = 60,
    wait_seconds: float = 0,
    clock: Clock = SYSTEM_CLOCK,
    on_event: Callable[[IdempotencyEvent], None] | None = None,
    fail: bool = False,
) -> Callable[[str], str]:
    """The idempotent function: records its run, holds as ``hold`` says, returns who ran."""

    @idempotent(
        store=store,
        key="key",
        name=NAME,
        lock_timeout_seconds=lock_timeout_seconds,
        wait_seconds=wait_seconds,
        clock=clock,
        on_event=on_event,
    )
    def work(key: str) -> str:
        append_line(runs, f"ran {os.getpid()}")
        if hold is not None and "until_file" in hold:
            wait_for(Path(hold["until_file"]).exists, hold["until_file"])
        elif hold is not None:
            expected, log = int(hold["until_held"]), hold["log"]
            wait_for(lambda: len(set(read_lines(log))) >= expected, f"{expected} held claims")
        if fail:
            raise WorkFailed(f"failed in {os.getpid()}")
        return f"ran in {os.getpid()}"

    return work


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    pid = os.getpid()
    inner = build_store(spec["store"])
    store: Any = inner
    hold = spec.get("hold")
    if hold is not None and "log" in hold:
        log = hold["log"]
        store = ObservedStore(store, lambda: append_line(log, f"held {pid}"))
    events: list[str] = []
    work = make_work(
        store,
        runs=spec["runs"],
        hold=hold,
        lock_timeout_seconds=spec.get("lock_timeout_seconds", 60),
        wait_seconds=spec.get("wait_seconds", 0),
        on_event=lambda event: events.append(event.kind),
        fail=spec.get("fail", False),
    )
    output: dict[str, Any] = {"pid": pid}
    try:
        output["result"] = work(spec["key"])
        output["outcome"] = "ran" if f"ran {pid}" in read_lines(spec["runs"]) else "replayed"
    except KeyInProgressError as error:
        output.update(outcome="in_progress", retry_after=error.retry_after)
    except WorkFailed as error:
        output.update(outcome="failed", error=str(error))
    except Exception as error:
        output.update(outcome="error", error=repr(error))
    finally:
        inner.close()
    output["events"] = events
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
