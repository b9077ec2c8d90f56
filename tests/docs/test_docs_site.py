"""The documentation site, opened in a real browser: the site built by ``mkdocs build
--strict`` (``make docs``'s ``site/`` when it is newer than everything it is built from, else
a fresh build), served by ``http.server`` on 127.0.0.1, and loaded in headless Chromium
(Debian's ``chromium``; ``make test`` installs it where it can, scripts/install-chromium.sh),
driven through its DevTools protocol over a pipe (``--remote-debugging-pipe``: no port, no
websocket client).

Checked: the home page, a page of every section and the API reference render (a title, no
console error, no uncaught exception, no failed load), every request the pages make goes to
127.0.0.1 (no fonts or scripts from elsewhere), and the site's search, typed into its search
box, finds the page that documents ``wait_seconds``. Where Chromium is missing the test is
skipped with the reason; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
# What the site is built from: a site/ older than any of these is rebuilt.
SOURCES = (ROOT / "mkdocs.yml", ROOT / "CHANGELOG.md", ROOT / "docs", ROOT / "examples")
PACKAGE = ROOT / "idempotency_middleware"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
    # Every other host is unreachable: a page that needs one fails here as it would offline.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)
# A page of every section of the navigation, the API reference included: (path, title).
PAGES = (
    ("", "idempotency-middleware"),
    ("getting-started/", "Getting started"),
    ("http/semantics/", "HTTP semantics and problems"),
    ("http/fastapi/", "FastAPI: opting routes in, and OpenAPI"),
    ("functions/", "Functions and message consumers"),
    ("exactly-once/", "Exactly-once writes"),
    ("long-running/", "Long-running work and Step Functions"),
    ("one-time-actions/", "One-time actions"),
    ("stores/", "Choosing a store"),
    ("stores/dynamodb/", "DynamoDB"),
    ("operating/cli/", "Command line"),
    ("testing/", "Testing your own code"),
    ("performance/", "Performance"),
    ("comparison/", "Compared with"),
    ("writing-a-store/", "Writing a store"),
    ("architecture/", "How it is built"),
    ("reference/", "API reference"),
    ("reference/http/", "Middlewares and rules"),
    ("development/", "Development"),
    ("changelog/", "Changelog"),
)
LOAD_TIMEOUT_SECONDS = 30.0
# Chromium's first answer comes once it has started: on a loaded 2-core host (the suite's
# other worker, DynamoDB Local's JVM) a start took over 30 s.
START_TIMEOUT_SECONDS = 120.0
SEARCH_TIMEOUT_SECONDS = 20.0


def chromium_or_skip() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "no chromium on the PATH (make test installs Debian's where it runs as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return found


def newest_source_mtime() -> float:
    files = [
        path for source in SOURCES for path in ([source] if source.is_file() else source.rglob("*"))
    ]
    files += PACKAGE.rglob("*.py")
    # Bytecode is no source: the tests import examples/ and docs/snippets/, whose __pycache__
    # written after make docs made every run of make test build the site a second time.
    return max(
        path.stat().st_mtime for path in files if path.is_file() and "__pycache__" not in path.parts
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """make docs's site/ when it is up to date; else a fresh strict build."""
    index = SITE / "index.html"
    if index.exists() and index.stat().st_mtime > newest_source_mtime():
        return SITE
    built = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(built)],
        cwd=ROOT,
        check=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return built


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class Browser:
    """Chromium's DevTools protocol over its pipe: JSON messages ended by NUL, on the
    child's fds 3 (commands) and 4 (replies and events)."""

    def __init__(self, executable: str, profile: Path) -> None:
        self.log = profile / "chromium.log"
        to_chromium_read, self._to_chromium = os.pipe()
        self._from_chromium, from_chromium_write = os.pipe()
        # The shell maps the two pipe ends onto fds 3 and 4, where Chromium expects them.
        script = f'exec "$0" "$@" 3<&{to_chromium_read} 4>&{from_chromium_write}'
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", script, executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"],
                pass_fds=(to_chromium_read, from_chromium_write),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        os.close(to_chromium_read)
        os.close(from_chromium_write)
        self._next_id = 0
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session = ""

    def _read(self) -> None:
        buffer = b""
        with open(self._from_chromium, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                buffer += chunk
                while b"\0" in buffer:
                    raw, buffer = buffer.split(b"\0", 1)
                    message = json.loads(raw)
                    if "id" in message and message["id"] in self._replies:
                        self._replies[message["id"]].put(message)
                    else:
                        self.events.put(message)

    def send(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            number = self._next_id
            self._replies[number] = queue.Queue()
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_chromium, json.dumps(message).encode() + b"\0")
        try:
            reply = self._replies[number].get(timeout=timeout)
        except queue.Empty:
            exited = self.process.poll()
            state = "running" if exited is None else f"exited {exited}"
            log = self.log.read_text(errors="replace")[-3000:]
            pytest.fail(f"Chromium ({state}) did not answer {method} in {timeout} s. Log:\n{log}")
        assert "error" not in reply, (method, reply["error"])
        result: dict[str, Any] = reply["result"]
        return result

    def open_page(self) -> None:
        """Attach to the first tab; turn on the events the checks read."""
        target = self.send("Target.createTarget", START_TIMEOUT_SECONDS, url="about:blank")[
            "targetId"
        ]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def drain(self) -> list[dict[str, Any]]:
        drained = []
        with contextlib.suppress(queue.Empty):
            while True:
                drained.append(self.events.get_nowait())
        return drained

    def navigate(self, url: str) -> list[dict[str, Any]]:
        """Load ``url`` to its load event; every event meanwhile, and a second more (the
        search worker, late scripts)."""
        self.drain()
        self.send("Page.navigate", url=url)
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + LOAD_TIMEOUT_SECONDS
        while not any(event.get("method") == "Page.loadEventFired" for event in seen):
            seen.append(self.events.get(timeout=max(0.1, deadline - time.monotonic())))
        time.sleep(1.0)
        return seen + self.drain()

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        reply = self.send(
            "Runtime.evaluate",
            timeout=timeout,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.session = ""
            self.send("Browser.close", timeout=5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self._to_chromium)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    executable = chromium_or_skip()
    opened = Browser(executable, tmp_path_factory.mktemp("chromium-profile"))
    try:
        opened.open_page()
        yield opened
    finally:
        opened.close()


def problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions and failed loads among ``events``."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            found.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"load failed: {params.get('errorText')}")
    return found


def requested_urls(events: list[dict[str, Any]]) -> list[str]:
    return [
        event["params"]["request"]["url"]
        for event in events
        if event.get("method") == "Network.requestWillBeSent"
    ]


@pytest.mark.parametrize(("path", "title"), PAGES)
def test_the_page_renders_with_no_console_errors_and_loads_only_from_127_0_0_1(
    browser: Browser, base_url: str, path: str, title: str
) -> None:
    events = browser.navigate(base_url + path)
    assert problems(events) == []
    for url in requested_urls(events):
        assert url.startswith(("http://127.0.0.1:", "data:", "blob:")), url
    heading = browser.evaluate("document.querySelector('article h1')?.textContent ?? ''")
    assert heading.replace("¶", "").strip() == title
    # Material's scripts ran: the search box exists and the navigation is built.
    assert browser.evaluate("document.querySelector('.md-search__input') !== null")
    assert browser.evaluate("document.querySelectorAll('.md-nav__link').length") > 20


def test_the_api_reference_renders_the_documented_names(browser: Browser, base_url: str) -> None:
    events = browser.navigate(base_url + "reference/http/")
    assert problems(events) == []
    headings = browser.evaluate("[...document.querySelectorAll('.doc-heading')].map(h => h.id)")
    assert "idempotency_middleware.IdempotencyMiddleware" in headings
    assert "idempotency_middleware.IdempotencyRule" in headings


SEARCH = """
(async () => {
  const input = document.querySelector('.md-search__input');
  input.focus();
  input.value = '%s';
  for (const type of ['input', 'keyup']) {
    input.dispatchEvent(new KeyboardEvent(type, {bubbles: true, key: 's'}));
  }
  const deadline = Date.now() + %d;
  while (Date.now() < deadline) {
    const links = [...document.querySelectorAll('.md-search-result__item a')];
    if (links.length) return links.map(a => a.getAttribute('href'));
    const meta = document.querySelector('.md-search-result__meta')?.textContent ?? '';
    if (meta.includes('No matching')) return [];
    await new Promise(resolve => setTimeout(resolve, 100));
  }
  return [];
})()
"""


def test_the_site_search_finds_the_page_for_wait_seconds(browser: Browser, base_url: str) -> None:
    events = browser.navigate(base_url)
    hrefs = browser.evaluate(SEARCH % ("wait_seconds", SEARCH_TIMEOUT_SECONDS * 1000), timeout=60)
    assert problems(events + browser.drain()) == []
    assert any("http/waiting/" in href for href in hrefs), hrefs


def test_the_site_search_finds_nothing_for_a_word_no_page_has(
    browser: Browser, base_url: str
) -> None:
    """The search above answers the query: a word on no page finds nothing."""
    browser.navigate(base_url)
    hrefs = browser.evaluate(SEARCH % ("zqxjkvw", SEARCH_TIMEOUT_SECONDS * 1000), timeout=60)
    assert hrefs == []


TYPED_RESULTS = """
(async () => {
  const deadline = Date.now() + %d;
  while (Date.now() < deadline) {
    const links = [...document.querySelectorAll('.md-search-result__item a')];
    if (links.length) return links.map(a => a.getAttribute('href'));
    await new Promise(resolve => setTimeout(resolve, 100));
  }
  return document.querySelector('.md-search-result__meta')?.textContent.trim() ?? '';
})()
"""


def test_wait_seconds_typed_into_the_search_box_lists_its_page(
    browser: Browser, base_url: str
) -> None:
    """Typed as a reader types (a key event per character, over HTTP as the site is served):
    the search worker starts, and the result list shows the waiting page. A search that never
    starts stays at "Initializing search", which the assertion shows."""
    events = browser.navigate(base_url)
    browser.evaluate("document.querySelector('.md-search__input').focus()")
    for character in "wait_seconds":
        browser.send("Input.dispatchKeyEvent", type="keyDown", key=character, text=character)
        browser.send("Input.dispatchKeyEvent", type="keyUp", key=character)
    found = browser.evaluate(TYPED_RESULTS % (SEARCH_TIMEOUT_SECONDS * 1000), timeout=60)
    assert problems(events + browser.drain()) == []
    assert isinstance(found, list), found
    assert any("http/waiting/" in href for href in found), found
