"""Every code block of the site is a file under ``docs/snippets/`` or ``examples/`` (no page
writes code inline: tests/docs/test_readme_examples.py); this holds the snippet files to what
they show.

- **Python**: every snippet runs, as a script in an empty directory, to its end; a snippet
  shows a section of its file (``--8<-- "file.py:show"``) when the rest sets it up or checks
  what the shown part did (the Prometheus counters counted the replay, a rule refused a
  request without a key). The quick starts run in tests/docs/test_readme_quickstarts.py and the
  create-table snippet in tests/docs/test_quickstarts.py, the PostgreSQL one here on the test
  server.
- **Shell**: every command is one this project has: ``make`` targets of the Makefile, the
  package's extras in ``pip install``, the command line's sub-commands and options (parsed by
  its own parser), and apps that are examples. The commands that run an example are run in
  tests/docs/test_docs_commands.py.
- **DynamoDB**: the CloudFormation and Terraform tables have the key and TTL attribute that
  ``create_table()`` makes (on moto); the IAM policies and the Step Functions definition are
  JSON.
- **HTTP**: the problem responses are what the middleware answers a reused key (with
  ``problem_base_url``) and what a wrong PIN gets: status, headers and body.
- **Command line**: a missing table and a missing SQLite file are answered with the page's
  messages and exit statuses.
- **Logs**: the store-failure lines on the observability page have the shape the middleware
  writes (made here by a store that cannot open its file).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML, MkDocs' dependency

from idempotency_middleware import DynamoDBStore
from idempotency_middleware.cli.main import build_parser
from tests.conftest import REGION

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
INCLUDE = re.compile(r'--8<-- "([^":]+)(?::([\w-]+))?"')
# Run by their own tests (see the module docstring).
RUN_ELSEWHERE = {"quickstart", "create_table.py"}
# The consumers page's FastStream programs run on real brokers: tests/e2e/test_faststream_page.py.
RUN_ELSEWHERE |= {
    f"consumers-faststream-{broker}.py" for broker in ("redis", "rabbit", "nats", "kafka")
}
NEEDS_POSTGRES = {"stores-postgres-2.py"}
PYTHON = sorted(
    path.relative_to(SNIPPETS).as_posix()
    for path in SNIPPETS.rglob("*.py")
    if path.relative_to(SNIPPETS).parts[0] not in RUN_ELSEWHERE
)
SHELL = sorted(
    path.relative_to(SNIPPETS).as_posix()
    for path in SNIPPETS.rglob("*")
    if (path.suffix == ".sh" or (path.suffix == ".txt" and "$ " in path.read_text()))
    and path.parts[-2] != "run"
)
# Programs a page may name besides this project's own: servers, clients and tools.
OTHER_PROGRAMS = {"aws", "cd", "curl", "git", "gunicorn", "moto_server", "echo", "head", "python"}


def pages_and_readme() -> list[Path]:
    return [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]


def includes() -> list[tuple[str, str | None]]:
    return [
        (match.group(1), match.group(2))
        for page in pages_and_readme()
        for match in INCLUDE.finditer(page.read_text())
    ]


def environment(tmp_path: Path) -> dict[str, str]:
    """No AWS settings from this machine, the repository importable."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(
        PYTHONPATH=str(ROOT),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    return env


def run_snippet(name: str, tmp_path: Path, **extra_env: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SNIPPETS / name)],
        cwd=tmp_path,
        env={**environment(tmp_path), **extra_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(set(PYTHON) - NEEDS_POSTGRES))
def test_the_python_snippet_runs(name: str, tmp_path: Path) -> None:
    run_snippet(name, tmp_path)


def test_the_postgres_snippet_creates_its_table(postgres_dsn: str, tmp_path: Path) -> None:
    run_snippet("stores-postgres-2.py", tmp_path, DATABASE_URL=postgres_dsn)


def test_every_snippet_file_is_shown_somewhere() -> None:
    shown = {path for path, _ in includes()}
    for path in SNIPPETS.rglob("*"):
        if path.is_file():
            relative = path.relative_to(ROOT).as_posix()
            assert relative in shown or path.read_text() in (ROOT / "README.md").read_text(), (
                relative
            )


def test_every_section_a_page_shows_is_in_its_file() -> None:
    for path, section in includes():
        assert (ROOT / path).is_file(), path
        if section is not None:
            text = (ROOT / path).read_text()
            assert f"# --8<-- [start:{section}]" in text, (path, section)
            assert f"# --8<-- [end:{section}]" in text, (path, section)


def commands(text: str) -> list[list[str]]:
    """The commands of a shell snippet: continuations joined, prompts, comments, output
    lines and leading variable assignments dropped, ``&&`` / ``&`` / ``|`` split."""
    found = []
    joined = text.replace("\\\n", " ")
    prompted = "$ " in joined
    for line in joined.splitlines():
        if prompted and not line.startswith("$ "):
            continue  # the output of the command above
        line = line.removeprefix("$ ")
        for part in re.split(r"&&|&(?!\S)|;|\|", line.split(" # ")[0].split("   #")[0]):
            words = shlex.split(part.replace("<the repository>", "REPOSITORY"))
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words.pop(0)
            if words:
                found.append(words)
    return found


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def extras() -> set[str]:
    return set(metadata.metadata("idempotency-middleware").get_all("Provides-Extra") or [])


