"""The worker processes of ``benchmarks.failover``: an ASGI app behind ``IdempotencyMiddleware``
(served by uvicorn, ``--factory benchmarks.failover_app:http_app``) and an
``IdempotentConsumer`` loop (:func:`consume`), on a replicated store that
``BENCH_FAILOVER`` (JSON) names. Every handler run appends its key to the ledger file, the
count the benchmark trusts (one ``write`` of one line on an ``O_APPEND`` file: whole lines
even from several processes).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

LEDGER_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(os.environ["BENCH_FAILOVER"])
    return loaded


def record_run(ledger: str, key: str) -> None:
    descriptor = os.open(ledger, LEDGER_FLAGS, 0o644)
    try:
        os.write(descriptor, f"{key}\n".encode())
    finally:
        os.close(descriptor)


def store(settings: dict[str, Any], asynchronous: bool) -> Any:
    """The store the settings name, with the failover option on or off."""
    from idempotency_middleware import PostgresStore, RedisStore

    on = bool(settings["on"])
    if settings["kind"] == "postgres":
        return PostgresStore(
            settings["dsn"],
            table="failover",
            synchronous_commit="on" if on else None,
            connect_timeout=1.0,
            purge_interval_seconds=None,
        )
    timeouts: dict[str, Any] = {
        "socket_timeout": settings.get("socket_timeout", 1.0),
        "socket_connect_timeout": 0.5,
    }
    waits = {"replicas": int(on), "replica_timeout_seconds": settings.get("replica_timeout", 0.5)}
    if settings["kind"] == "redis-cluster":
        client = cluster_client(settings, asynchronous, timeouts)
        sides = {"async_client" if asynchronous else "client": client}
        return RedisStore(**sides, prefix="failover:", **waits)
    addresses = [("127.0.0.1", port) for port in settings["sentinels"]]
    if asynchronous:
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        watchers: Any = AsyncSentinel(addresses)  # type: ignore[no-untyped-call]
        client = watchers.master_for("mymaster", **timeouts)
        return RedisStore(async_client=client, prefix="failover:", **waits)
    from redis.sentinel import Sentinel

    sentinel: Any = Sentinel(addresses)  # type: ignore[no-untyped-call]
    sync_client = sentinel.master_for("mymaster", **timeouts)
    return RedisStore(client=sync_client, prefix="failover:", **waits)


def cluster_client(settings: dict[str, Any], asynchronous: bool, options: dict[str, Any]) -> Any:
    """A Redis Cluster client over the set's nodes (``options``: its timeouts); it finds the
    promoted replica itself."""
    if asynchronous:
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        from redis.asyncio.cluster import RedisCluster as AsyncCluster

        nodes: Any = [AsyncNode("127.0.0.1", port) for port in settings["cluster"]]
        return AsyncCluster(startup_nodes=nodes, **options)
    from redis.cluster import ClusterNode, RedisCluster

    sync_nodes = [ClusterNode("127.0.0.1", port) for port in settings["cluster"]]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=sync_nodes, **options)


def quiet() -> None:
    """The workers' store errors are the point of the run: counted, not logged."""
    import logging

    for name in ("idempotency_middleware", "psycopg"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def http_app() -> Any:
    """uvicorn's factory: POST /orders (body ``{"key": ...}``) answers 201 with a new run id."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idempotency_middleware import IdempotencyMiddleware

    settings = config()

    async def create_order(request: Request) -> JSONResponse:
        order = await request.json()
        record_run(settings["ledger"], order["key"])
        return JSONResponse({"run": uuid.uuid4().hex}, status_code=201)

    middleware = [Middleware(IdempotencyMiddleware, store=store(settings, asynchronous=True))]
    return Starlette(
        routes=[Route("/orders", create_order, methods=["POST"])], middleware=middleware
    )


def consume(settings: dict[str, Any], inbox: Any, outbox: Any, threads: int = 4) -> None:
    """The consumer worker: deliveries ``(delivery_id, message)`` from ``inbox``, each one's
    ``(delivery_id, action, value)`` to ``outbox``; ``None`` stops it."""
    from idempotency_middleware import IdempotentConsumer

    quiet()

    def handle(message: dict[str, str]) -> str:
        record_run(settings["ledger"], message["key"])
        return uuid.uuid4().hex

    consumer = IdempotentConsumer(
        handle, store=store(settings, asynchronous=False), key=lambda message: message["key"]
    )

    def serve() -> None:
        while (delivery := inbox.get()) is not None:
            number, message = delivery
            try:
                outcome = consumer.process(message)
                outbox.put((number, outcome.action, outcome.result))
            except Exception as error:  # (a delivery the broker sends again)
                outbox.put((number, "retry", repr(error)))
        inbox.put(None)  # (for the next thread)

    workers = [threading.Thread(target=serve) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
