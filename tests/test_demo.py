"""``make demo`` (``idempotency-middleware demo``): its walkthrough passes on the real apps,
and fails on an app that is not idempotent, so its exit status means something."""

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

from idempotency_middleware.demo.runner import CallLog, Walkthrough, print_table
from tests.servers import serve_wsgi

REPO_ROOT = Path(__file__).resolve().parent.parent


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


def test_the_walkthrough_flags_every_step_of_an_app_without_the_middleware(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serve_wsgi(NotIdempotentApp()) as url, httpx.Client(base_url=url, timeout=15) as client:
        walkthrough = Walkthrough(client, CallLog())
        rows = walkthrough.run()

    problems = {row.step: row.problems for row in rows if row.step}
    assert sorted(problems) == ["1", "2", "3", "4", "5", "6"]
    assert all(problems.values()), problems
    assert "expected the header Idempotent-Replayed: true" in problems["2"]
    assert 'expected status [422], got [201] [\'{"order_id":' in " ".join(problems["3"])
    assert "expected status [201, 409], got [201, 201]" in " ".join(problems["4"])
    assert "expected a Retry-After header (seconds) on the 409" in problems["4"]
    assert "expected 1 handler run(s) so far, got 2" in problems["2"]
    assert "expected DynamoDB calls 2: Put, Update, got 0" in problems["1"]

    print_table("not idempotent", rows, walkthrough.keys)
    printed = capsys.readouterr().out
    for step in "123456":
        assert f"FAILED step {step}: " in printed
