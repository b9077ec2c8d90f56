"""Replicated servers on 127.0.0.1, for the failover tests and benchmark: a Redis primary with
a replica and three Sentinels, a Redis Cluster of three primaries with a replica each, and a
PostgreSQL primary with a streaming standby (``pg_basebackup -R``) the test promotes.

Every process started here is stopped by the context manager that started it, and dies with
the test process however that ends (``_die_with_parent``). A replica (or standby) may follow
its primary through a :class:`LagProxy`, which holds every byte ``lag_seconds`` each way and
drops what it still holds from a primary that dies: the replication lag of a loaded primary
(or of replicas in another zone), where a crash of the primary's host loses the writes it had
acknowledged but not yet sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.db_servers import (
    HOST,
    START_TIMEOUT_SECONDS,
    _die_with_parent,
    _postgres_ready,
    _redis_ping,
    _server_user,
    _stop,
    _wait_until,
    postgres_bin_directory,
    redis_server_binary,
)
from tests.support.in_process import refuse_in_an_in_process_run
from tests.support.ports import cluster_port, free_port
from tests.support.session_servers import ServerUnavailable

SERVICE = "mymaster"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Until ``condition()`` holds (polled), else ``AssertionError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if condition():
                return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def _spawn(arguments: list[str], log: Path, user: str | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as log_file:
        return subprocess.Popen(
            arguments,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            user=user,
            start_new_session=True,  # (its own group: a crash kills every process of it)
            preexec_fn=_die_with_parent,
        )


def crash(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server and every process of its group, as a host crash would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _stop_all(processes: dict[Any, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        _stop(process, signal.SIGKILL)


# --- a TCP proxy that delays --------------------------------------------------------------


class LagProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream_port``, each chunk ``lag_seconds`` late.

    When the upstream end closes (its server SIGKILLed), the bytes still held from it are
    dropped, not delivered late: the lag stands for writes a primary acknowledged and had not
    sent yet, which a crash of its host loses. (Bytes on the wire would still arrive; a proxy
    that delivered them after the crash hid every loss the lag was there to show.)"""

    def __init__(self, upstream_port: int, lag_seconds: float) -> None:
        self.upstream_port, self.lag_seconds = upstream_port, lag_seconds
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="lag-proxy", daemon=True)
        self._ready = threading.Event()

    def __enter__(self) -> LagProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise ServerUnavailable("the lag proxy did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, HOST, self.port, reuse_address=True)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream_port)
        except OSError:
            writer.close()
            return
        # (Cancelled when the proxy stops: the connection ends with it, quietly.)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(
                self._pipe(reader, up_writer),
                self._pipe(up_reader, writer, lost_at_end=True),
                return_exceptions=True,
            )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lost_at_end: bool = False
    ) -> None:
        """``reader`` to ``writer``, ``lag_seconds`` late; with ``lost_at_end``, what is still
        held when ``reader`` ends is dropped and ``writer`` reset."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()

        sending = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.lag_seconds, data))
        finally:
            if lost_at_end:
                sending.cancel()
                writer.transport.abort()
            else:
                queue.put_nowait((0.0, b""))
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await sending
            writer.close()


# --- Redis: primary, replica, three Sentinels ---------------------------------------------


def _redis_args(port: int, directory: Path, *more: str) -> list[str]:
    return [
        redis_server_binary(),
        "--bind",
        HOST,
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(directory),
        "--logfile",
        "",
        *more,
    ]


def _redis(port: int) -> Any:
    import redis

    return redis.Redis(host=HOST, port=port, socket_timeout=5, socket_connect_timeout=2)


@dataclass
class SentinelSet:
    """A primary, its replica and three Sentinels watching them (service ``SERVICE``)."""

    directory: Path
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)  # by port
    primary_port: int = 0
    replica_port: int = 0
    sentinel_ports: list[int] = field(default_factory=list)
    replica_ports: list[int] = field(default_factory=list)
    lag_port: int = 0  # the LagProxy's port the replicas follow (0: they follow the primary)

    def sentinel(self, **options: Any) -> Any:
        """A redis-py ``Sentinel`` on the three Sentinels."""
        from redis.sentinel import Sentinel

        options.setdefault("socket_timeout", 1.0)
        addresses = [(HOST, port) for port in self.sentinel_ports]
        return Sentinel(  # type: ignore[no-untyped-call]
            addresses, sentinel_kwargs={"socket_timeout": 1.0}, **options
        )

    def primary_now(self) -> int:
        """The primary's port, as the Sentinels' majority says it."""
        from redis.sentinel import Sentinel

        sentinel: Any = Sentinel([(HOST, p) for p in self.sentinel_ports])  # type: ignore[no-untyped-call]
        return int(sentinel.discover_master(SERVICE)[1])

    def replicas_lagged(self) -> bool:
        """Whether every replica still follows the primary through the :class:`LagProxy`
        (Sentinel has not re-pointed one at the primary itself)."""
        return bool(self.lag_port) and all(
            int(_redis(port).info("replication")["master_port"]) == self.lag_port
            for port in self.replica_ports
        )

    def crash_primary(self) -> int:
        """SIGKILL the current primary; its port."""
        port = self.primary_now()
        crash(self.processes[port])
        return port

    def wait_for_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until the Sentinels name a new primary that accepts writes; its port."""
        wait_for(lambda: self.primary_now() != old_port, "Sentinel promoting the replica", timeout)
        port = self.primary_now()
        wait_for(lambda: _redis(port).info("replication")["role"] == "master", "promotion", timeout)
        return port


