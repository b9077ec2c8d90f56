"""Shared pieces of the benchmarks: a raw ASGI driver, timing statistics, tables, servers.

Everything that talks to a server stays on 127.0.0.1. DynamoDB is moto's server; the
credentials below only let botocore sign requests, they never reach AWS.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Scope

from tests.support.ports import free_port

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for _variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(_variable, None)

REGION = "us-east-1"
HOST = "127.0.0.1"

# A ~100-byte JSON order, the request body every benchmark sends.
ORDER = {
    "customer": "cus_4f9a2b7c",
    "amount": 1999,
    "currency": "usd",
    "items": [{"sku": "A-100", "qty": 2}],
    "note": "leave at door",
}
BODY = json.dumps(ORDER).encode()
BODY_LENGTH = str(len(BODY)).encode()


# --- the raw ASGI driver ------------------------------------------------------------------


def http_scope(headers: list[tuple[bytes, bytes]], path: str = "/orders") -> Scope:
    """An HTTP scope shaped like uvicorn's (spec_version 2.3, so apps listen for disconnect)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
    }


def order_headers(key: bytes | None, body_length: bytes = BODY_LENGTH) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"content-length", body_length),
    ]
    if key is not None:
        headers.append((b"idempotency-key", key))
    return headers


class Exchange:
    """One request and its response over the raw ASGI interface, no sockets.

    ``receive`` gives the body once, then blocks until the response is complete and reports
    a disconnect, as a server does; ``send`` keeps the status and the size of the body only.
    """

    __slots__ = ("_body", "_done", "_finished", "_sent", "body_size", "headers", "status")

    def __init__(self, body: bytes = BODY) -> None:
        self._body = body
        self._sent = False
        self._finished = False
        self._done: asyncio.Event | None = None  # made only if the app awaits a disconnect
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_size = 0

    async def receive(self) -> Message:
        if not self._sent:
            self._sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        if not self._finished:
            if self._done is None:
                self._done = asyncio.Event()
            await self._done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = message.get("headers", [])
        elif kind == "http.response.body":
            self.body_size += len(message.get("body", b""))
            if not message.get("more_body", False):
                self._finished = True
                if self._done is not None:
                    self._done.set()

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


async def call_once(app: ASGIApp, key: bytes | None, body: bytes = BODY) -> Exchange:
    exchange = Exchange(body)
    headers = order_headers(key, str(len(body)).encode())
    await app(http_scope(headers), exchange.receive, exchange.send)
    return exchange


async def timed_batch(app: ASGIApp, keys: Sequence[bytes | None], expected_status: int) -> float:
    """Mean seconds per request over ``keys``; raises if any response had another status."""
    gc.collect()
    wrong = 0
    start = time.perf_counter()
    for key in keys:
        exchange = Exchange()
        await app(http_scope(order_headers(key)), exchange.receive, exchange.send)
        if exchange.status != expected_status:
            wrong += 1
    elapsed = time.perf_counter() - start
    if wrong:
        raise RuntimeError(f"{wrong} of {len(keys)} responses were not {expected_status}")
    return elapsed / len(keys)


# --- statistics and tables ------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def quantile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank quantile of already sorted values."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def signed_us(seconds: float) -> str:
    return f"{seconds * 1e6:+.1f}"


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into the README)."""
    widths = [len(header) for header in headers]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(cells)) + " |"

    out = [f"### {title}", "", line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


def heading(text: str) -> None:
    print()
    print(f"## {text}")
    print(flush=True)


# --- optional (benchmark-only) packages ----------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """Attributes of an optional package, or why it could not be imported."""

    distribution: str
    version: str
    attributes: dict[str, Any]
    error: str = ""

    @property
    def available(self) -> bool:
        return not self.error


def load(distribution: str, names: dict[str, tuple[str, str]]) -> Loaded:
    """Import ``{alias: (module, attribute)}`` from an optional distribution, never failing.

    Peers are imported by name at run time so that mypy and CI do not need them installed.
    """
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return Loaded(
            distribution, "-", {}, "not installed (pip install -r benchmarks/requirements.txt)"
        )
    attributes: dict[str, Any] = {}
    try:
        for alias, (module, attribute) in names.items():
            attributes[alias] = getattr(importlib.import_module(module), attribute)
    except Exception as error:  # any import failure is reported in the table, not raised
        return Loaded(distribution, version, {}, f"import failed: {error!r}")
    return Loaded(distribution, version, attributes)


# --- machine ----------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_summary() -> str:
    load_average = ""
    with contextlib.suppress(OSError):
        load_average = ", load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"CPU: {cpu_model()}, {os.cpu_count()} cores{load_average}; "
        f"Python {platform.python_version()} ({platform.python_implementation()}) "
        f"on {platform.system()} {platform.release()}"
    )


# --- servers on 127.0.0.1 ---------------------------------------------------------------------


def wait_for_port(port: int, process: subprocess.Popen[bytes] | None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on {HOST}:{port} within {timeout} s")


def quiet_werkzeug() -> None:
    """moto's server is werkzeug's: without this it logs every request to stderr."""
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.setLevel(logging.ERROR)
    if not werkzeug.handlers:
        werkzeug.addHandler(logging.NullHandler())


@contextlib.contextmanager
def moto_in_thread() -> Iterator[str]:
    """moto's ThreadedMotoServer in this process; yields its URL."""
    from moto.server import ThreadedMotoServer

    quiet_werkzeug()
    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


_MOTO_CHILD = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
sys.stdin.read()
server.stop()
"""


@contextlib.contextmanager
def child_process(
    argv: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process of ours, ended (by its own pid) when the block exits."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env={**os.environ, **(env or {})},
        )
        try:
            yield process
        except BaseException:
            errors.seek(0)
            tail = errors.read()[-2000:].decode(errors="replace")
            if tail:
                print(f"[{argv[-1]}] stderr:\n{tail}", file=sys.stderr)
            raise
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def moto_in_process() -> Iterator[str]:
    """moto's ThreadedMotoServer in a child process (so it does not share our GIL)."""
    port = free_port()
    with child_process([sys.executable, "-c", _MOTO_CHILD, str(port)]) as process:
        wait_for_port(port, process)
        yield f"http://{HOST}:{port}"


def create_table(endpoint_url: str, table_name: str) -> None:
    from idempotency_middleware import DynamoDBStore

    with DynamoDBStore(table_name, endpoint_url=endpoint_url, region_name=REGION) as store:
        store.create_table()
