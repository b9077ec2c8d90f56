"""``make demo``: the idempotency middleware in FastAPI and Flask, against moto's DynamoDB
server on 127.0.0.1.

Starts moto's DynamoDB server on 127.0.0.1 (dummy credentials, AWS config ignored: nothing
here can reach a real AWS account), creates the table, serves ``demo/fastapi_app.py``
with uvicorn and ``demo/flask_app.py`` with waitress, and sends each the same requests
a client retrying over a flaky network would send. Every step is checked against the
behaviour the README documents; the exit status is 0 only when all of them behaved so.

    idempotency-middleware demo   (or: make demo)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aioboto3
import boto3
import httpx
import uvicorn
import waitress
from moto.server import ThreadedMotoServer

from .. import AsyncDynamoDBStore, DynamoDBStore
from . import fastapi_app, flask_app

REGION = "us-east-1"
TABLE = "idempotency-keys"
HEADER = "Idempotency-Key"
# The concurrent duplicate goes out this long after the first request, well inside the
# first one's SLOW_SECONDS, so it always finds the key in progress.
DUPLICATE_DELAY = 0.15


class DemoError(Exception):
    """Something around the demo failed (a server did not start or stop)."""


def isolate_from_aws() -> None:
    """Dummy credentials, no profiles or config files, no proxies for 127.0.0.1."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), "127.0.0.1,localhost"]))


