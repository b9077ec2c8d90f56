"""``make demo`` (``idempotency-middleware demo``): its walkthrough passes on the real apps,
and fails on an app that is not idempotent, so its exit status means something; without the
``[demo]`` extra it says which extra to install instead of printing a traceback."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from idempotency_middleware import demo
from idempotency_middleware.cli.main import EXIT_CODES_HELP, EXIT_MISCONFIGURED
from idempotency_middleware.demo.runner import CallLog, Walkthrough, print_table
from tests.support.servers import serve_wsgi

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_passes_every_step_on_both_apps_and_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", "demo"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout
    assert "Every step behaved as the README documents, in both apps" in result.stdout
    assert "FastAPI + IdempotencyMiddleware + AsyncDynamoDBStore" in result.stdout
    assert "Flask + IdempotencyWSGIMiddleware + DynamoDBStore" in result.stdout
    # Step 4's duplicate, sent while the first runs, is the documented 409 with Retry-After.
    assert result.stdout.count("a duplicate meanwhile: Retry-After: 1") == 2
    # Step 7: a request without a key passes through and runs every time.
    assert result.stdout.count("... and runs again: nothing is stored") == 2
    assert "moto's DynamoDB server at http://127.0.0.1:" in result.stdout
    assert "Traceback" not in result.stderr


def test_without_the_demo_extra_the_demo_names_the_extra_to_install() -> None:
    # moto made unimportable, as in an environment without the [demo] extra.
    program = (
        "import sys; sys.modules['moto'] = None; "
        "from idempotency_middleware.cli.main import main; sys.exit(main(['demo']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # The code the help gives for a missing extra (4, a misconfiguration), not a usage error.
    assert result.returncode == EXIT_MISCONFIGURED == 4, result.stdout + result.stderr
    assert "missing extra" in EXIT_CODES_HELP.split("\n  4  ")[1].split("\n  5  ")[0]
    assert result.stderr == (
        "the demo needs the [demo] extra (moto is not installed): "
        'pip install "idempotency-middleware[demo]"\n'
    )
    assert result.stdout == ""


def test_an_import_error_of_the_demo_itself_is_not_taken_for_a_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "idempotency_middleware.demo.runner", None)
    with pytest.raises(ModuleNotFoundError) as raised:
        demo.main(missing_extra=4)
    assert raised.value.name == "idempotency_middleware.demo.runner"


class NotIdempotentApp:
    """Places an order on every POST, whatever its key: what the demo must catch."""

    def __init__(self) -> None:
        self.charges = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "GET":  # GET /charges
            start_response("200 OK", [("Content-Type", "application/json")])
            return [orjson.dumps({"charges": self.charges})]
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        with self._lock:
            self.charges += 1
        start_response("201 Created", [("Content-Type", "application/json")])
        return [orjson.dumps({"order_id": uuid.uuid4().hex})]


class ReplaysEverythingApp:
    """Answers every POST with the first one's response, marked replayed, key or no key:
    a cache in front of the app that ignores the Idempotency-Key header."""

    def __init__(self) -> None:
        self.app = NotIdempotentApp()
        self.first: bytes | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "GET" or self.first is None:
            body = b"".join(self.app(environ, start_response))
            if environ["REQUEST_METHOD"] == "POST":
                self.first = body
            return [body]
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = [("Content-Type", "application/json"), ("Idempotent-Replayed", "true")]
        start_response("201 Created", headers)
        return [self.first]


def test_the_walkthrough_flags_every_step_of_an_app_without_the_middleware(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serve_wsgi(NotIdempotentApp()) as url, httpx.Client(base_url=url, timeout=15) as client:
        walkthrough = Walkthrough(client, CallLog())
        rows = walkthrough.run()

    problems = {row.step: row.problems for row in rows if row.step}
    assert sorted(problems) == ["1", "2", "3", "4", "5", "6", "7"]
    assert all(problems.values()), problems
    assert "expected the header Idempotent-Replayed: true" in problems["2"]
    assert 'expected status [422], got [201] [\'{"order_id":' in " ".join(problems["3"])
    assert "expected status [201, 409], got [201, 201]" in " ".join(problems["4"])
    assert "expected a Retry-After header (seconds) on the 409" in problems["4"]
    assert "expected 1 handler run(s) so far, got 2" in problems["2"]
    assert "expected DynamoDB calls 2: Put, Update, got 0" in problems["1"]
    # No key: both requests ran, as they should; only the run count is off by then.
    assert problems["7"] == ["expected 4 handler run(s) so far, got 9"]

    print_table("not idempotent", rows, walkthrough.keys)
    printed = capsys.readouterr().out
    for step in "1234567":
        assert f"FAILED step {step}: " in printed


def test_the_walkthrough_flags_a_request_without_a_key_that_is_replayed() -> None:
    with (
        serve_wsgi(ReplaysEverythingApp()) as url,
        httpx.Client(base_url=url, timeout=15) as client,
    ):
        rows = Walkthrough(client, CallLog()).run()

    [step_7] = [row.problems for row in rows if row.step == "7"]
    assert "a request without a key must not be replayed" in step_7
    assert "expected a new order for each request without a key, got the same" in step_7
