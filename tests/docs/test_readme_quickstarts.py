"""The README's quick starts (docs/snippets/quickstart/, quoted verbatim by the README and
included by the site's Getting started), run as a user runs them: each file saved as
``app.py`` in an empty directory and started with the command the page gives (uvicorn,
``flask run``, ``python app.py``; bound to a free port here), then the page's ``curl``
command sent twice: the first runs the handler, the second is its replay. The Django
settings run in a minimal Django project of their own (a subprocess: Django's settings are
process-global)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import HOST, UVICORN_LISTENING, server_process

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "snippets" / "quickstart"
FLASK_LISTENING = re.compile(r"Running on (http://[0-9.]+:[0-9]+)")
# A Django project around the quick start's settings: one view that creates an order.
DJANGO_PROJECT = """
import json, runpy, uuid
import django
from django.conf import settings
from django.http import JsonResponse
from django.test import Client
from django.urls import path

quick_start = runpy.run_path("app.py")
settings.configure(
    DEBUG=False, SECRET_KEY="test", ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__,
    MIDDLEWARE=quick_start["MIDDLEWARE"], IDEMPOTENCY=quick_start["IDEMPOTENCY"],
)
django.setup()

def create_order(request):
    return JsonResponse({"order_id": uuid.uuid4().hex, **json.loads(request.body)}, status=201)

urlpatterns = [path("orders", create_order)]
client = Client()
for _ in range(2):
    response = client.post("/orders", b'{"item": "book"}', content_type="application/json",
                           headers={"Idempotency-Key": "order-1"})
    replayed = response.headers.get("Idempotent-Replayed")
    print(response.status_code, replayed, response.content.decode())
"""


def save_as_app(name: str, directory: Path) -> None:
    shutil.copy(QUICKSTART / name, directory / "app.py")


def curl_twice(url: str, directory: Path) -> tuple[str, str]:
    """The page's curl command, pointed at ``url``, run twice; each response, headers
    included (``curl -i``)."""
    command = (QUICKSTART / "curl.sh").read_text().replace("localhost:8000", url)
    responses = []
    for _ in range(2):
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, "NO_PROXY": "*"},
        )
        responses.append(result.stdout)
    return responses[0], responses[1]


def assert_replayed(first: str, retry: str) -> None:
    assert re.match(r"HTTP/1\.[01] 201", first), first
    assert "idempotent-replayed" not in first.lower()
    assert re.match(r"HTTP/1\.[01] 201", retry), retry
    assert "idempotent-replayed: true" in retry.lower()
    assert first.split("\n\n", 1)[1] == retry.split("\n\n", 1)[1]  # one order_id
    assert '"item":"book"' in first.replace(" ", "")


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_fastapi_quick_start_replays_a_retry(tmp_path: Path) -> None:
    save_as_app("fastapi_app.py", tmp_path)
    command = [sys.executable, "-m", "uvicorn", "app:app", "--lifespan", "on"]
    command += ["--host", HOST, "--port", "0"]
    with server_process(
        command,
        env=dict(os.environ),
        log=tmp_path / "log",
        listening=UVICORN_LISTENING,
        cwd=tmp_path,
    ) as (_, url):
        assert_replayed(*curl_twice(url, tmp_path))
    assert (tmp_path / "idempotency.sqlite3").exists()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_flask_quick_start_replays_a_retry(tmp_path: Path) -> None:
    save_as_app("flask_app.py", tmp_path)
    command = [sys.executable, "-m", "flask", "--app", "app", "run", "--host", HOST, "--port", "0"]
    with server_process(
        command, env=dict(os.environ), log=tmp_path / "log", listening=FLASK_LISTENING, cwd=tmp_path
    ) as (_, url):
        assert_replayed(*curl_twice(url, tmp_path))


def test_the_django_quick_start_settings_replay_a_retry(tmp_path: Path) -> None:
    save_as_app("django_settings.py", tmp_path)
    (tmp_path / "project.py").write_text(DJANGO_PROJECT)
    result = subprocess.run(
        [sys.executable, "project.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    first, retry = result.stdout.splitlines()
    assert first.startswith("201 None {")
    assert retry == first.replace("201 None", "201 true")


def test_the_functions_quick_start_runs_its_handler_once(tmp_path: Path) -> None:
    save_as_app("functions.py", tmp_path)
    assert (QUICKSTART / "run-functions.sh").read_text() == "python app.py\n"
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "charging msg-1\n"
