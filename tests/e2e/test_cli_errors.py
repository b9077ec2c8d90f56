"""The operator command line's less travelled paths: a binary body shown as hex, a record
that disappears between ``delete``'s read and its delete, and a store that fails.

A failing store is told apart, in the real command run in a subprocess with the AWS settings
of its environment under the test's control: a misconfiguration (no table, no region, no or
rejected credentials, access denied, a file that cannot be opened) exits 4 saying what to
fix; an outage (unreachable, throttled, a failing file) exits 3. An SQLite path that names
no file exits 4 too, in every command but ``create-table``, and no database is created.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from idempotency_middleware import DynamoDBStore, SQLiteStore
from idempotency_middleware.cli.main import (
    EXIT_MISCONFIGURED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STORE,
    EXIT_USAGE,
    build_parser,
    main,
)
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.protocol import Claimed, ClaimRequest, Completion
from idempotency_middleware.stores.records import StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION
from tests.contract.test_store_kit import AnswerRewritingProxy
from tests.support.diag_aws import RejectingEndpoint, aws_environment
from tests.support.faultproxy import FaultProxy

BINARY_BODY = b"\x89PNG\r\n\x1a\n\xff\xfe"


def test_show_prints_a_body_that_is_not_utf8_as_hex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "idem.sqlite3"
    hashed = storage_key("POST", "/images", None, "img-1")
    clock = FakeClock()
    store = SQLiteStore(path, clock=clock)
    try:
        assert store.claim(ClaimRequest(hashed, "fp", "owner", clock.now(), 30)) == Claimed()
        response = StoredResponse(201, [(b"content-type", b"image/png")], BINARY_BODY)
        assert store.complete(Completion(hashed, "owner", clock.now(), 3600, response))
    finally:
        store.close()

    code = main(["show", "img-1", "--route", "/images", "--sqlite", str(path)])

    assert code == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["key_hash"] == hashed
    assert shown["response"]["body"] is None
    assert shown["response"]["body_hex"] == BINARY_BODY.hex()
    assert shown["response"]["headers"] == [["content-type", "image/png"]]


class DeletedMeanwhileProxy(AnswerRewritingProxy):
    """Sends every DeleteItem to moto twice: the first lands as another operator's delete
    made between the CLI's read and its own delete; the CLI gets the second's answer."""

    def _answer(
        self, operation: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        if operation == "DeleteItem":
            super()._answer(operation, body, headers)
        return super()._answer(operation, body, headers)


@pytest.fixture
def deleting_proxy(moto_endpoint: str) -> Iterator[DeletedMeanwhileProxy]:
    running = DeletedMeanwhileProxy(moto_endpoint)
    with running:
        yield running


def test_delete_reports_not_found_when_the_record_went_between_read_and_delete(
    moto_endpoint: str,
    dynamodb_table: str,
    deleting_proxy: DeletedMeanwhileProxy,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hashed = storage_key("POST", "/orders", None, "order-9")
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        assert store.claim(ClaimRequest(hashed, "fp", "owner", 1_700_000_000.0, 30)) == Claimed()

    code = main(
        [
            "delete",
            "order-9",
            "--route",
            "/orders",
            "--table",
            dynamodb_table,
            "--endpoint-url",
            deleting_proxy.url,
            "--region",
            REGION,
        ]
    )

    assert code == EXIT_NOT_FOUND
    captured = capsys.readouterr()
    assert f"no record for key hash {hashed}" in captured.err
    assert "deleted record" not in captured.out
    # (each DeleteItem is recorded twice: the other operator's and the CLI's own)
    assert deleting_proxy.operations == ["GetItem", "DeleteItem", "DeleteItem"]
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        assert store.get(hashed) is None


# --- a failing store, through the real command ------------------------------------------------


def run_cli(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )


def show(table: str, endpoint: str, *more: str) -> list[str]:
    return ["show", "k", "--route", "/orders", "--table", table, "--endpoint-url", endpoint, *more]


def test_a_missing_table_names_the_region_from_the_environment(
    moto_endpoint: str, tmp_path: Path
) -> None:
    table = f"missing-{uuid.uuid4().hex[:8]}"
    result = run_cli(aws_environment(tmp_path, region="eu-west-1"), *show(table, moto_endpoint))
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr == (
        f"table '{table}' does not exist in region eu-west-1 at {moto_endpoint}: create it "
        f"with `idempotency-middleware create-table --table {table} "
        f"--endpoint-url {moto_endpoint}`\n"
    )


def test_no_region_anywhere_says_where_to_give_one(moto_endpoint: str, tmp_path: Path) -> None:
    result = run_cli(aws_environment(tmp_path, region=None), *show("t", moto_endpoint))
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr.startswith("no AWS region configured: pass --region, or set AWS_REGION")


def test_no_credentials_says_how_to_provide_them(moto_endpoint: str, tmp_path: Path) -> None:
    result = run_cli(
        aws_environment(tmp_path, credentials=False), *show("t", moto_endpoint, "--region", REGION)
    )
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr.startswith(
        "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    )


@pytest.mark.parametrize(
    ("error_type", "said"),
    [
        ("UnrecognizedClientException", "AWS credentials rejected (UnrecognizedClientException"),
        ("AccessDeniedException", "access denied (AccessDeniedException"),
    ],
)
def test_rejected_credentials_and_denied_access_are_misconfigurations(
    tmp_path: Path, error_type: str, said: str
) -> None:
    with RejectingEndpoint(error_type, "no") as endpoint:
        result = run_cli(aws_environment(tmp_path), *show("orders", endpoint.url))
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr.startswith(said)
    assert f"for table 'orders' in region {REGION} at {endpoint.url}: check the credentials" in (
        result.stderr
    )


def test_throttling_is_an_outage_not_a_misconfiguration(
    dynamodb_table: str, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    fault_proxy.set("throttle")
    result = run_cli(aws_environment(tmp_path), *show(dynamodb_table, fault_proxy.url))
    assert result.returncode == EXIT_STORE
    assert result.stderr == (
        "store unavailable: throttled (ThrottlingException: Rate exceeded): retry later\n"
    )


def test_an_sqlite_file_that_cannot_be_opened_is_a_misconfiguration(tmp_path: Path) -> None:
    path = tmp_path / "no-such-directory" / "idem.sqlite3"
    result = run_cli(aws_environment(tmp_path), "create-table", "--sqlite", str(path))
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr == (
        f"cannot open database file '{path}' (unable to open database file): check that its "
        "directory exists and is writable\n"
    )


def test_an_sqlite_file_that_is_not_a_database_is_an_outage(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"not a database " * 512)
    result = run_cli(aws_environment(tmp_path), "show", "k", "--route", "/o", "--sqlite", str(path))
    assert result.returncode == EXIT_STORE
    assert result.stderr == (
        f"store unavailable: database '{path}' cannot be read or written "
        "(file is not a database): retry later\n"
    )


def test_an_invalid_key_prints_the_usage_of_its_subcommand(tmp_path: Path) -> None:
    path = str(tmp_path / "idem.sqlite3")
    result = run_cli(aws_environment(tmp_path), "show", '"open', "--route", "/o", "--sqlite", path)
    assert result.returncode == EXIT_USAGE
    assert result.stderr.startswith("usage: idempotency-middleware show [-h]")
    assert "idempotency-middleware show: error: invalid key:" in result.stderr


# --- an SQLite path that names no database ----------------------------------------------------


def leaf_commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command of the command line (``action show`` is one) with its parser."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield prefix, parser
        return
    for name, sub in subparsers[0].choices.items():
        yield from leaf_commands(sub, (*prefix, name))


# Each command that takes --sqlite, as it would be typed (the key or id and its options) but
# for the store option. Only create-table may create the database.
NOT_CREATING = {
    ("show",): ["show", "f-1", "--route", "/orders"],
    ("delete",): ["delete", "f-1", "--route", "/orders"],
    ("action", "show"): ["action", "show", "act-1"],
    ("action", "cancel"): ["action", "cancel", "act-1"],
}


def test_every_command_taking_an_sqlite_path_is_either_creating_or_checked_below() -> None:
    with_sqlite = {
        command
        for command, parser in leaf_commands(build_parser())
        if any("--sqlite" in action.option_strings for action in parser._actions)
    }
    assert with_sqlite == set(NOT_CREATING) | {("create-table",)}


@pytest.mark.parametrize("command", sorted(NOT_CREATING), ids=" ".join)
def test_a_command_that_does_not_create_refuses_a_missing_sqlite_file_and_creates_nothing(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    # The typo: a directory that does not exist, run from the project's directory.
    result = subprocess.run(
        [
            *(sys.executable, "-m", "idempotency_middleware"),
            *NOT_CREATING[command],
            *("--sqlite", "app2/idem.sqlite"),
        ],
        cwd=tmp_path,
        env=aws_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr == (
        "no SQLite database file at 'app2/idem.sqlite': check the path (a new database is "
        "made by `idempotency-middleware create-table --sqlite app2/idem.sqlite`)\n"
    )
    assert result.stdout == ""
    assert not (tmp_path / "app2").exists()


def test_a_missing_sqlite_file_in_an_existing_directory_is_not_created_either(
    tmp_path: Path,
) -> None:
    path = tmp_path / "typo.sqlite3"
    result = run_cli(aws_environment(tmp_path), "show", "k", "--route", "/o", "--sqlite", str(path))
    assert result.returncode == EXIT_MISCONFIGURED
    assert result.stderr.startswith(f"no SQLite database file at '{path}': check the path")
    assert not path.exists()


def test_create_table_creates_the_sqlite_file_which_show_then_reads(tmp_path: Path) -> None:
    path = tmp_path / "idem.sqlite3"
    environment = aws_environment(tmp_path)
    created = run_cli(environment, "create-table", "--sqlite", str(path))
    assert created.returncode == 0, created.stderr
    assert path.is_file()
    shown = run_cli(environment, "show", "k", "--route", "/o", "--sqlite", str(path))
    assert shown.returncode == EXIT_NOT_FOUND
    assert shown.stderr.startswith("no record for key hash ")