@contextlib.contextmanager
def redis_sentinel_set(lag_seconds: float = 0.0, replicas: int = 1) -> Iterator[SentinelSet]:
    """A :class:`SentinelSet` for the block (``replicas`` of them: ``replica_port`` is the
    first's); its replicas through a :class:`LagProxy` when ``lag_seconds``."""
    refuse_in_an_in_process_run("A Redis Sentinel set")
    with (
        tempfile.TemporaryDirectory(prefix="idem-sentinel-") as name,
        contextlib.ExitStack() as stack,
    ):
        directory = Path(name)
        servers = SentinelSet(directory)
        stack.callback(_stop_all, servers.processes)
        servers.primary_port, servers.replica_port = free_port(), free_port()
        replica_ports = [servers.replica_port, *(free_port() for _ in range(replicas - 1))]
        servers.replica_ports = replica_ports
        follow = servers.primary_port
        # Sentinel re-points a replica that follows another address than the primary's own
        # ("+fix-slave-config") once failover-timeout has passed since it first saw it: 5 s
        # rewired a lagged replica straight to the primary long before any crash. Sentinel's
        # default, 3 minutes, keeps it behind the proxy for a run (``replicas_lagged``).
        failover_timeout_ms = 5000
        if lag_seconds:
            follow = stack.enter_context(LagProxy(servers.primary_port, lag_seconds)).port
            servers.lag_port, failover_timeout_ms = follow, 180_000
        nodes: list[tuple[int, tuple[str, ...]]] = [(servers.primary_port, ())]
        nodes += [(port, ("--replicaof", HOST, str(follow))) for port in replica_ports]
        for port, more in nodes:
            log = directory / f"redis-{port}.log"
            process = _spawn(_redis_args(port, directory, *more), log)
            servers.processes[port] = process
            _wait_until(lambda port=port: _redis_ping(port), process, log)  # type: ignore[misc]
        for port in replica_ports:
            wait_for(
                lambda port=port: _redis(port).info("replication")["master_link_status"] == "up",  # type: ignore[misc]
                "the replicas in sync",
            )
        for _ in range(3):
            port = free_port()
            config = directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind {HOST}\ndir {directory}\n"
                f"sentinel monitor {SERVICE} {HOST} {servers.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 500\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
            )
            log = directory / f"sentinel-{port}.log"
            process = _spawn([redis_server_binary(), str(config), "--sentinel"], log)
            servers.processes[port] = process
            servers.sentinel_ports.append(port)
            _wait_until(lambda port=port: _redis_ping(port), process, log)  # type: ignore[misc]

        def every_sentinel_knows_all() -> bool:
            for port in servers.sentinel_ports:
                sentinel = _redis(port)
                others = sentinel.execute_command("SENTINEL", "SENTINELS", SERVICE)
                known = sentinel.execute_command("SENTINEL", "REPLICAS", SERVICE)
                if len(others) < 2 or len(known) < len(replica_ports):
                    return False
            return True

        wait_for(every_sentinel_knows_all, "the Sentinels finding each other and the replica")
        yield servers