def quiet_logs() -> None:
    for name in ("werkzeug", "moto", "uvicorn", "uvicorn.error", "uvicorn.access", "waitress"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in ("botocore", "boto3", "aiobotocore", "aioboto3"):
        logging.getLogger(name).setLevel(logging.ERROR)


class CallLog:
    """Names of the DynamoDB operations a store sends, from a botocore ``before-call`` hook."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: list[str] = []

    def hook(self, model: Any, **_: Any) -> None:
        with self._lock:
            self._names.append(str(model.name))

    def mark(self) -> int:
        with self._lock:
            return len(self._names)

    def since(self, mark: int) -> Counter[str]:
        with self._lock:
            return Counter(self._names[mark:])

    def attach(self, session: Any) -> Any:
        session.events.register("before-call.dynamodb", self.hook)
        return session


# --- servers ----------------------------------------------------------------------------


@contextlib.contextmanager
def local_dynamodb() -> Iterator[str]:
    """moto's DynamoDB on 127.0.0.1 with a free port; its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def serve_asgi(app: Any) -> Iterator[str]:
    """The app under uvicorn in a background thread; its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise DemoError("uvicorn did not start")
        time.sleep(0.01)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True  # also runs the app's lifespan shutdown (closes the store)
        thread.join(timeout=10)
        if thread.is_alive():
            raise DemoError("uvicorn did not shut down within 10 s")


@contextlib.contextmanager
def serve_wsgi(app: Any) -> Iterator[str]:
    """The app under waitress in a background thread; its base URL."""
    server = waitress.create_server(app, host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        # Let the tasks in flight end first: a WSGI response's close(), where the middleware
        # stores it, runs after the client has the response, and a socket closed under it
        # printed waitress's "Bad file descriptor" traceback (seen once in make test).
        server.task_dispatcher.shutdown(cancel_pending=False, timeout=10)
        # Close the listening socket from waitress's own loop thread (a trigger "thunk"):
        # closing it from here races with the loop's select() on it.
        try:
            server.trigger.pull_trigger(server.close)
        except OSError:  # the trigger's pipe is already gone: close from here instead
            with contextlib.suppress(OSError):
                server.close()
        thread.join(timeout=10)
        server.task_dispatcher.shutdown()
        if thread.is_alive():
            raise DemoError("waitress did not shut down within 10 s")


# --- the walkthrough --------------------------------------------------------------------

BODIES = {
    "2 books": b'{"item":"book","quantity":2}',
    "5 books": b'{"item":"book","quantity":5}',
    "1 pen": b'{"item":"pen","quantity":1}',
    "2 books, reordered": b'{ "quantity": 2,\n  "item":"book" }',
}
MALFORMED_KEY = '"unclosed'


@dataclass
class Row:
    step: str
    request: str
    status: int
    replayed: str
    runs: str
    calls: str
    shows: str
    problems: list[str] = field(default_factory=list)


Check = Callable[[list[httpx.Response], list[str]], None]


def describe_calls(calls: Counter[str]) -> str:
    """``3: Put x2, Update`` for two PutItem calls and one UpdateItem."""
    names = [
        name.removesuffix("Item") + ("" if n == 1 else f" x{n}")
        for name, n in sorted(calls.items())
    ]
    return f"{calls.total()}: " + ", ".join(names) if names else "0"


class Walkthrough:
    """Sends one app the requests of the walkthrough and checks every answer."""

    def __init__(self, client: httpx.Client, calls: CallLog) -> None:
        self.client = client
        self.calls = calls
        self.keys = {"A": str(uuid.uuid4()), "B": str(uuid.uuid4())}
        self.rows: list[Row] = []

    def post(self, path: str, key: str | None, body: str) -> httpx.Response:
        """POST ``body`` with the key labelled ``key`` (a literal key if it is no label), or
        with no key header at all for ``None``."""
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers[HEADER] = self.keys.get(key, key)
        return self.client.post(path, content=BODIES[body], headers=headers)

    def handler_runs(self) -> int:
        """How many orders the app has placed: its own counter, read over HTTP."""
        return int(self.client.get("/charges").json()["charges"])

    def run(self) -> list[Row]:
        [first] = self.step(
            "1",
            "POST /orders key A, 2 books",
            lambda: [self.post("/orders", "A", "2 books")],
            ["new key: the handler runs, response stored"],
            statuses=[201],
            runs=1,
            calls=Counter(PutItem=1, UpdateItem=1),
            check=not_replayed,
        )
        same_body = replay_of(first)
        self.step(
            "2",
            "POST /orders key A, 2 books",
            lambda: [self.post("/orders", "A", "2 books")],
            ["retry: first response replayed, same body"],
            statuses=[201],
            runs=1,
            calls=Counter(PutItem=1),
            check=same_body,
        )
        self.step(
            "3",
            "POST /orders key A, 5 books",
            lambda: [self.post("/orders", "A", "5 books")],
            ["same key, other body: refused, not run"],
            statuses=[422],
            runs=1,
            calls=Counter(PutItem=1),
            check=problem_json,
        )
        self.step(
            "4",
            "POST /slow-orders key B, 1 pen",
            self.concurrent_pair,
            [
                "a slow request runs (0.5 s) ...",
                "... a duplicate meanwhile: Retry-After: {retry_after}",
            ],
            statuses=[201, 409],
            runs=2,
            calls=Counter(PutItem=2, UpdateItem=1),
            check=conflict,
        )
        self.step(
            "5",
            f"POST /orders key {MALFORMED_KEY}, 2 books",
            lambda: [self.post("/orders", MALFORMED_KEY, "2 books")],
            ["malformed key: refused before DynamoDB"],
            statuses=[400],
            runs=2,
            calls=Counter(),
            check=problem_json,
        )
        self.step(
            "6",
            "POST /orders key A, 2 books, reordered",
            lambda: [self.post("/orders", "A", "2 books, reordered")],
            ["same JSON, other key order: still a replay"],
            statuses=[201],
            runs=2,
            calls=Counter(PutItem=1),
            check=same_body,
        )
        self.step(
            "7",
            "POST /orders no key, 2 books",
            lambda: [self.post("/orders", None, "2 books") for _ in range(2)],
            [
                "no key: passes through, the handler runs ...",
                "... and runs again: nothing is stored",
            ],
            statuses=[201, 201],
            runs=4,
            calls=Counter(),
            check=ran_every_time,
            then="  same, sent again",
        )
        return self.rows

    def concurrent_pair(self) -> list[httpx.Response]:
        """Two requests with one key, the second sent while the first is still running."""
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = pool.submit(self.post, "/slow-orders", "B", "1 pen")
            time.sleep(DUPLICATE_DELAY)
            second = self.post("/slow-orders", "B", "1 pen")
            return [first.result(), second]

    def step(
        self,
        step: str,
        request: str,
        send: Callable[[], list[httpx.Response]],
        shows: list[str],
        *,
        statuses: list[int],
        runs: int,
        calls: Counter[str],
        check: Check,
        then: str = f"  same, {DUPLICATE_DELAY} s later",
    ) -> list[httpx.Response]:
        """Send the step's requests, check them, and add one row per response; rows after
        the first are labelled ``then``."""
        mark = self.calls.mark()
        responses = send()
        made_calls = self.calls.since(mark)
        runs_so_far = self.handler_runs()
        problems: list[str] = []
        got = [response.status_code for response in responses]
        if got != statuses:
            titles = [problem_title(response) for response in responses]
            problems.append(f"expected status {statuses}, got {got} {titles}")
        if runs_so_far != runs:
            problems.append(f"expected {runs} handler run(s) so far, got {runs_so_far}")
        if made_calls != calls:
            problems.append(
                f"expected DynamoDB calls {describe_calls(calls)}, got {describe_calls(made_calls)}"
            )
        check(responses, problems)
        for index, response in enumerate(responses):
            leading = index == 0
            self.rows.append(
                Row(
                    step=step if leading else "",
                    request=request if leading else then,
                    status=response.status_code,
                    replayed=response.headers.get("idempotent-replayed", "-"),
                    runs=str(runs_so_far) if leading else "",
                    calls=describe_calls(made_calls) if leading else "",
                    shows=shows[index].format(retry_after=response.headers.get("retry-after")),
                    problems=problems if leading else [],
                )
            )
        return responses


def problem_title(response: httpx.Response) -> str:
    """The title of a problem+json answer (what went wrong), else the start of the body."""
    try:
        return str(response.json()["title"])
    except (ValueError, KeyError, TypeError):
        return response.text[:80]


def not_replayed(responses: list[httpx.Response], problems: list[str]) -> None:
    if "idempotent-replayed" in responses[0].headers:
        problems.append("a first response must not carry Idempotent-Replayed")


def replay_of(original: httpx.Response) -> Check:
    def check(responses: list[httpx.Response], problems: list[str]) -> None:
        replay = responses[0]
        if replay.headers.get("idempotent-replayed") != "true":
            problems.append("expected the header Idempotent-Replayed: true")
        if replay.content != original.content:
            problems.append(
                f"expected the first response's body {original.content!r}, got {replay.content!r}"
            )

    return check


def problem_json(responses: list[httpx.Response], problems: list[str]) -> None:
    content_type = responses[-1].headers.get("content-type", "")
    if not content_type.startswith("application/problem+json"):
        problems.append(f"expected an application/problem+json body, got {content_type!r}")


def ran_every_time(responses: list[httpx.Response], problems: list[str]) -> None:
    """Requests without a key are not replayed: each is a new order."""
    if any("idempotent-replayed" in response.headers for response in responses):
        problems.append("a request without a key must not be replayed")
    bodies = [response.content for response in responses]
    if len(set(bodies)) != len(bodies):
        problems.append("expected a new order for each request without a key, got the same")


def conflict(responses: list[httpx.Response], problems: list[str]) -> None:
    not_replayed(responses, problems)
    problem_json(responses, problems)
    if not responses[-1].headers.get("retry-after", "").isdigit():
        problems.append("expected a Retry-After header (seconds) on the 409")


# --- output -----------------------------------------------------------------------------

COLUMNS = (
    ("step", "step"),
    ("request", "request"),
    ("status", "status"),
    ("replayed", "Idempotent-Replayed"),
    ("runs", "handler runs"),
    ("calls", "DynamoDB calls"),
    ("shows", "what it shows"),
)


def print_table(title: str, rows: list[Row], keys: dict[str, str]) -> None:
    header = [label for _, label in COLUMNS]
    lines = [[str(getattr(row, name)) for name, _ in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(COLUMNS))]

    def show(cells: list[str]) -> None:
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        print("  " + "  ".join(padded).rstrip())

    print(title)
    show(header)
    show(["-" * width for width in widths])
    for line in lines:
        show(line)
    print("  " + ", ".join(f"key {label} = {key}" for label, key in keys.items()))
    for row in rows:
        for problem in row.problems:
            print(f"  FAILED step {row.step}: {problem}")
    print()


def print_legend() -> None:
    print(f"Each POST sends one of these JSON bodies, with an {HEADER} header (step 7 without):")
    width = max(map(len, BODIES))
    for name, body in BODIES.items():
        print(f"  {name.ljust(width)}  {body.decode()!r}")
    print("handler runs: orders the app has placed so far (its own counter, GET /charges)")
    print("DynamoDB calls: what the store sent during the step (a botocore event hook)\n")


# --- the two apps -----------------------------------------------------------------------


def client_for(url: str) -> httpx.Client:
    # trust_env=False: no proxy from the environment between the demo and 127.0.0.1.
    return httpx.Client(base_url=url, timeout=10.0, trust_env=False)


def run_fastapi(endpoint: str) -> list[Row]:
    calls = CallLog()
    store = AsyncDynamoDBStore(
        TABLE,
        endpoint_url=endpoint,
        region_name=REGION,
        session=calls.attach(aioboto3.Session()),
    )
    app = fastapi_app.create_app(store)  # its lifespan closes the store on shutdown
    with serve_asgi(app) as url, client_for(url) as client:
        walkthrough = Walkthrough(client, calls)
        rows = walkthrough.run()
    print_table(
        f"FastAPI + IdempotencyMiddleware + AsyncDynamoDBStore, under uvicorn at {url}",
        rows,
        walkthrough.keys,
    )
    return rows


def run_flask(endpoint: str) -> list[Row]:
    calls = CallLog()
    store = DynamoDBStore(
        TABLE,
        endpoint_url=endpoint,
        region_name=REGION,
        session=calls.attach(boto3.session.Session()),
    )
    with store:
        app = flask_app.create_app(store)
        with serve_wsgi(app) as url, client_for(url) as client:
            walkthrough = Walkthrough(client, calls)
            rows = walkthrough.run()
    print_table(
        f"Flask + IdempotencyWSGIMiddleware + DynamoDBStore, under waitress at {url}",
        rows,
        walkthrough.keys,
    )
    return rows


def main() -> int:
    started = time.monotonic()
    isolate_from_aws()
    quiet_logs()
    if sys.flags.dev_mode:
        print(
            "note: under python -X dev, aiohttp rejects the duplicate Server header moto sends, "
            "so the FastAPI app's store fails (503); run without -X dev.\n",
            file=sys.stderr,
        )
    try:
        with local_dynamodb() as endpoint:
            with DynamoDBStore(TABLE, endpoint_url=endpoint, region_name=REGION) as store:
                store.create_table()
            print(f"moto's DynamoDB server at {endpoint}, table {TABLE!r} created.\n")
            print_legend()
            rows = run_fastapi(endpoint) + run_flask(endpoint)
    except Exception as error:  # a setup failure, not a behaviour under test
        print(f"demo could not run: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    failed = [row for row in rows if row.problems]
    elapsed = time.monotonic() - started
    if failed:
        print(
            f"{len(failed)} step(s) did not behave as the README documents "
            f"(see FAILED lines above); {elapsed:.1f} s.",
            file=sys.stderr,
        )
        return 1
    print(f"Every step behaved as the README documents, in both apps ({elapsed:.1f} s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
