"""Every code block of the site is a file under ``docs/snippets/`` or ``examples/`` (no page
writes code inline: tests/docs/test_readme_examples.py); this holds the snippet files to what
they show.

- **Python, as pasted**: every Python include of every page, and every Python block of the
  README, is run as exactly the text the reader sees (the named section, or the whole file, as
  the site's extension extracts it) and nothing else: a program of its own in an empty
  directory (tests/support/snippet_programs.py), which must run to its end. A name the shown
  part uses without importing or defining it fails it. Its services are the tests': every
  program gets moto's endpoint in the AWS SDK's variables (``AWS_ENDPOINT_URL``, test
  credentials, the Region), and the snippets that reach PostgreSQL or SQS read the URL of the
  test server from ``DATABASE_URL`` or create their queue there. The FastStream snippets
  (``docs/snippets/consumers-faststream*``) need a broker each and run, per broker, in
  tests/e2e/test_faststream_page.py. The SQS worker snippet runs until it is stopped: it is
  run here on moto's SQS and stopped with SIGTERM once it consumed the queue.
- **Python, whole files**: every snippet file also runs whole, to its end; a snippet shows a
  section of its file (``--8<-- "file.py:show"``) when the rest checks what the shown part
  did (the Prometheus counters counted the replay, a rule refused a request without a key).
  The quick starts also run in tests/docs/test_readme_quickstarts.py and the create-table
  snippet in tests/docs/test_quickstarts.py.
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
import signal
import subprocess
import sys
import time
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
from tests.support import snippet_programs
from tests.support.snippet_programs import python_blocks, python_includes, shown_text

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
INCLUDE = re.compile(r'--8<-- "([^":]+)(?::([\w-]+))?"')
# Run by their own tests (see the module docstring).
RUN_ELSEWHERE = {"quickstart", "create_table.py"}
# The consumers page's FastStream programs run on real brokers: tests/e2e/test_faststream_page.py.
RUN_ELSEWHERE |= {
    f"consumers-faststream-{broker}.py" for broker in ("redis", "rabbit", "nats", "kafka")
}
# The agents page's client calls its server over HTTP: tests/e2e/test_agents_page.py.
RUN_ELSEWHERE |= {"agents-client.py"}
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


# --- Python snippets, as pasted ------------------------------------------------------------

# Run per broker in tests/e2e/test_faststream_page.py.
RUN_PER_BROKER = "docs/snippets/consumers-faststream"
# Runs until stopped: test_the_sqs_worker_snippet_consumes_its_queue_and_stops_on_sigterm.
RUNS_UNTIL_STOPPED = {"docs/snippets/consumers-sqs.py:show"}
# Need the reader's queues: run as shown by the redrive steps' test in
# tests/e2e/test_sqs_dead_letters.py.
NEEDS_QUEUES = {f"docs/snippets/consumers-redrive.py:{section}" for section in ("keys", "move")}
# The test server each reaches, through the variable the snippet reads.
NEEDS_POSTGRES_SHOWN = {"docs/snippets/stores-postgres-2.py:show"}
PROGRAM_SECONDS = 120.0


def shown_programs() -> dict[str, str]:
    """Each distinct text a reader can paste: by its include (or README block), in page order."""
    programs: dict[str, str] = {}
    for include in python_includes(pages_and_readme(), ROOT):
        if include.path.startswith(RUN_PER_BROKER):
            continue
        text = shown_text(ROOT, include.path, include.section)
        if text not in programs.values():
            programs[include.name] = text
    for number, block in enumerate(python_blocks(ROOT / "README.md"), 1):
        if block not in programs.values():
            programs[f"README.md:python-{number}"] = block
    return programs


SHOWN = shown_programs()
SHOWN_WITHOUT_SERVERS = sorted(
    set(SHOWN)
    - RUNS_UNTIL_STOPPED
    - NEEDS_POSTGRES_SHOWN
    - NEEDS_QUEUES
    - {"docs/snippets/agents-client.py"}
)


# What the pages tell the reader to set, as a deployment would: the encryption keys (the
# Encryption page: "an env variable"), the state machine the Long-running page starts, and
# the settings module of a Django project (a minimal one of the tests, for asgi.py/wsgi.py).
READER_SETTINGS = {
    "IDEMPOTENCY_KEY_2026_10": os.urandom(32).hex(),
    "IDEMPOTENCY_KEY_2026_11": os.urandom(32).hex(),
    "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:orders",
    "DJANGO_SETTINGS_MODULE": "tests.support.docs_django_settings",
}


def aws_environment(tmp_path: Path, moto_endpoint: str) -> dict[str, str]:
    """Every AWS client a program makes talks to moto, with test credentials; the reader's
    settings set."""
    return {
        **environment(tmp_path),
        **READER_SETTINGS,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }


def programs(
    texts: dict[str, str], base: Path, env: dict[str, str]
) -> dict[str, snippet_programs.Result]:
    """Each text run once (a whole file a page shows is also its snippet file), its result
    under every name it has."""
    names_of: dict[str, list[str]] = {}
    for name, text in texts.items():
        names_of.setdefault(text, []).append(name)
    jobs = []
    for number, (text, names) in enumerate(names_of.items()):
        directory = base / f"program-{number}"
        directory.mkdir()
        jobs.append(snippet_programs.Job(names[0], text, str(directory), env, PROGRAM_SECONDS))
    results = snippet_programs.run_programs(jobs, ROOT)
    return {name: results[names[0]] for names in names_of.values() for name in names}


@pytest.fixture(scope="module")
def ran(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str
) -> dict[str, snippet_programs.Result]:
    """Every shown text and every snippet file that needs no server but moto, run at once."""
    base = tmp_path_factory.mktemp("snippets")
    texts = {name: SHOWN[name] for name in SHOWN_WITHOUT_SERVERS}
    texts.update({name: (SNIPPETS / name).read_text() for name in set(PYTHON) - NEEDS_POSTGRES})
    return programs(texts, base, aws_environment(base, moto_endpoint))


def assert_ran_to_its_end(result: snippet_programs.Result) -> None:
    assert result.returncode == 0, f"{result.name} exited {result.returncode}:\n{result.output}"


@pytest.mark.parametrize("name", SHOWN_WITHOUT_SERVERS)
def test_the_python_a_page_shows_runs_as_pasted(
    name: str, ran: dict[str, snippet_programs.Result]
) -> None:
    assert_ran_to_its_end(ran[name])


@pytest.mark.parametrize("name", sorted(set(PYTHON) - NEEDS_POSTGRES))
def test_the_python_snippet_file_runs_whole(
    name: str, ran: dict[str, snippet_programs.Result]
) -> None:
    assert_ran_to_its_end(ran[name])


@pytest.mark.parametrize("name", sorted(NEEDS_POSTGRES_SHOWN))
def test_the_postgres_snippet_runs_as_pasted_on_the_test_server(
    name: str, postgres_dsn: str, moto_endpoint: str, tmp_path: Path
) -> None:
    env = {**aws_environment(tmp_path, moto_endpoint), "DATABASE_URL": postgres_dsn}
    [result] = programs({name: SHOWN[name]}, tmp_path, env).values()
    assert_ran_to_its_end(result)


def queue_is_empty(sqs: Any, queue_url: str) -> bool:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)
    return all(attributes["Attributes"][name] == "0" for name in names)


def test_the_sqs_worker_snippet_consumes_its_queue_and_stops_on_sigterm(
    moto_endpoint: str, tmp_path: Path
) -> None:
    """As pasted, on moto's SQS: the queue it reads from ``QUEUE_URL`` is consumed, and a
    SIGTERM (what a deployment sends) ends it cleanly, after the receive in hand."""
    [name] = RUNS_UNTIL_STOPPED
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    queue_url = sqs.create_queue(QueueName=f"payments-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    key = {"IdempotencyKey": {"DataType": "String", "StringValue": "payment-1"}}
    sqs.send_message(QueueUrl=queue_url, MessageBody="pay 10 to alice", MessageAttributes=key)
    sqs.send_message(QueueUrl=queue_url, MessageBody="pay 20 to bob")  # keyed by its id
    program = tmp_path / "program" / "snippet.py"
    program.parent.mkdir()
    program.write_text(SHOWN[name])
    directory = tmp_path / "empty"
    directory.mkdir()
    env = {**aws_environment(tmp_path, moto_endpoint), "QUEUE_URL": queue_url}
    with subprocess.Popen(
        [sys.executable, str(program)],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        try:
            deadline = time.monotonic() + PROGRAM_SECONDS
            while not queue_is_empty(sqs, queue_url) and process.poll() is None:
                assert time.monotonic() < deadline, "the queue was not consumed"
                time.sleep(0.2)  # polling the queue, not waiting out a deadline
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=PROGRAM_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
    sqs.close()
    assert process.returncode == 0, output
    assert "giving up" not in output, output
    assert (directory / "payments-idempotency.sqlite3").is_file()


def test_the_postgres_snippet_creates_its_table(postgres_dsn: str, tmp_path: Path) -> None:
    run_snippet("stores-postgres-2.py", tmp_path, DATABASE_URL=postgres_dsn)


def test_a_shown_section_that_uses_an_import_above_it_fails(tmp_path: Path) -> None:
    """The runner's own check: the import sits above the section a page shows, so the text
    run lacks it and the program fails with the name it misses."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "snippet.py").write_text(
        "import os\n\n# --8<-- [start:show]\nprint(os.getcwd())\n# --8<-- [end:show]\n"
    )
    page = tmp_path / "docs" / "page.md"
    page.write_text('```python\n--8<-- "snippet.py:show"\n```\n')
    [include] = python_includes([page], tmp_path)
    text = shown_text(tmp_path, include.path, include.section)
    assert text == "print(os.getcwd())\n"
    directory = tmp_path / "empty"
    directory.mkdir()
    job = snippet_programs.Job(include.name, text, str(directory), environment(tmp_path), 60.0)
    [result] = snippet_programs.run_programs([job], ROOT).values()
    assert result.returncode == 1
    assert "NameError: name 'os' is not defined" in result.output


def test_a_shown_whole_file_that_imports_what_it_uses_runs(tmp_path: Path) -> None:
    """The counterpart: the same program with its import runs, in its empty directory."""
    directory = tmp_path / "empty"
    directory.mkdir()
    text = "import os\n\nassert os.listdir() == [], os.listdir()\n"
    job = snippet_programs.Job("whole", text, str(directory), environment(tmp_path), 60.0)
    [result] = snippet_programs.run_programs([job], ROOT).values()
    assert (result.returncode, result.output) == (0, "")


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
