"""The agents page's fastmcp server (``docs/snippets/agents-middleware.py``, its shown part)
served over Streamable HTTP by a real uvicorn server, and the page's client
(``docs/snippets/agents-client.py``) run as pasted, as a program of its own, against it: the
retry is replayed and the tool ran once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastmcp")  # (Python 3.11 and later)

from fastmcp.server.middleware import Middleware

from tests.support.servers import serve_asgi

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"


def shown_server() -> Any:
    """The page's server, built by the shown part of its snippet."""
    text = (SNIPPETS / "agents-middleware.py").read_text()
    start = text.index("# --8<-- [start:show]\n")
    shown = text[start : text.index("# --8<-- [end:show]")]
    namespace: dict[str, Any] = {"__name__": "agents_page"}
    exec(compile(shown, "agents-middleware.py", "exec"), namespace)
    return namespace["server"]


class ToolRuns(Middleware):
    """Inside the idempotency middleware (added after it): sees only the calls that reach
    the tool, so it counts the tool's runs."""

    def __init__(self) -> None:
        self.tools: list[str] = []

    async def on_call_tool(self, context: Any, call_next: Any) -> Any:
        self.tools.append(context.message.name)
        return await call_next(context)


def test_the_pages_client_gets_its_retry_replayed_by_the_pages_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store's SQLite file is relative and opened on first use: in this test's directory
    # (one left in the checkout by an earlier run replayed both calls).
    monkeypatch.chdir(tmp_path)
    server = shown_server()
    runs = ToolRuns()
    server.add_middleware(runs)
    with serve_asgi(server.http_app(), lifespan=True) as url:
        result = subprocess.run(
            [sys.executable, str(SNIPPETS / "agents-client.py")],
            cwd=tmp_path,
            env={**os.environ, "MCP_SERVER_URL": f"{url}/mcp", "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "replayed: {'sent_to': 'acme'}"
    assert runs.tools == ["send_invoice"]  # the retry never reached the tool
