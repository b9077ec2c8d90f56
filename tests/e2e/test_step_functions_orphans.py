"""The orphan window: a process that claims a key and dies before, or just after, starting
the Step Functions execution that does its work. Neither may leave the key blocked until it
expires, nor let a retry start a second execution of the same work.

``start_execution`` names the execution from the key, so Step Functions refuses a second
one, and a retry that takes the key over adopts the execution still running: its 202 is
stored for that execution's deferral token, which then finishes the key.

- In process (both APIs of tests/support/step_functions_apps.py): the dead attempt is made by hand,
  as it leaves the store and Step Functions (its claim past its lock, its execution
  started), and a retry adopts the execution; an execution of the key's name running other
  work is refused.
- With a killed process (tests/support/sfn_crash_app.py under uvicorn, killed with SIGKILL, as
  tests/e2e/test_crash.py does): killed before ``StartExecution``, and killed between it and
  storing the 202 (the retry adopts the execution; or the execution finishes the key first;
  or it was aborted, and its status change, delivered after the takeover, changes
  nothing). The servers read a ``FileClock`` the test moves past the dead owner's lock.

The work's runs are counted by the executions themselves (tests/support/step_functions_harness.py),
the handler's runs across processes in a file; every retry's answer is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from idempotency_middleware import DynamoDBStore
from idempotency_middleware.engine.entropy import new_owner
from idempotency_middleware.handler.deferred import new_token, parse_token
from idempotency_middleware.policy.fingerprint import fingerprint_request
from idempotency_middleware.policy.options import DEFAULT_CLOCK_SKEW_SECONDS
from idempotency_middleware.step_functions import TOKEN_FIELD, handle_execution_status_change
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest
from idempotency_middleware.stores.records import Status
from tests.conftest import REGION
from tests.support.file_clock import FileClock
from tests.support.servers import HOST, UVICORN_LISTENING, server_process
from tests.support.step_functions import dynamodb_tasks_on, sfn_endpoint
from tests.support.step_functions_apps import (
    KEY_HEADER,
    PATH,
    JobsAPI,
    api_flavour,
    assert_accepted,
    assert_final,
    jobs_api,
    key_hash,
    name_of,
    new_job,
)
from tests.support.step_functions_harness import Workflows, status_change_event

__all__ = ["api_flavour", "sfn_endpoint"]  # fixtures, imported for these tests

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK_SECONDS = 60.0
TTL_SECONDS = 86_400.0
START_TIMEOUT_SECONDS = 20.0


@pytest.fixture
def workflows(sfn_endpoint: str, moto_endpoint: str, dynamodb_table: str) -> Iterator[Workflows]:
    port = urlsplit(moto_endpoint).port
    assert port is not None
    with dynamodb_tasks_on(port):
        workflows = Workflows(sfn_endpoint, moto_endpoint, dynamodb_table)
        try:
            yield workflows
        finally:
            workflows.close()


def shipped(job: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job["job_id"], "state": "shipped"}


def body_of(job: dict[str, Any]) -> bytes:
    """The request body the client sends for ``job`` (httpx's ``json=``)."""
    return httpx.Request("POST", "http://x", json=job).read()


def token_in(workflows: Workflows, execution_arn: str) -> str:
    token: str = json.loads(workflows.describe(execution_arn)["input"])[TOKEN_FIELD]
    return token


# --- in process: the dead attempt made by hand ---------------------------------------------


def dead_attempt(
    store: DynamoDBStore, workflows: Workflows, machine: str, key: str, job: dict[str, Any]
) -> str:
    """What an attempt that died after starting its execution leaves: its claim, in
    progress past its lock, and the execution it started, running with its token. The
    token."""
    long_ago = time.time() - LOCK_SECONDS - DEFAULT_CLOCK_SKEW_SECONDS - 60
    fingerprint = fingerprint_request("POST", PATH, b"", b"application/json", body_of(job))
    claim = ClaimRequest(key_hash(key), fingerprint, new_owner(), long_ago, LOCK_SECONDS)
    assert store.claim(claim) == Claimed(taken_over=False)
    token = new_token(claim.key_hash, claim.owner, long_ago + TTL_SECONDS)
    workflows.sfn.start_execution(
        stateMachineArn=machine, name=name_of(key, 0), input=json.dumps({**job, TOKEN_FIELD: token})
    )
    return token


@pytest.fixture
def api(
    api_flavour: str, sfn_endpoint: str, moto_endpoint: str, dynamodb_table: str
) -> Iterator[JobsAPI]:
    with jobs_api(api_flavour, sfn_endpoint, moto_endpoint, dynamodb_table) as served:
        yield served


def test_a_retry_that_takes_the_key_over_adopts_the_execution_still_running(
    api: JobsAPI, workflows: Workflows
) -> None:
    api.jobs.machine = machine = workflows.machine()
    key, job = "job-orphaned", new_job()
    token = dead_attempt(api.store, workflows, machine, key, job)
    workflows.wait_for_runs(job["job_id"], 1)

    adopted = api.post(key, job)

    assert_accepted(adopted, key, run=1, execution=0, replayed=False, adopted=True)
    record = api.store.get(key_hash(key))
    assert record is not None
    assert (record.status, record.owner) == (Status.DEFERRED, parse_token(token).owner)
    assert_accepted(api.post(key, job), key, run=1, execution=0, replayed=True, adopted=True)
    workflows.open_gate(job["job_id"], "ship")
    assert workflows.wait_for_end(workflows.arn_of(machine, name_of(key, 0)))["status"] == (
        "SUCCEEDED"
    )
    assert_final(api.post(key, job), 200, shipped(job))
    assert workflows.executions(machine) == [name_of(key, 0)]
    assert (api.jobs.runs, workflows.runs(job["job_id"])) == (1, 1)


def test_an_execution_of_the_key_running_other_work_is_refused_and_nothing_starts(
    api: JobsAPI, workflows: Workflows
) -> None:
    api.jobs.machine = machine = workflows.machine()
    key, job = "job-reused", new_job()
    # The key's dead attempt started its execution for another job (the client reused the key).
    dead_attempt(api.store, workflows, machine, key, new_job())

    refused = api.post(key, job)

    assert refused.status_code == 500  # ExecutionConflictError, raised in the handler
    assert api.store.get(key_hash(key)) is None  # released, as for any exception
    assert workflows.executions(machine) == [name_of(key, 0)]
    assert workflows.runs(job["job_id"]) == 0


# --- a killed process ------------------------------------------------------------------------


@contextlib.contextmanager
def crash_server(env: dict[str, str], log: Path) -> Iterator[tuple[Any, str]]:
    """``python -m uvicorn tests.support.sfn_crash_app:app`` on a port of its own; killed at
    the end."""
    command = [sys.executable, "-m", "uvicorn", "tests.support.sfn_crash_app:app", "--host", HOST]
    command += ["--port", "0", "--log-level", "info", "--lifespan", "off"]
    with server_process(
        command,
        env={**os.environ, **env},
        log=log,
        listening=UVICORN_LISTENING,
        timeout=START_TIMEOUT_SECONDS,
    ) as started:
        yield started


class Crash:
    """A job whose first server is killed at ``point``, then served by a second one."""

    def __init__(
        self,
        point: str,
        workflows: Workflows,
        moto_endpoint: str,
        sfn_endpoint: str,
        tmp_path: Path,
    ) -> None:
        self.workflows = workflows
        self.machine = workflows.machine()
        self.runs_file = tmp_path / "runs.txt"
        self.log = tmp_path / "uvicorn.log"
        self.clock = FileClock(tmp_path / "clock.txt")
        self.env = {
            "CRASH_DYNAMODB_ENDPOINT": moto_endpoint,
            "CRASH_DYNAMODB_TABLE": workflows.table,
            "CRASH_SFN_ENDPOINT": sfn_endpoint,
            "CRASH_STATE_MACHINE": self.machine,
            "CRASH_RUNS_FILE": str(self.runs_file),
            "CRASH_LOCK_SECONDS": str(LOCK_SECONDS),
            "CRASH_CLOCK_FILE": str(self.clock.path),
            "CRASH_POINT": point,
            "PYTHONPATH": str(REPO_ROOT),
        }
        self.key = f"crash-{point}-{time.time_ns()}"
        self.job = new_job()
        self.store = DynamoDBStore(workflows.table, endpoint_url=moto_endpoint, region_name=REGION)

    def handler_runs(self) -> list[str]:
        return self.runs_file.read_text().splitlines() if self.runs_file.exists() else []

    def kill_first_server(self, started_execution: bool) -> None:
        """Send the job to a first server and kill it in its handler: before it started the
        execution, or once it has."""
        outcome: list[BaseException | httpx.Response] = []

        def send(url: str) -> None:
            try:
                outcome.append(self.post(httpx.Client(base_url=url, timeout=30)))
            except httpx.HTTPError as error:
                outcome.append(error)

        with crash_server(self.env, self.log) as (first, url):
            client_thread = threading.Thread(target=send, args=(url,))
            client_thread.start()
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while not self.handler_runs() or (
                started_execution and not self.workflows.executions(self.machine)
            ):
                assert time.monotonic() < deadline, f"the handler stalled: {self.log.read_text()}"
                time.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
            client_thread.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
        assert self.handler_runs() == [f"1 {first.pid}"]
        # The dead owner's claim is still there, in progress.
        record = self.store.get(key_hash(self.key))
        assert record is not None and record.status is Status.IN_PROGRESS

    def post(self, client: httpx.Client) -> httpx.Response:
        return client.post(PATH, json=self.job, headers={KEY_HEADER: self.key})

    @contextlib.contextmanager
    def second_server(self) -> Iterator[httpx.Client]:
        """A client of a second server, started after the first one was killed."""
        with (
            crash_server(self.env, self.log) as (_, url),
            httpx.Client(base_url=url, timeout=30) as client,
        ):
            yield client

    def cross_the_lock(self) -> None:
        """Move the servers' clock past the dead owner's lock and the skew margin."""
        record = self.store.get(key_hash(self.key))
        assert record is not None
        self.clock.advance(record.lock_expires_at + DEFAULT_CLOCK_SKEW_SECONDS - self.clock.now())

    def execution_arn(self, number: int) -> str:
        return self.workflows.arn_of(self.machine, name_of(self.key, number))

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def crash(
    request: pytest.FixtureRequest,
    workflows: Workflows,
    moto_endpoint: str,
    sfn_endpoint: str,
    tmp_path: Path,
) -> Iterator[Crash]:
    made = Crash(request.param, workflows, moto_endpoint, sfn_endpoint, tmp_path)
    yield made
    made.close()


def assert_held(answer: httpx.Response) -> None:
    """A 409 while the dead owner's lock holds."""
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("crash", ["before_start"], indirect=True)
def test_killed_before_starting_the_execution_the_retry_starts_it_once(crash: Crash) -> None:
    crash.kill_first_server(started_execution=False)
    assert crash.workflows.executions(crash.machine) == []

    with crash.second_server() as client:
        assert_held(crash.post(client))
        crash.cross_the_lock()
        started = crash.post(client)
        assert_accepted(started, crash.key, run=2, execution=0, replayed=False)
        assert_accepted(crash.post(client), crash.key, run=2, execution=0, replayed=True)
        crash.workflows.open_gate(crash.job["job_id"], "ship")
        assert crash.workflows.wait_for_end(crash.execution_arn(0))["status"] == "SUCCEEDED"
        assert_final(crash.post(client), 200, shipped(crash.job))

    assert len(crash.handler_runs()) == 2
    assert crash.workflows.executions(crash.machine) == [name_of(crash.key, 0)]
    assert crash.workflows.runs(crash.job["job_id"]) == 1


@pytest.mark.parametrize("crash", ["after_start"], indirect=True)
def test_killed_after_starting_the_execution_the_retry_adopts_it(crash: Crash) -> None:
    crash.kill_first_server(started_execution=True)
    running = crash.execution_arn(0)
    token = parse_token(token_in(crash.workflows, running))

    with crash.second_server() as client:
        assert_held(crash.post(client))
        crash.cross_the_lock()
        adopted = crash.post(client)
        assert_accepted(adopted, crash.key, run=2, execution=0, replayed=False, adopted=True)
        record = crash.store.get(key_hash(crash.key))
        assert record is not None
        assert (record.status, record.owner) == (Status.DEFERRED, token.owner)
        assert_accepted(
            crash.post(client), crash.key, run=2, execution=0, replayed=True, adopted=True
        )
        crash.workflows.open_gate(crash.job["job_id"], "ship")
        assert crash.workflows.wait_for_end(running)["status"] == "SUCCEEDED"
        assert_final(crash.post(client), 200, shipped(crash.job))

    assert len(crash.handler_runs()) == 2
    assert crash.workflows.executions(crash.machine) == [name_of(crash.key, 0)]
    assert crash.workflows.runs(crash.job["job_id"]) == 1


@pytest.mark.parametrize("crash", ["after_start"], indirect=True)
def test_killed_after_starting_the_execution_that_finishes_first_the_retry_gets_its_result(
    crash: Crash,
) -> None:
    crash.kill_first_server(started_execution=True)
    crash.workflows.open_gate(crash.job["job_id"], "ship")
    # The key is still in progress under the dead owner, whose token the execution holds.
    assert crash.workflows.wait_for_end(crash.execution_arn(0))["status"] == "SUCCEEDED"

    with crash.second_server() as client:
        assert_final(crash.post(client), 200, shipped(crash.job))

    assert len(crash.handler_runs()) == 1
    assert crash.workflows.runs(crash.job["job_id"]) == 1


@pytest.mark.parametrize("crash", ["after_start"], indirect=True)
def test_the_status_change_of_an_execution_whose_key_was_taken_over_changes_nothing(
    crash: Crash,
) -> None:
    crash.kill_first_server(started_execution=True)
    aborted = crash.execution_arn(0)
    crash.workflows.sfn.stop_execution(executionArn=aborted)
    assert crash.workflows.wait_for_end(aborted)["status"] == "ABORTED"
    # Its event is late (EventBridge delivers within seconds, a failing Lambda retries).
    event = status_change_event(crash.workflows, aborted)

    with crash.second_server() as client:
        assert_held(crash.post(client))
        crash.cross_the_lock()
        # The aborted execution is not adopted: the retry starts the next one.
        assert_accepted(crash.post(client), crash.key, run=2, execution=1, replayed=False)
        before = crash.store.get(key_hash(crash.key))

        assert handle_execution_status_change(event, store=crash.store) == "stale"

        assert crash.store.get(key_hash(crash.key)) == before
        assert_accepted(crash.post(client), crash.key, run=2, execution=1, replayed=True)
