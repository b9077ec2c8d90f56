"""Failover under load: the store's primary SIGKILLed mid-run, with the failover option off
and on, on real replicated servers (``tests/support/replicated_servers.py``).

Set-ups: Redis with two replicas and three Sentinels, a Redis Cluster of three primaries
with two replicas each (one primary SIGKILLed: a third of the keys fail over; the cluster
promotes its replica after ``cluster-node-timeout``, 1 s), and PostgreSQL with a streaming
standby (promoted by ``pg_ctl promote`` a second after the crash, as a failover manager
would); each with its replicas local, and 300 ms behind (a ``LagProxy``: the backlog of a
loaded primary, which a crash of its host loses; the proxy drops what it holds when the
primary dies). The Sentinels keep the lagged replicas behind the proxy (their failover-timeout
is Sentinel's default, 3 minutes), and the run checks at the crash that they still are. The
option: ``RedisStore(replicas=1, replica_timeout_seconds=2)`` (``WAIT``; 2 s, above the
lagged round trip), ``PostgresStore(synchronous_commit="on")`` with the standby in
``synchronous_standby_names``.

Three worker processes: two uvicorn servers (``IdempotencyMiddleware``) and one
``IdempotentConsumer`` loop (``benchmarks/failover_app.py``). Each key is sent by two senders
at once (an HTTP key: two POSTs with the same ``Idempotency-Key``; a consumer key: the same
message delivered twice), each retried (503, 409, a dropped connection; a ``retry`` verdict)
until answered. Halfway through the keys, the primary (its whole process group) is SIGKILLed.
Every handler run is counted from the handlers' own ledger.

Printed per set-up, off and on: keys run twice (per 1,000), keys whose two senders got
different answers, requests answered 503 (and consumer ``retry`` verdicts), the failover
(from the crash to a new primary accepting writes: what a finished handler's completion must
outlast, ``FINISH_SECONDS``), the time from the crash to the first new request answered, and
the latency price (p50, p99 of the HTTP requests answered at their first try before the
crash).

    python -m benchmarks.failover [--keys 600]
        [--setups redis,redis-lag,redis-cluster,postgres,postgres-lag]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import contextlib
import json
import multiprocessing
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks._common import heading, machine_summary, quantile, table, wait_for_port
from benchmarks.failover_app import consume
from tests.support.ports import free_port
from tests.support.replicated_servers import crash as kill
from tests.support.replicated_servers import postgres_pair, redis_cluster_set, redis_sentinel_set

SETUPS: dict[str, tuple[str, float]] = {
    "redis": ("Redis + Sentinel, replicas local", 0.0),
    "redis-lag": ("Redis + Sentinel, replicas 300 ms behind", 0.3),
    "redis-cluster": ("Redis Cluster, 3 primaries + 2 replicas each, local", 0.0),
    "postgres": ("PostgreSQL + standby, local", 0.0),
    "postgres-lag": ("PostgreSQL + standby, 300 ms behind", 0.3),
}
# The price of the option on a healthy set-up: replicas local, or a cross-zone 30 ms away.
PRICE_SETUPS: dict[str, tuple[str, float]] = {
    "redis": ("Redis + Sentinel, replicas local", 0.0),
    "redis-lag": ("Redis + Sentinel, replicas 30 ms away", 0.03),
    "postgres": ("PostgreSQL + standby, local", 0.0),
    "postgres-lag": ("PostgreSQL + standby, 30 ms away", 0.03),
}
CONCURRENT_KEYS = 16
PROMOTE_AFTER_SECONDS = 1.0  # a failover manager's detection time (PostgreSQL)
RETRY_PAUSE_SECONDS = 0.05
GIVE_UP_SECONDS = 120.0


@dataclass
class Result:
    keys: int = 0
    twice: int = 0
    different: int = 0
    refused: int = 0  # HTTP 503s
    retries: int = 0  # consumer retry verdicts
    recovery: float | None = None
    failover: float | None = None  # crash to a new primary accepting writes
    latencies: list[float] = field(default_factory=list)
    unanswered: int = 0


class Run:
    """One set-up, option off or on: the workers, the senders, the crash."""

    def __init__(self, settings: dict[str, Any], crash: Callable[[], float], keys: int) -> None:
        self.settings, self.crash, self.keys = settings, crash, keys
        self.result = Result(keys=keys)
        self.crashed_at: float | None = None
        self.lock = threading.Lock()
        self.done = 0
        self.pending: dict[int, Future[tuple[str, Any]]] = {}
        self.numbers = iter(range(1 << 62))

    def note_answer(self, first_sent: float, first_try: bool, elapsed: float, http: bool) -> None:
        with self.lock:
            crashed = self.crashed_at
            if crashed is None:
                if first_try and http:
                    self.result.latencies.append(elapsed)
            elif first_sent >= crashed and self.result.recovery is None:
                self.result.recovery = time.monotonic() - crashed

    def send_http(self, client: httpx.Client, ports: Sequence[int], key: str, lane: int) -> Any:
        first_sent, number = time.monotonic(), 0
        while time.monotonic() - first_sent < GIVE_UP_SECONDS:
            port = ports[(lane + number) % len(ports)]
            started = time.monotonic()
            number += 1
            try:
                answer = client.post(
                    f"http://127.0.0.1:{port}/orders",
                    json={"key": key},
                    headers={"Idempotency-Key": key},
                )
            except httpx.HTTPError:
                time.sleep(RETRY_PAUSE_SECONDS)
                continue
            if answer.status_code == 201:
                self.note_answer(first_sent, number == 1, time.monotonic() - started, True)
                return answer.json()["run"]
            if answer.status_code == 503:
                with self.lock:
                    self.result.refused += 1
            time.sleep(RETRY_PAUSE_SECONDS)
        return None

    def send_message(self, inbox: Any, key: str) -> Any:
        first_sent, number = time.monotonic(), 0
        while time.monotonic() - first_sent < GIVE_UP_SECONDS:
            delivery = next(self.numbers)
            waiting: Future[tuple[str, Any]] = Future()
            with self.lock:
                self.pending[delivery] = waiting
            number += 1
            inbox.put((delivery, {"key": key}))
            action, value = waiting.result(timeout=GIVE_UP_SECONDS)
            if action == "ack":
                self.note_answer(first_sent, number == 1, 0.0, False)
                return value
            with self.lock:
                self.result.retries += 1
            time.sleep(RETRY_PAUSE_SECONDS)
        return None

    def one_key(self, index: int, client: httpx.Client, ports: Sequence[int], inbox: Any) -> None:
        key = f"k{index}-{uuid.uuid4().hex[:8]}"
        with ThreadPoolExecutor(2) as senders:
            if index % 3 == 2:
                answers = list(senders.map(lambda _: self.send_message(inbox, key), range(2)))
            else:
                answers = list(
                    senders.map(lambda lane: self.send_http(client, ports, key, lane), range(2))
                )
        with self.lock:
            if None in answers:
                self.result.unanswered += 1
            elif answers[0] != answers[1]:
                self.result.different += 1
            self.done += 1
            halfway = self.done == self.keys // 2
        if halfway:
            crashed = self.crash()  # (the kill's time: not the checks' before it)
            with self.lock:
                self.crashed_at = crashed

    def deliver_answers(self, outbox: Any) -> None:
        while (answer := outbox.get()) is not None:
            number, action, value = answer
            with self.lock:
                waiting = self.pending.pop(number)
            waiting.set_result((action, value))


@contextlib.contextmanager
def workers(settings: dict[str, Any]) -> Iterator[tuple[list[int], Any, Any]]:
    """Two uvicorn servers and one consumer process; their ports, the consumer's queues."""
    environment = dict(os.environ, BENCH_FAILOVER=json.dumps(settings))
    root = str(Path(__file__).resolve().parent.parent)
    environment["PYTHONPATH"] = root + os.pathsep + environment.get("PYTHONPATH", "")
    ports = [free_port(), free_port()]
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "benchmarks.failover_app:http_app",
                "--port",
                str(port),
                "--log-level",
                "error",
                "--no-access-log",
            ],
            env=environment,
            cwd=root,
            stderr=subprocess.DEVNULL,  # (their store errors are counted, not read)
        )
        for port in ports
    ]
    spawn = multiprocessing.get_context("spawn")
    inbox, outbox = spawn.Queue(), spawn.Queue()
    consumer = spawn.Process(target=consume, args=(settings, inbox, outbox), daemon=True)
    try:  # (the servers are stopped whatever fails from here on)
        consumer.start()
        for port, server in zip(ports, servers, strict=True):
            wait_for_port(port, server)
        yield ports, inbox, outbox
    finally:
        inbox.put(None)
        if consumer.pid is not None:
            consumer.join(10)
            if consumer.is_alive():
                consumer.kill()
        for server in servers:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)
            if server.poll() is None:
                server.kill()


