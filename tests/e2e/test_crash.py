"""Crash test (issue 5): a uvicorn server in a subprocess is killed with SIGKILL mid-handler.

After a restart the retry gets 409 until the dead owner's lock expires, then runs exactly
once more, and the record of that second run is the one replayed. Runs are counted in a
file the handler appends to (``tests/support/crash_app.py``), across both processes.

Both servers read a ``FileClock`` (tests/support/file_clock.py) this test moves past the dead
owner's lock instead of sleeping, so the lock can be a minute: the restart always fits
inside it, however loaded the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

from idempotency_middleware import DynamoDBStore
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS
from idempotency_middleware.stores.records import Status
from tests.support.faultproxy import REGION
from tests.support.file_clock import FileClock
from tests.support.servers import HOST, UVICORN_LISTENING, server_process

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK_SECONDS = 60.0
# How far before the takeover the last 409 is asked for: real time passes on the clock too.
SHORT_OF_THE_TAKEOVER_SECONDS = 10.0
START_TIMEOUT_SECONDS = 20.0


@contextlib.contextmanager
def crash_server(env: dict[str, str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m uvicorn tests.support.crash_app:app`` on a port of its own; killed at the end."""
    command = [sys.executable, "-m", "uvicorn", "tests.support.crash_app:app", "--host", HOST]
    command += ["--port", "0", "--log-level", "info", "--lifespan", "off"]
    with server_process(
        command,
        env={**os.environ, **env},
        log=log,
        listening=UVICORN_LISTENING,
        timeout=START_TIMEOUT_SECONDS,
    ) as started:
        yield started


def runs(runs_file: Path) -> list[str]:
    return runs_file.read_text().splitlines() if runs_file.exists() else []


def test_a_server_killed_mid_handler_is_taken_over_after_its_lock_and_runs_once_more(
    moto_endpoint: str, dynamodb_table: str, tmp_path: Path
) -> None:
    runs_file = tmp_path / "runs.txt"
    log = tmp_path / "uvicorn.log"
    env = {
        "CRASH_DYNAMODB_ENDPOINT": moto_endpoint,
        "CRASH_DYNAMODB_TABLE": dynamodb_table,
        "CRASH_RUNS_FILE": str(runs_file),
        "CRASH_LOCK_SECONDS": str(LOCK_SECONDS),
        "CRASH_CLOCK_FILE": str(tmp_path / "clock.txt"),
        "CRASH_HANG_SECONDS": "60",
        "PYTHONPATH": str(REPO_ROOT),
    }
    key = f"crash-{time.time_ns()}"
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    body = b'{"amount": 100}'
    outcome: list[BaseException | httpx.Response] = []

    def first_request(url: str) -> None:
        try:
            outcome.append(httpx.post(f"{url}/payments", content=body, headers=headers, timeout=30))
        except httpx.HTTPError as error:
            outcome.append(error)

    # 1. The first server claims the key, starts the handler, and is killed in it.
    with crash_server(env, log) as (first, url):
        client_thread = threading.Thread(target=first_request, args=(url,))
        client_thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not runs(runs_file):
            assert time.monotonic() < deadline, f"the handler never ran: {log.read_text()}"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        client_thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
    assert runs(runs_file) == [f"1 {first.pid}"]

    # The dead owner's claim is still there, in progress.
    hashed = storage_key("POST", "/payments", None, key)
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as direct:
        record = direct.get(hashed)
    assert record is not None and record.status is Status.IN_PROGRESS
    lock_expires_at = record.lock_expires_at

    # 2. After a restart: 409 while the dead owner's lock holds, then exactly one more run
    # once the servers' clock has crossed it (and the clock-skew margin, the default).
    clock = FileClock(tmp_path / "clock.txt")
    stale_at = lock_expires_at + DEFAULT_CLOCK_SKEW_SECONDS
    with (
        crash_server(env, log) as (second, url),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        held = client.post("/payments", content=body, headers=headers)
        assert held.status_code == 409, held.text
        assert held.headers["content-type"] == "application/problem+json"
        assert int(held.headers["retry-after"]) >= 1

        clock.advance(stale_at - SHORT_OF_THE_TAKEOVER_SECONDS - clock.now())
        still_held = client.post("/payments", content=body, headers=headers)
        assert still_held.status_code == 409, "taken over before the lock and margin expired"

        clock.advance(stale_at - clock.now())
        response = client.post("/payments", content=body, headers=headers)
        assert response.status_code == 201, response.text
        assert response.headers.get("idempotent-replayed") is None
        assert orjson.loads(response.content) == {"run": 2, "pid": second.pid}
        assert runs(runs_file) == [f"1 {first.pid}", f"2 {second.pid}"]

        # 3. The second run's record is the one replayed, and nothing runs a third time.
        for _ in range(3):
            replay = client.post("/payments", content=body, headers=headers)
            assert replay.status_code == 201
            assert replay.headers.get("idempotent-replayed") == "true"
            assert replay.content == response.content
        assert len(runs(runs_file)) == 2
