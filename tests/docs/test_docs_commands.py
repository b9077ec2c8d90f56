"""Every example's page gives the commands that run it on a fresh clone
(docs/snippets/run/NAME.sh, included under the example); this runs them as written, from the
repository's root, with only the ports changed (moto's 8000 and the app's 8001 become free
ones): ``make install`` (a no-op once the venv is installed), then the example. A server
example is then sent the page's request (NAME-try.sh) twice: the second answer must be the
first one replayed. The environment has no AWS variables but those the commands set, so
nothing reaches AWS."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "snippets" / "run"
START_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 15.0
# What a batch example prints when it did what its page says.
BATCH = {
    "sqs_consumer": "recorded 3 payments",
    "lambda_batch": "['ada@example.com']",
    "celery_task": "",
    "service_method": "",
    "kv_store": " passed",
    "step_functions_status_change": "{'job': '2', 'state': 'accepted'}",
}
SERVERS = sorted(path.stem for path in RUN.glob("*-try.sh"))
SERVERS = [name.removesuffix("-try") for name in SERVERS]


def environment(tmp_path: Path) -> dict[str, str]:
    """This process's environment without AWS settings (empty AWS config files, no instance
    metadata): only what the page's commands export."""
    (tmp_path / "aws-config").write_text("")
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-config"),
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="*",
        # examples.celery_task's SQLite file, kept out of the repository's root.
        RECEIPTS_IDEMPOTENCY_DB=str(tmp_path / "receipts-idempotency.sqlite3"),
    )
    return env


# Servers an MCP client starts (over stdio): their commands run in tests/e2e/test_mcp_stdio.py.
STDIO_SERVERS = {"mcp_server"}


def test_every_example_has_its_commands() -> None:
    examples = {path.stem for path in (ROOT / "examples").glob("*.py")} - {"__init__"}
    assert examples == set(BATCH) | set(SERVERS) | STDIO_SERVERS
    for name in examples:
        assert (RUN / f"{name}.sh").read_text().startswith("make install\n")


@pytest.mark.parametrize("name", sorted(BATCH))
def test_the_batch_example_runs_with_the_commands_its_page_gives(name: str, tmp_path: Path) -> None:
    script = (RUN / f"{name}.sh").read_text()
    result = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=ROOT,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert BATCH[name] in result.stdout


# The batch examples that start moto's server for their run.
ON_MOTO = ("lambda_batch", "sqs_consumer", "step_functions_status_change")
# A line of werkzeug's access log, as moto's server writes it for each request.
ACCESS_LOG = re.compile(r'"(GET|POST|PUT|DELETE|HEAD) \S+ HTTP/1\.[01]" \d{3}')


@pytest.mark.parametrize("name", ON_MOTO)
def test_the_batch_example_on_moto_writes_no_access_log(name: str, tmp_path: Path) -> None:
    """Its output is its own lines: moto's server logs no request to it."""
    result = subprocess.run(
        [sys.executable, "-m", f"examples.{name}"],
        cwd=ROOT,
        env={**environment(tmp_path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert BATCH[name] in result.stdout
    output = result.stdout + result.stderr
    assert not ACCESS_LOG.search(output), output


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def last_response(output: str) -> tuple[str, str]:
    """The status line and the body of the last response ``curl -i`` printed."""
    response = output[output.rindex("HTTP/1.1 ") :]
    head, _, body = response.partition("\r\n\r\n")
    return head, body


@pytest.mark.parametrize("name", SERVERS)
def test_the_server_example_runs_with_the_commands_its_page_gives(
    name: str, tmp_path: Path
) -> None:
    moto_port, app_port = free_port(), free_port()
    ports = {"8000": str(moto_port), "8001": str(app_port)}
    script = re.sub(r"800[01]", lambda m: ports[m.group(0)], (RUN / f"{name}.sh").read_text())
    request = re.sub(r"800[01]", lambda m: ports[m.group(0)], (RUN / f"{name}-try.sh").read_text())
    env = environment(tmp_path)
    log = tmp_path / "log"
    with open(log, "wb") as log_file:
        server = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not listening(app_port):
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        answers = [
            subprocess.run(
                ["bash", "-e", "-c", request],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                timeout=60,
                check=True,
            ).stdout.decode()
            for _ in range(2)
        ]
    finally:
        # The whole group at once, as Ctrl-C in the page's terminal would: the example must
        # stop although its local DynamoDB goes down with it.
        os.killpg(server.pid, signal.SIGTERM)
        stopped = True
        try:
            server.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            stopped = False
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    assert stopped, f"still running {STOP_TIMEOUT_SECONDS:.0f} s after SIGTERM: {log.read_text()}"
    (first_head, first_body), (retry_head, retry_body) = map(last_response, answers)
    assert re.match(r"HTTP/1\.1 20[0-2]", first_head), answers[0] + log.read_text()
    assert "idempotent-replayed" not in first_head.lower()
    assert retry_head.split()[1] == first_head.split()[1]  # the status code
    assert "idempotent-replayed: true" in retry_head.lower(), answers[1]
    assert retry_body == first_body