def measure(setup: str, on: bool, keys: int) -> Result:
    kind = setup.removesuffix("-lag")
    lag = SETUPS[setup][1]
    failed_over: list[float] = []  # (set by a watcher thread once the new primary writes)
    watchers: list[threading.Thread] = []  # (joined before the servers stop)
    with tempfile.TemporaryDirectory(prefix="idem-failover-") as directory:
        ledger = str(Path(directory) / "ledger")
        Path(ledger).touch()
        settings: dict[str, Any] = {"kind": kind, "on": on, "ledger": ledger}
        with contextlib.ExitStack() as stack:
            crash: Callable[[], float]
            if kind == "redis":
                servers = stack.enter_context(redis_sentinel_set(lag_seconds=lag, replicas=2))
                settings["sentinels"] = servers.sentinel_ports
                # The WAIT's round trip through the lag, with room for a loaded machine; the
                # sockets outlast it.
                settings["replica_timeout"] = 0.5 + 5 * lag
                settings["socket_timeout"] = 1.0 + 10 * lag

                def crash() -> float:
                    if lag and not servers.replicas_lagged():
                        raise RuntimeError("Sentinel re-pointed a lagged replica: rows invalid")
                    old, crashed = servers.crash_primary(), time.monotonic()

                    def watch() -> None:
                        servers.wait_for_failover(old, timeout=GIVE_UP_SECONDS)
                        failed_over.append(time.monotonic() - crashed)

                    watchers.append(threading.Thread(target=watch, daemon=True))
                    watchers[-1].start()
                    return crashed

            elif kind == "redis-cluster":
                # Two replicas a primary, as the Sentinel set has: with one, the promoted
                # replica has none, and replicas=1 refuses its shard's claims from then on
                # (measured: 15 of 90 keys unanswered in 120 s).
                cluster = stack.enter_context(redis_cluster_set(replicas=2))
                settings["cluster"] = cluster.ports
                # A slot of the primary that dies: a third of the keys (the store's keys hash
                # to all three primaries).
                victim = "failover:crash"
                old = cluster.primary_of(victim)  # (found now: the kill itself is instant)

                def crash() -> float:
                    kill(cluster.processes[old])
                    crashed = time.monotonic()

                    def watch() -> None:
                        cluster.wait_for_failover(victim, old, timeout=GIVE_UP_SECONDS)
                        failed_over.append(time.monotonic() - crashed)

                    watchers.append(threading.Thread(target=watch, daemon=True))
                    watchers[-1].start()
                    return crashed

            else:
                pair = stack.enter_context(postgres_pair(lag_seconds=lag))
                if on:
                    pair.set_synchronous_standby("standby")
                settings["dsn"] = pair.dsn
                from idempotency_middleware import PostgresStore

                with PostgresStore(pair.dsn, table="failover") as maker:
                    maker.create_table()

                def crash() -> float:
                    pair.crash_primary()
                    crashed = time.monotonic()

                    def promote() -> None:
                        pair.promote()
                        failed_over.append(time.monotonic() - crashed)

                    watchers.append(threading.Timer(PROMOTE_AFTER_SECONDS, promote))
                    watchers[-1].start()
                    return crashed

            ports, inbox, outbox = stack.enter_context(workers(settings))
            run = Run(settings, crash, keys)
            answers = threading.Thread(target=run.deliver_answers, args=(outbox,), daemon=True)
            answers.start()
            try:
                with (
                    httpx.Client(timeout=10.0) as client,
                    ThreadPoolExecutor(CONCURRENT_KEYS) as pool,
                ):
                    list(pool.map(lambda i: run.one_key(i, client, ports, inbox), range(keys)))
            finally:  # (a short run can end before the failover does)
                for watcher in watchers:
                    watcher.join(GIVE_UP_SECONDS)
                outbox.put(None)
                answers.join(GIVE_UP_SECONDS)
        runs = Counter(line for line in Path(ledger).read_text().splitlines() if line)
        run.result.twice = sum(1 for count in runs.values() if count > 1)
        run.result.failover = failed_over[0] if failed_over else None
        return run.result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def report(results: dict[tuple[str, bool], Result]) -> str:
    rows = []
    for (setup, on), result in results.items():
        lat = sorted(result.latencies)
        rows.append(
            [
                SETUPS[setup][0],
                "on" if on else "off",
                str(result.keys),
                str(result.twice),
                f"{result.twice * 1000 / result.keys:.2f}",
                str(result.different),
                str(result.unanswered),
                str(result.refused),
                str(result.retries),
                "-" if result.failover is None else f"{result.failover:.2f}",
                "-" if result.recovery is None else f"{result.recovery:.2f}",
                _ms(quantile(lat, 0.5)) if lat else "-",
                _ms(quantile(lat, 0.99)) if lat else "-",
            ]
        )
    headers = [
        "set-up", "option", "keys", "run twice", "per 1,000", "different answers",
        f"unanswered in {GIVE_UP_SECONDS:.0f} s", "503s", "retry verdicts", "failover (s)",
        "recovery (s)", "p50 (ms)", "p99 (ms)",
    ]  # fmt: skip
    return table("Failover under load (primary SIGKILLed halfway)", headers, rows)