def check_command(words: list[str]) -> None:
    program, arguments = words[0], words[1:]
    if program == "make":
        assert set(arguments) <= make_targets(), arguments
    elif program == "pip":
        for argument in arguments:
            match = re.fullmatch(r"(?:\.|idempotency-middleware)\[([\w,]+)\]", argument)
            if match:
                assert set(match.group(1).split(",")) <= extras(), argument
    elif program == "idempotency-middleware":
        build_parser().parse_args(arguments)  # exits (SystemExit) on an unknown option
    elif program in ("uvicorn", "waitress-serve", "flask"):
        apps = [argument for argument in arguments if re.fullmatch(r"[\w.]+:\w+", argument)]
        if program == "flask":
            apps = [arguments[arguments.index("--app") + 1]]
        modules = {app.split(":")[0].removeprefix("examples.") for app in apps} - {"myapp", "app"}
        for module in modules:
            assert (ROOT / "examples" / f"{module}.py").is_file(), module
    else:
        assert program in OTHER_PROGRAMS, words


@pytest.mark.parametrize("name", SHELL)
def test_every_command_of_the_shell_snippet_is_one_the_project_has(name: str) -> None:
    found = commands((SNIPPETS / name).read_text())
    assert found, name
    for words in found:
        check_command(words)


def test_the_table_templates_match_what_create_table_makes(moto_endpoint: str) -> None:
    table = f"docs-{uuid.uuid4().hex[:8]}"
    with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        store.create_table()
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    described = client.describe_table(TableName=table)["Table"]
    ttl = client.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    client.close()
    [key] = described["KeySchema"]

    template: dict[str, Any] = yaml.safe_load((SNIPPETS / "stores-dynamodb-2.yaml").read_text())
    properties = template["IdempotencyTable"]["Properties"]
    assert properties["KeySchema"] == [key]
    assert properties["AttributeDefinitions"] == described["AttributeDefinitions"]
    assert properties["BillingMode"] == described["BillingModeSummary"]["BillingMode"]
    assert properties["TimeToLiveSpecification"] == {
        "AttributeName": ttl["AttributeName"],
        "Enabled": True,
    }

    terraform = (SNIPPETS / "stores-dynamodb-3.tf").read_text()
    assert f'hash_key     = "{key["AttributeName"]}"' in terraform
    assert f'billing_mode = "{properties["BillingMode"]}"' in terraform
    assert f'attribute_name = "{ttl["AttributeName"]}"' in terraform


@pytest.mark.parametrize("name", sorted(path.name for path in SNIPPETS.glob("*.json")))
def test_the_json_snippet_is_json(name: str) -> None:
    document = json.loads((SNIPPETS / name).read_text())
    statements = document.get("Statement", [document])
    for statement in statements:
        assert statement["Effect"] == "Allow"
        assert all(re.fullmatch(r"(dynamodb|s3|states):[A-Z]\w+", a) for a in statement["Action"])


@pytest.mark.parametrize("name", sorted(path.name for path in SNIPPETS.glob("*.http")))
def test_the_problem_in_the_http_snippet_is_json_with_its_status(name: str) -> None:
    text = (SNIPPETS / name).read_text()
    status_line = re.search(r"^HTTP/1\.1 (\d{3}) ", text, re.MULTILINE)
    assert status_line is not None
    problem = json.loads(text.strip().splitlines()[-1])
    assert problem["status"] == int(status_line.group(1))
    assert {"type", "title", "status", "detail"} <= set(problem)


def test_the_api_reference_documents_every_public_name() -> None:
    import idempotency_middleware

    reference = "".join(page.read_text() for page in (ROOT / "docs" / "reference").glob("*.md"))
    for name in idempotency_middleware.__all__:
        assert f"::: idempotency_middleware.{name}\n" in reference, name


# The shape of a store-failure log line, as the observability page shows it (the key
# shortened there) and as the middleware writes it.
STORE_FAILED = re.compile(
    r"idempotency store failed(?:: (?:claim|complete): .+"
    r"| on claim: .+; handler run WITHOUT idempotency protection)"
    r" \(key [0-9a-f]+(?:\.\.\.)?; POST /orders\)"
)


