"""A worker process for the cross-process one-time action tests (started with the ``spawn``
method, so it must be importable): several threads in it consume one action, on one SQLite
file or in one Redis or PostgreSQL namespace, at the same instant as the other processes'
threads."""

from __future__ import annotations

import os
import threading
from typing import Any

from idempotency_middleware import ActionError, OneTimeActions, SQLiteStore
from idempotency_middleware.stores.postgres import PostgresStore
from idempotency_middleware.stores.redis import RedisStore

TIMEOUT = 60.0

Outcome = tuple[str, Any]

# Where the action is: ("sqlite", path), ("redis", url, prefix), ("postgres", dsn, table).
StoreSpec = tuple[str, ...]


def open_store(spec: StoreSpec) -> Any:
    """The store ``spec`` names, as a process of its own opens it."""
    if spec[0] == "sqlite":
        return SQLiteStore(spec[1])
    if spec[0] == "redis":
        return RedisStore(spec[1], prefix=spec[2])
    return PostgresStore(spec[1], table=spec[2])


def attempt(actions: OneTimeActions, action_id: str, pin: str | None, label: str) -> Outcome:
    """One consume: ``("consumed", label)``, or the error's name and what it carries."""
    try:
        consumed = actions.consume(action_id, pin=pin, reason=label)
    except ActionError as error:
        return type(error).__name__, getattr(error, "attempts_left", None)
    except Exception as error:  # reported, so the test fails saying what happened
        return "error", repr(error)
    return "consumed", consumed.consumed_reason


def consume_in_threads(
    spec: StoreSpec, action_id: str, pins: list[str | None], ready: Any, go: Any, results: Any
) -> None:
    """One thread per PIN (``None``: no PIN), all waiting on ``go``; the outcomes go to
    ``results`` as one list."""
    try:
        with open_store(spec) as store:
            actions = OneTimeActions(store)
            actions.get("warm-up")  # the connection and the table exist before the start
            outcomes: list[Outcome] = []
            lock = threading.Lock()

            def consumer(number: int, pin: str | None) -> None:
                go.wait(TIMEOUT)
                outcome = attempt(actions, action_id, pin, f"{os.getpid()}-{number}")
                with lock:
                    outcomes.append(outcome)

            threads = [
                threading.Thread(target=consumer, args=(number, pin))
                for number, pin in enumerate(pins)
            ]
            for thread in threads:
                thread.start()
            ready.put(os.getpid())
            for thread in threads:
                thread.join(TIMEOUT)
            results.put(outcomes)
    except BaseException as error:
        ready.put(os.getpid())
        results.put([("error", repr(error))])
