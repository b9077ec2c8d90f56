"""Chaos test (issue 18): server processes SIGKILLed at random while clients retry.

Four server processes (two uvicorn ``IdempotencyMiddleware``, two waitress
``IdempotencyWSGIMiddleware``, ``tests/support/chaos_app.py``) share one ``SQLiteStore`` file, each
on its own port. Eight client threads work through their own keys, every third one instead
the key shared by all of them that second (duplicates in flight), and retry as real clients
do: the same key and body on connection errors, timeouts, 409 and 503, with backoff
(Retry-After honoured, capped at 1 s), until a 2xx. A killer thread SIGKILLs a
random server every 1-3 s (its seed is printed; ``CHAOS_SEED`` replays a schedule) and starts
a replacement of the same kind on a new port; clients pick a live server for every try.

What must hold at the end, whatever the schedule:

- no response was a 5xx other than 503, nor a 422 (every status is 201, 409 or 503);
- every key completed with 2xx, and every 2xx of one key has the same body (replays);
- the side effects (``<key> <pid>`` lines, fsync'd before the handler's pause): the run
  whose response was stored is the one every 2xx names (its ``pid``). Every process runs a
  key at most once; every run other than the stored one is by a process that was killed;
  and the stored run is the key's *last* line. So the lines by processes that were not
  killed are at most one, and the lines in total are 1 + the runs of killed processes that
  did not store their response: a kill between the side effect and the store makes the
  one re-run the design allows, once the dead owner's lock has run out.
- A kill that lands after the response was stored (the owner stored it, then died before
  its answer went out, or at any later time) has its run as the stored one: it counts as the
  "1", never as a re-run, and the last-line rule proves nothing ran after it. Keys whose
  every 2xx was a replay (the fresh answer never reached anyone) are counted and printed.
- no claim was lost by a live owner (no ``lost`` event): with a 3 s lock renewed every
  second, only a dead owner's claim is taken over, and at least one was; and some key was
  in flight from two clients at once.

Bounded to under a minute: 30 s of chaos, then the killer stops and the clients finish the
key each is on (a dead owner's key waits out its lock, 3 s plus the clock-skew allowance).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import orjson

from idempotency_middleware.policy.keys import storage_key
from tests.support.servers import (
    HOST,
    REPO_ROOT,
    UVICORN_LISTENING,
    WAITRESS_LISTENING,
    server_process,
)

Adapter = Literal["asgi", "wsgi"]

SERVERS: tuple[Adapter, ...] = ("asgi", "wsgi", "asgi", "wsgi")
CLIENTS = 8
CHAOS_SECONDS = 30.0
KILL_EVERY_SECONDS = (1.0, 3.0)
LOCK_SECONDS = 3.0
MAX_PAUSE_SECONDS = 0.3
# After the chaos, how long the clients get to finish their keys. A key waits at most one
# dead owner's lock (3 s, plus the clock-skew allowance) once nothing is killed any more;
# the rest is room for a loaded machine.
DRAIN_SECONDS = 30.0
START_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 10.0
CLIENT_TIMEOUT_SECONDS = 10.0
RETRY_AFTER_CAP_SECONDS = 1.0
BACKOFF_SECONDS = (0.05, 1.0)  # first and largest wait after a connection error
# Every third key of every client is the chaos' shared key of the moment (a new one every
# second), so several clients send one key at once: duplicates in flight.
EVERY_NTH_KEY_SHARED = 3
SHARED_KEY_SECONDS = 1.0
ROUTE = "/orders"
ALLOWED_STATUSES = frozenset({201, 409, 503})
SUCCESS = 201


@dataclass(frozen=True)
class Server:
    adapter: Adapter
    process: subprocess.Popen[bytes]
    url: str


@dataclass
class Fleet:
    """The server processes: started into ``stack`` (each is killed when it closes), the
    live ones, and the pids killed."""

    directory: Path
    env: dict[str, str]
    stack: contextlib.ExitStack
    live: list[Server] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    started: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # live, killed
    starting: threading.Lock = field(default_factory=threading.Lock)  # stack, started

    def start(self, adapter: Adapter) -> Server:
        if adapter == "asgi":
            command = [sys.executable, "-m", "uvicorn", "--factory"]
            command += ["tests.support.chaos_app:create_asgi_app", "--host", HOST, "--port", "0"]
            command += ["--log-level", "info", "--lifespan", "off"]
            listening = UVICORN_LISTENING
        else:
            command = [sys.executable, "-m", "waitress", f"--listen={HOST}:0", "--threads=8"]
            command += ["--call", "tests.support.chaos_app:create_wsgi_app"]
            listening = WAITRESS_LISTENING
        # Only the start-up is serialized: clients keep picking servers while one starts.
        with self.starting:
            self.started += 1
            log = self.directory / f"server-{self.started}-{adapter}.log"
            process, url = self.stack.enter_context(
                server_process(
                    command,
                    env=self.env,
                    log=log,
                    listening=listening,
                    timeout=START_TIMEOUT_SECONDS,
                )
            )
        server = Server(adapter, process, url)
        with self.lock:
            self.live.append(server)
        return server

    def pick(self, rng: random.Random) -> str:
        with self.lock:
            return rng.choice(self.live).url

    def kill(self, rng: random.Random) -> Server:
        """SIGKILL a random live server, out of the clients' choice first."""
        with self.lock:
            victim = self.live.pop(rng.randrange(len(self.live)))
            self.killed.add(victim.process.pid)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(STOP_TIMEOUT_SECONDS)
        return victim

    def stop(self) -> None:
        """SIGTERM the survivors and wait: each saves its coverage data as it exits (a
        process still running when the stack closes is killed)."""
        with self.lock:
            survivors, self.live = self.live, []
        for server in survivors:
            server.process.send_signal(signal.SIGTERM)
        for server in survivors:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(STOP_TIMEOUT_SECONDS)