def test_the_store_failure_log_lines_have_the_shape_the_middleware_writes(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from idempotency_middleware import IdempotencyMiddleware, SQLiteStore

    shown = (SNIPPETS / "operating-observability-1.txt").read_text().splitlines()
    assert shown and all(STORE_FAILED.fullmatch(line) for line in shown), shown
    written = []
    for on_store_error in ("fail", "run"):
        app = FastAPI()
        app.post("/orders")(lambda: {})
        store = SQLiteStore(str(tmp_path / "missing" / "idempotency.sqlite3"))
        app.add_middleware(IdempotencyMiddleware, store=store, on_store_error=on_store_error)
        caplog.clear()
        with caplog.at_level("ERROR", logger="idempotency_middleware"):
            TestClient(app).post("/orders", headers={"Idempotency-Key": "k"})
        written += [record.getMessage() for record in caplog.records]
    assert any("WITHOUT" in line for line in written), written
    assert all(STORE_FAILED.fullmatch(line) for line in written), written


def test_the_command_line_answers_a_missing_table_as_its_page_shows(
    moto_endpoint: str, tmp_path: Path
) -> None:
    """operating-cli-2.txt: the command, its message and its exit status, run on moto (the
    endpoint in the message is then moto's, not the Region's)."""
    shown = (SNIPPETS / "operating-cli-2.txt").read_text().splitlines()
    command, message, _, status = shown
    endpoint = f"https://dynamodb.{REGION}.amazonaws.com"
    env = {**environment(tmp_path), "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    arguments = shlex.split(command.removeprefix("$ ").replace("eu-west-1", REGION))
    result = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", *arguments[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    expected = message.replace("eu-west-1", REGION).replace(endpoint, moto_endpoint)
    assert (result.stdout + result.stderr).strip() == expected
    assert result.returncode == int(status)


def test_the_command_line_refuses_a_missing_sqlite_file_as_its_page_shows(
    tmp_path: Path,
) -> None:
    """operating-cli-3.txt: the command, its message and its exit status, and no file made."""
    command, message, _, status = (SNIPPETS / "operating-cli-3.txt").read_text().splitlines()
    arguments = shlex.split(command.removeprefix("$ "))
    result = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", *arguments[1:]],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.stdout + result.stderr).strip() == message
    assert result.returncode == int(status)
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_shows_a_function_and_a_consumer_record_as_its_page_shows(
    tmp_path: Path,
) -> None:
    """operating-cli-4.txt: a function's result decoded, a consumer's verdict, the second
    piped into ``head`` as the page pipes it ("…" stands for a hash or a time)."""
    from idempotency_middleware import IdempotentConsumer, SQLiteStore, idempotent

    with SQLiteStore(tmp_path / "billing.sqlite3") as store:

        @idempotent(store=store, key="order", name="billing.charge")
        def charge(order: str) -> dict[str, Any]:
            return {"charged": order, "amount": 12}

        charge("order-1")
    with SQLiteStore(tmp_path / "orders.sqlite3") as store:
        consumer = IdempotentConsumer(
            lambda message: "shipped", store=store, key=lambda m: m["id"], name="orders.ship"
        )
        assert consumer.process({"id": "m-1"}).action == "ack"
    text = (SNIPPETS / "operating-cli-4.txt").read_text()
    for block in text.split("$ ")[1:]:
        command, *shown = block.splitlines()
        module = f"{shlex.quote(sys.executable)} -m idempotency_middleware"
        result = subprocess.run(
            ["/bin/sh", "-c", command.replace("idempotency-middleware", module, 1)],
            cwd=tmp_path,
            env=environment(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (result.returncode, result.stderr) == (0, "")
        printed = result.stdout.splitlines()
        assert len(printed) == len(shown)
        for line, expected in zip(printed, shown, strict=True):
            pattern = ".+".join(re.escape(part) for part in expected.split("…"))
            assert re.fullmatch(pattern, line), (line, expected)


def shown_response(name: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The status line, the headers and the JSON body of the response an .http snippet
    shows (after its request, when it shows one)."""
    text = (SNIPPETS / name).read_text()
    response = text[text.index("HTTP/1.1 ") :].strip().splitlines()
    blank = response.index("")
    headers = dict(line.split(": ", 1) for line in response[1:blank])
    return response[0], {k.lower(): v for k, v in headers.items()}, json.loads(response[-1])


def test_the_key_reused_problem_is_what_the_middleware_answers() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from idempotency_middleware import IdempotencyMiddleware, MemoryStore

    status_line, headers, body = shown_response("http-semantics-1.http")
    app = FastAPI()
    app.post("/orders")(lambda: {})
    app.add_middleware(
        IdempotencyMiddleware,
        store=MemoryStore(),
        problem_base_url="https://api.example.com/problems/",
    )
    client = TestClient(app)
    client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k"})
    reused = client.post("/orders", json={"item": "pen"}, headers={"Idempotency-Key": "k"})
    assert status_line.startswith(f"HTTP/1.1 {reused.status_code} ")
    assert reused.headers["content-type"] == headers["content-type"]
    assert reused.headers["link"] == headers["link"]
    assert reused.json() == body


def test_the_invalid_pin_problem_is_what_a_wrong_pin_gets() -> None:
    from idempotency_middleware import InvalidPinError, MemoryStore, OneTimeActions

    status_line, headers, body = shown_response("one-time-actions-2.http")
    actions = OneTimeActions(MemoryStore())
    action = actions.create(expires_in=60, pin="4821")
    with pytest.raises(InvalidPinError) as refused:
        actions.consume(action.action_id, pin="0000")
    assert status_line.startswith(f"HTTP/1.1 {refused.value.status} ")
    assert headers["content-type"] == "application/problem+json"
    assert refused.value.problem() == body
