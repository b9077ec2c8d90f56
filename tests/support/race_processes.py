"""Where the cross-process races get their processes: multiprocessing's forkserver, with
the package, the store clients and the race workers imported once in the server process.

A spawned process is a fresh interpreter importing all of that again, about a second of CPU
under coverage for each of the several processes of every race; a forked one starts with
it. Forking the test process itself is not safe (it runs server and client threads); the
forkserver is a process of its own that runs no thread, started once per pytest process.
"""

from __future__ import annotations

import multiprocessing

RACES = multiprocessing.get_context("forkserver")
RACES.set_forkserver_preload(
    [
        "idempotency_middleware",
        "idempotency_middleware.stores.postgres",
        "idempotency_middleware.stores.redis",
        "tests.support.action_workers",
        "tests.support.race_worker",
    ]
)