# --- Redis Cluster: three primaries, a replica each ----------------------------------------


def redis_cli_binary() -> str:
    """``redis-cli`` beside the ``redis-server`` the tests use, or on the PATH."""
    beside = Path(redis_server_binary()).parent / "redis-cli"
    if os.access(beside, os.X_OK):
        return str(beside)
    import shutil

    found = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if found is None:
        raise ServerUnavailable("no redis-cli to create a Redis Cluster with")
    return found


@dataclass
class ClusterSet:
    """Cluster nodes: three primaries, and their replicas."""

    directory: Path
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ports(self) -> list[int]:
        return list(self.processes)

    def client(self, **options: Any) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(HOST, port) for port in self.ports]  # type: ignore[no-untyped-call]
        options.setdefault("socket_timeout", 2.0)
        return RedisCluster(startup_nodes=nodes, **options)

    def primary_of(self, key: str) -> int:
        """The port of the primary holding ``key`` now."""
        with contextlib.closing(self.client()) as cluster:
            return int(cluster.get_node_from_key(key).port)

    def crash_primary_of(self, key: str) -> int:
        """SIGKILL the primary holding ``key``; its port."""
        port = self.primary_of(key)
        crash(self.processes[port])
        return port

    def wait_for_failover(self, key: str, old_port: int, timeout: float = 30.0) -> None:
        def promoted() -> bool:
            alive = [p for p in self.ports if p != old_port]
            info = _redis(alive[0]).execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" not in info:
                return False
            with contextlib.closing(self.client()) as cluster:
                return int(cluster.get_node_from_key(key).port) != old_port

        wait_for(promoted, "the cluster promoting a replica", timeout)