def _price(store: Any, requests: int) -> list[float]:
    """Seconds per request (a claim and its completion), ``requests`` of them, sorted."""
    from idempotency_middleware.stores.protocol import ClaimRequest, Completion
    from idempotency_middleware.stores.records import StoredResponse

    response = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 1}')
    took = []
    for _ in range(requests):
        key_hash, now = uuid.uuid4().hex * 2, time.time()
        started = time.perf_counter()
        store.claim(ClaimRequest(key_hash, "f" * 64, "owner-1", now, now + 30, now - 1))
        store.complete(Completion(key_hash, "owner-1", now, 3600.0, response))
        took.append(time.perf_counter() - started)
    return sorted(took)


def price(requests: int) -> str:
    """The latency price of the option per request, off and on, on each set-up (healthy)."""
    from redis.sentinel import Sentinel

    from idempotency_middleware import PostgresStore, RedisStore

    rows = []
    for setup, (name, lag) in PRICE_SETUPS.items():
        with contextlib.ExitStack() as stack:
            stores: list[tuple[str, Any]] = []
            if setup.startswith("redis"):
                servers = stack.enter_context(redis_sentinel_set(lag_seconds=lag, replicas=2))
                addresses = [("127.0.0.1", port) for port in servers.sentinel_ports]
                watchers: Any = Sentinel(addresses)  # type: ignore[no-untyped-call]
                for on in (0, 1):
                    client = watchers.master_for("mymaster", socket_timeout=2.0)
                    stores.append(("on" if on else "off", RedisStore(client=client, replicas=on)))
            else:
                pair = stack.enter_context(postgres_pair(lag_seconds=lag))
                for option in (None, "on"):
                    # Off: the standby asynchronous; on: synchronous, and the store waiting.
                    pair.set_synchronous_standby("standby" if option else "")
                    made = PostgresStore(pair.dsn, synchronous_commit=option)
                    made.create_table()
                    with made:
                        _price(made, 20)
                        took = _price(made, requests)
                    label = "on" if option else "off"
                    rows.append([name, label, _ms(quantile(took, 0.5)), _ms(quantile(took, 0.99))])
            for label, store in stores:
                with store:
                    _price(store, 20)  # (warm: connections, scripts)
                    took = _price(store, requests)
                rows.append([name, label, _ms(quantile(took, 0.5)), _ms(quantile(took, 0.99))])
    headers = ["set-up", "option", "p50 (ms)", "p99 (ms)"]
    return table(
        f"The failover option's price: a claim and its completion ({requests})", headers, rows
    )


def price_main(argv: Sequence[str] | None = None) -> None:
    """``make bench``'s part: the latency price only (no crash)."""
    parser = argparse.ArgumentParser(description="the failover option's latency price")
    parser.add_argument("--requests", type=int, default=300)
    arguments = parser.parse_args(argv)
    heading("Failover option: latency price")
    print(price(arguments.requests))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=600)
    parser.add_argument("--setups", default=",".join(SETUPS))
    arguments = parser.parse_args(argv)
    heading("Failover under load")
    print(machine_summary())
    results: dict[tuple[str, bool], Result] = {}
    for setup in arguments.setups.split(","):
        for on in (False, True):
            results[setup, on] = measure(setup, on, arguments.keys)
            done = results[setup, on]
            print(
                f"  {setup}, option {'on' if on else 'off'}: {done.twice} keys run twice, "
                f"{done.refused} 503s, failover {done.failover}, recovery {done.recovery}",
                flush=True,
            )
    print(report(results))
    print()
    print(price(300))


if __name__ == "__main__":
    main()
