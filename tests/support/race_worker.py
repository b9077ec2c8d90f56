"""A worker process of the contract suite's one-winner race (tests/contract/test_store_contract.py).

Its own small module, so the race's processes (tests/support/race_processes.py) import the package
and this, not the test module with its servers and SDKs.
"""

from __future__ import annotations

from typing import Any

from idempotency_middleware.stores import Claimed, ClaimRequest


def open_spec(spec: tuple[str, ...]) -> Any:
    """The sync store a spec names: ``("sqlite", path)``, ``("dynamodb", endpoint, table)``,
    ``("redis", url, prefix)`` or ``("postgres", dsn, table)``."""
    backend, *where = spec
    if backend == "sqlite":
        from idempotency_middleware import SQLiteStore

        return SQLiteStore(where[0])
    if backend == "dynamodb":
        from idempotency_middleware import DynamoDBStore

        return DynamoDBStore(where[1], endpoint_url=where[0], region_name="us-east-1")
    if backend == "redis":
        from idempotency_middleware import RedisStore

        return RedisStore(where[0], prefix=where[1])
    from idempotency_middleware import PostgresStore

    return PostgresStore(where[0], table=where[1])


def claim_in_a_process(
    spec: tuple[str, ...], requests: list[ClaimRequest], start: Any, results: Any
) -> None:
    """``requests`` in rounds, one claim (of its own key) a round, every process's claim of
    a round released at once by the ``start`` barrier; each outcome as text on ``results``
    (or what went wrong, so the test fails with it instead of waiting)."""
    try:
        store = open_spec(spec)
        try:
            store.get(requests[0].key_hash)  # connected before the first start line
            outcomes = []
            for request in requests:
                start.wait()
                result = store.claim(request)
                outcomes.append(
                    f"{request.key_hash} claimed {request.owner}"
                    if isinstance(result, Claimed)
                    else f"{request.key_hash} held {result.record.owner}"
                )
        finally:
            store.close()
    except BaseException as error:  # reported to the test, which fails with it
        start.abort()  # the others stop waiting for this one
        results.put([f"error: {error!r}"])
        raise
    results.put(outcomes)