@contextlib.contextmanager
def redis_cluster_set(replicas: int = 1) -> Iterator[ClusterSet]:
    """A :class:`ClusterSet` for the block: three primaries with ``replicas`` each, every slot
    covered, every replica in sync."""
    refuse_in_an_in_process_run("A Redis Cluster")
    cli = redis_cli_binary()
    with tempfile.TemporaryDirectory(prefix="idem-cluster-") as name:
        directory = Path(name)
        servers = ClusterSet(directory)
        try:
            for _ in range(3 * (1 + replicas)):
                port = cluster_port()
                log = directory / f"node-{port}.log"
                arguments = _redis_args(
                    port,
                    directory,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    "1000",
                )
                process = _spawn(arguments, log)
                servers.processes[port] = process
                _wait_until(lambda port=port: _redis_ping(port), process, log)  # type: ignore[misc]
            create = [cli, "--cluster", "create", *(f"{HOST}:{p}" for p in servers.ports)]
            create += ["--cluster-replicas", str(replicas), "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, timeout=60, check=False)
            if done.returncode != 0:
                raise ServerUnavailable(f"redis-cli --cluster create: {done.stdout!r}")

            def ready() -> bool:
                for port in servers.ports:
                    node = _redis(port)
                    if "cluster_state:ok" not in node.execute_command("CLUSTER", "INFO").decode():
                        return False
                    replication = node.info("replication")
                    if replication["role"] == "slave" and replication["master_link_status"] != "up":
                        return False
                return True

            wait_for(ready, "every slot covered, every replica in sync", START_TIMEOUT_SECONDS)
            yield servers
        finally:
            for process in servers.processes.values():
                _stop(process, signal.SIGKILL)


# --- PostgreSQL: primary and streaming standby ---------------------------------------------


@dataclass
class PostgresPair:
    """A primary and its streaming standby (``application_name=standby``)."""

    directory: Path
    user: str | None
    primary_port: int
    standby_port: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        """Both hosts; libpq connects to whichever accepts writes."""
        return (
            f"postgresql://postgres@{HOST}:{self.primary_port},{HOST}:{self.standby_port}"
            "/postgres?target_session_attrs=read-write"
        )

    def node_dsn(self, port: int) -> str:
        return f"postgresql://postgres@{HOST}:{port}/postgres"

    def set_synchronous_standby(self, names: str) -> None:
        """``synchronous_standby_names`` on the primary (``""``: asynchronous)."""
        import psycopg

        with psycopg.connect(self.node_dsn(self.primary_port), autocommit=True) as connection:
            connection.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            connection.execute("SELECT pg_reload_conf()")

    def crash_primary(self) -> None:
        crash(self.processes["primary"])

    def promote(self) -> None:
        """``pg_ctl promote`` the standby, and wait until it accepts writes."""
        bin_directory = postgres_bin_directory()
        standby = str(self.directory / "standby")
        arguments = [str(bin_directory / "pg_ctl"), "promote", "-D", standby]
        subprocess.run(arguments, capture_output=True, user=self.user, check=True, timeout=60)
        import psycopg

        def writable() -> bool:
            with psycopg.connect(self.node_dsn(self.standby_port), connect_timeout=2) as c:
                row = c.execute("SELECT pg_is_in_recovery()").fetchone()
                return row is not None and not row[0]

        wait_for(writable, "the standby promoted")


def _start_postgres(data: Path, port: int, log: Path, user: str | None) -> subprocess.Popen[bytes]:
    settings = {
        "listen_addresses": HOST,
        "port": str(port),
        "unix_socket_directories": str(data.parent),
        "fsync": "off",  # (a crash here kills processes, not the disk's cache)
        "full_page_writes": "off",
        "max_connections": "200",
        "wal_level": "replica",
        "max_wal_senders": "5",
        "hot_standby": "on",
        "wal_keep_size": "256MB",
    }
    arguments = [str(postgres_bin_directory() / "postgres"), "-D", str(data)]
    for name, value in settings.items():
        arguments += ["-c", f"{name}={value}"]
    process = _spawn(arguments, log, user)
    _wait_until(lambda: _postgres_ready(port), process, log)
    return process


@contextlib.contextmanager
def postgres_pair(lag_seconds: float = 0.0) -> Iterator[PostgresPair]:
    """A :class:`PostgresPair` for the block, the standby streaming (through a
    :class:`LagProxy` when ``lag_seconds``)."""
    refuse_in_an_in_process_run("A PostgreSQL primary and standby")
    bin_directory = postgres_bin_directory()
    user = _server_user()
    with (
        tempfile.TemporaryDirectory(prefix="idem-pg-pair-") as name,
        contextlib.ExitStack() as stack,
    ):
        directory = Path(name)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
        pair = PostgresPair(directory, user, free_port(), free_port())
        stack.callback(_stop_all, pair.processes)
        primary, standby = directory / "primary", directory / "standby"
        initdb = [str(bin_directory / "initdb"), "-D", str(primary), "-U", "postgres"]
        initdb += ["-A", "trust", "-E", "UTF8", "--no-sync"]
        done = subprocess.run(initdb, capture_output=True, user=user, check=False)
        if done.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {done.stderr.decode(errors='replace')}")
        (primary / "pg_hba.conf").write_text(
            f"host all all {HOST}/32 trust\nhost replication all {HOST}/32 trust\n"
            "local all all trust\n"
        )
        pair.processes["primary"] = _start_postgres(
            primary, pair.primary_port, directory / "primary.log", user
        )
        backup = [str(bin_directory / "pg_basebackup"), "-h", HOST, "-p", str(pair.primary_port)]
        backup += ["-U", "postgres", "-D", str(standby), "-R", "-X", "stream", "--no-sync"]
        done = subprocess.run(backup, capture_output=True, user=user, check=False, timeout=120)
        if done.returncode != 0:
            raise ServerUnavailable(f"pg_basebackup failed: {done.stderr.decode(errors='replace')}")
        follow = pair.primary_port
        if lag_seconds:
            follow = stack.enter_context(LagProxy(pair.primary_port, lag_seconds)).port
        with (standby / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host={HOST} port={follow} user=postgres "
                "application_name=standby'\n"
            )
        pair.processes["standby"] = _start_postgres(
            standby, pair.standby_port, directory / "standby.log", user
        )
        import psycopg

        def streaming() -> bool:
            with psycopg.connect(pair.node_dsn(pair.primary_port), autocommit=True) as c:
                rows = c.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby' "
                    "AND state = 'streaming'"
                ).fetchall()
                return bool(rows)

        wait_for(streaming, "the standby streaming")
        yield pair