@dataclass
class Tally:
    """What the clients saw, across threads."""

    statuses: Counter[str] = field(default_factory=Counter)
    bodies: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    fresh: set[str] = field(default_factory=set)  # keys with a 2xx that was not a replay
    # Per key, every try: (client, sent, answered or failed), on the monotonic clock.
    tries: dict[str, list[tuple[int, float, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    unfinished: list[str] = field(default_factory=list)  # keys given up (status or deadline)
    requests: int = 0
    errors: list[str] = field(default_factory=list)  # a client thread's own failure
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(
        self,
        key: str,
        client: int,
        sent: float,
        outcome: str,
        response: httpx.Response | None = None,
    ) -> None:
        with self.lock:
            self.requests += 1
            self.tries[key].append((client, sent, time.monotonic()))
            self.statuses[outcome] += 1
            if response is not None and response.is_success:
                self.bodies[key].append(response.content)
                if response.headers.get("idempotent-replayed") != "true":
                    self.fresh.add(key)


def client_key(client: int, step: int, tag: str, started: float) -> str:
    if step % EVERY_NTH_KEY_SHARED == 0:
        return f"{tag}-shared-{int((time.monotonic() - started) / SHARED_KEY_SECONDS)}"
    return f"{tag}-c{client}-{step}"


def sent_at_once(tries: list[tuple[int, float, float]]) -> bool:
    """Whether two clients' tries of one key were in flight at the same time."""
    ordered = sorted(tries, key=lambda attempt: attempt[1])
    return any(
        other[0] != first[0] and other[1] < first[2]
        for index, first in enumerate(ordered)
        for other in ordered[index + 1 :]
    )


def request_body(key: str) -> bytes:
    """The same bytes on every try and from every client of a key (no 422)."""
    return orjson.dumps({"key": key, "amount": zlib.crc32(key.encode()) % 1000})


def retry_after(response: httpx.Response) -> float:
    try:
        seconds = float(response.headers.get("retry-after", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_SECONDS)


def complete_key(
    http: httpx.Client,
    fleet: Fleet,
    tally: Tally,
    client: int,
    key: str,
    rng: random.Random,
    deadline: list[float],
) -> None:
    """Send ``key`` until a 2xx, as a real client retries; give up on another status or at
    ``deadline[0]`` (then the key is unfinished), which the test sets when the chaos ends."""
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    body = request_body(key)
    errors_in_a_row = 0
    while time.monotonic() < deadline[0]:
        sent = time.monotonic()
        try:
            response = http.post(fleet.pick(rng) + ROUTE, content=body, headers=headers)
        except httpx.TransportError as error:  # refused, cut, timed out: the server died
            tally.saw(key, client, sent, type(error).__name__)
            low, high = BACKOFF_SECONDS
            wait = min(high, low * 2**errors_in_a_row)
            errors_in_a_row += 1
            time.sleep(rng.uniform(wait / 2, wait))
            continue
        errors_in_a_row = 0
        tally.saw(key, client, sent, str(response.status_code), response)
        if response.is_success:
            return
        if response.status_code not in (409, 503):
            break  # nothing a retry fixes; the checks report it
        time.sleep(retry_after(response))
    with tally.lock:
        tally.unfinished.append(key)


def client_loop(
    client: int,
    fleet: Fleet,
    tally: Tally,
    chaos_over: threading.Event,
    deadline: list[float],
    tag: str,
    seed: int,
    started: float,
) -> None:
    """Work through this client's keys while the chaos lasts; the last one to its end."""
    rng = random.Random(f"{seed}-client-{client}")
    try:
        with httpx.Client(timeout=CLIENT_TIMEOUT_SECONDS, trust_env=False) as http:
            step = 0
            while not chaos_over.is_set():
                key = client_key(client, step, tag, started)
                complete_key(http, fleet, tally, client, key, rng, deadline)
                step += 1
    except BaseException as error:  # reported by the test
        with tally.lock:
            tally.errors.append(f"client {client}: {error!r}")


def killer_loop(
    fleet: Fleet, rng: random.Random, chaos_over: threading.Event, errors: list[str]
) -> None:
    """Every 1-3 s: SIGKILL a random server and start one of the same kind (a new port)."""
    try:
        while not chaos_over.wait(rng.uniform(*KILL_EVERY_SECONDS)):
            victim = fleet.kill(rng)
            fleet.start(victim.adapter)
    except BaseException as error:  # reported by the test
        errors.append(f"killer: {error!r}")


def effect_lines(effects_file: Path) -> dict[str, list[int]]:
    """Every handler run, per key, in the order the runs happened: the pids."""
    runs: dict[str, list[int]] = defaultdict(list)
    if effects_file.exists():
        for line in effects_file.read_text().splitlines():
            key, pid = line.split(" ")
            runs[key].append(int(pid))
    return runs


def events(events_file: Path) -> list[tuple[str, str, int]]:
    if not events_file.exists():
        return []
    parsed = []
    for line in events_file.read_text().splitlines():
        kind, key_hash, pid = line.split(" ")
        parsed.append((kind, key_hash, int(pid)))
    return parsed


@contextlib.contextmanager
def running_fleet(directory: Path, env: dict[str, str]) -> Iterator[Fleet]:
    """The servers of ``SERVERS``; the survivors stopped and every process reaped at the end."""
    with contextlib.ExitStack() as stack:
        fleet = Fleet(directory, env, stack)
        try:
            for adapter in SERVERS:
                fleet.start(adapter)
            yield fleet
        finally:
            fleet.stop()


def test_servers_killed_at_random_never_run_a_key_twice_except_a_dead_owners(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"chaos seed {seed} (CHAOS_SEED={seed} replays the kill schedule)")
    effects_file = tmp_path / "effects.txt"
    events_file = tmp_path / "events.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "NO_PROXY": "127.0.0.1,localhost",
        "CHAOS_SQLITE_PATH": str(tmp_path / "idempotency.sqlite3"),
        "CHAOS_EFFECTS_FILE": str(effects_file),
        "CHAOS_EVENTS_FILE": str(events_file),
        "CHAOS_LOCK_SECONDS": str(LOCK_SECONDS),
        "CHAOS_MAX_PAUSE_SECONDS": str(MAX_PAUSE_SECONDS),
    }
    tag = f"chaos{seed}"
    tally = Tally()
    killer_errors: list[str] = []
    chaos_over = threading.Event()
    # The clients' deadline: none while the chaos lasts, then the drain's end.
    deadline = [float("inf")]
    started = time.monotonic()

    with running_fleet(tmp_path, env) as fleet:
        killer = threading.Thread(
            target=killer_loop,
            args=(fleet, random.Random(seed), chaos_over, killer_errors),
            name="killer",
        )
        clients = [
            threading.Thread(
                target=client_loop,
                args=(n, fleet, tally, chaos_over, deadline, tag, seed, started),
                name=f"client-{n}",
            )
            for n in range(CLIENTS)
        ]
        try:
            killer.start()
            for thread in clients:
                thread.start()
            time.sleep(CHAOS_SECONDS)
        finally:
            deadline[0] = time.monotonic() + DRAIN_SECONDS
            chaos_over.set()
            killer.join(START_TIMEOUT_SECONDS + STOP_TIMEOUT_SECONDS)
            for thread in clients:
                thread.join(DRAIN_SECONDS + CLIENT_TIMEOUT_SECONDS + 5)
        kills = len(fleet.killed)
        killed = set(fleet.killed)
        servers_started = fleet.started
    elapsed = time.monotonic() - started

    runs = effect_lines(effects_file)
    seen = events(events_file)
    kinds = Counter(kind for kind, _, _ in seen)
    keys = sorted(tally.bodies.keys() | set(tally.unfinished) | runs.keys())
    reruns = sum(len(pids) - 1 for pids in runs.values())
    print(
        f"chaos: {elapsed:.1f} s, seed {seed}, {len(keys)} keys, {tally.requests} requests, "
        f"{kills} kills ({servers_started} servers started), {reruns} re-runs, "
        f"statuses {dict(sorted(tally.statuses.items()))}, events {dict(kinds)}"
    )
    context = f"(seed {seed}; server logs in {tmp_path})"

    assert not killer_errors and not tally.errors, (killer_errors, tally.errors, context)
    assert not any(thread.is_alive() for thread in [killer, *clients]), context
    forbidden = {s: n for s, n in tally.statuses.items() if s.isdigit() and int(s) >= 500}
    forbidden.pop("503", None)
    assert not forbidden, f"5xx other than 503: {forbidden} {context}"
    assert "422" not in tally.statuses, f"422 (a retry taken for another request) {context}"
    unexpected = {
        s: n for s, n in tally.statuses.items() if s.isdigit() and int(s) not in ALLOWED_STATUSES
    }
    assert not unexpected, f"statuses other than 201/409/503: {unexpected} {context}"
    assert not tally.unfinished, (
        f"{len(tally.unfinished)} keys never completed within {DRAIN_SECONDS} s of the end "
        f"of the chaos: {tally.unfinished[:10]} {context}"
    )
    assert kinds["lost"] == 0, f"a live owner's claim was taken over: {seen} {context}"

    for key in keys:
        bodies = tally.bodies[key]
        assert bodies, f"{key}: no 2xx {context}"
        assert all(body == bodies[0] for body in bodies), f"{key}: 2xx bodies differ {context}"
        answer = orjson.loads(bodies[0])
        assert answer["key"] == key, (answer, context)
        stored = int(answer["pid"])
        pids = runs.get(key, [])
        assert stored in pids, f"{key}: the replayed run {stored} left no side effect {pids}"
        # One run per process and key: a process never took over its own claim.
        assert len(pids) == len(set(pids)), f"{key}: a process ran it twice: {pids} {context}"
        # Nothing ran after the run whose response was stored: a kill after the store (the
        # stored pid is a killed one) caused no re-run.
        assert pids[-1] == stored, f"{key}: ran again after its response was stored: {pids}"
        not_killed = [pid for pid in pids if pid not in killed]
        killed_unstored = [pid for pid in pids if pid in killed and pid != stored]
        assert len(not_killed) <= 1, f"{key}: run by live processes {not_killed} {context}"
        assert len(pids) == 1 + len(killed_unstored), (
            f"{key}: runs {pids}, stored by {stored}, killed {sorted(killed)} {context}"
        )
    assert set(runs) <= set(keys), f"runs for keys no client sent: {set(runs) - set(keys)}"
    hashes = {storage_key("POST", ROUTE, None, key) for key in keys}
    # A breaker's events name no key ("").
    assert {key_hash for _, key_hash, _ in seen} - {""} <= hashes, f"unknown keys {context}"
    duplicated = sum(sent_at_once(tally.tries[key]) for key in keys)
    never_fresh = len(keys) - len(tally.fresh & set(keys))
    print(
        f"chaos: {duplicated} keys sent by several clients at once; {never_fresh} keys "
        "answered by replays only (their owner stored the response, then died before its "
        "answer went out)"
    )
    # The chaos did what it is for (else the checks above proved little).
    assert kills >= 5, f"only {kills} kills in {CHAOS_SECONDS} s {context}"
    assert kinds["taken_over"] >= 1, f"no dead owner's claim was taken over {context}"
    assert duplicated >= 1, f"no key was in flight from two clients at once {context}"
