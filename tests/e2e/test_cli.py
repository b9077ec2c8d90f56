"""The operator command line, against moto's DynamoDB server."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import idempotency_middleware
from idempotency_middleware import DynamoDBStore
from idempotency_middleware.cli.main import (
    EXIT_MISCONFIGURED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STORE,
    EXIT_USAGE,
    main,
)
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.protocol import ClaimRequest, Completion
from idempotency_middleware.stores.records import StoredResponse
from tests.conftest import REGION
from tests.support.ports import free_port


def _store_args(moto_endpoint: str, table: str) -> list[str]:
    return ["--table", table, "--endpoint-url", moto_endpoint, "--region", REGION]


def _completed(moto_endpoint: str, table: str, key: str, route: str, scope: str | None) -> None:
    hashed = storage_key("POST", route, scope, key)
    with DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        store.claim(ClaimRequest(hashed, "fp", "owner", time.time(), lock_timeout_seconds=30))
        response = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 7}')
        store.complete(Completion(hashed, "owner", time.time(), 60, response))


def test_create_table_makes_a_table_with_ttl_and_says_so(
    moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"cli-{uuid.uuid4().hex[:8]}"
    assert main(["create-table", *_store_args(moto_endpoint, table)]) == EXIT_OK
    assert f"table {table} ready" in capsys.readouterr().out
    import boto3

    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    ttl = client.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED"
    assert ttl["AttributeName"] == "ttl"
    # Safe to repeat.
    assert main(["create-table", *_store_args(moto_endpoint, table)]) == EXIT_OK


def test_show_prints_the_decoded_record_of_a_key(
    moto_endpoint: str, dynamodb_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _completed(moto_endpoint, dynamodb_table, "order-1", "/orders", None)
    code = main(
        ["show", '"order-1"', "--route", "/orders", *_store_args(moto_endpoint, dynamodb_table)]
    )
    assert code == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["status"] == "completed"
    assert shown["response"]["status"] == 201
    assert shown["response"]["body"] == '{"id": 7}'
    assert shown["key_hash"] == storage_key("POST", "/orders", None, "order-1")


def test_show_prints_deadlines_in_iso_8601_utc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from idempotency_middleware import SQLiteStore

    path = str(tmp_path / "idem.sqlite3")
    hashed = storage_key("POST", "/orders", None, "k")
    claimed_at, completed_at = 1_700_000_000.25, 1_700_000_001.5
    with SQLiteStore(path) as store:
        store.claim(ClaimRequest(hashed, "fp", "owner", claimed_at, lock_timeout_seconds=30))
        response = StoredResponse(201, [], b"{}")
        store.complete(Completion(hashed, "owner", completed_at, 60, response))
    assert main(["show", "k", "--route", "/orders", "--sqlite", path]) == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["lock_expires_at"] == "2023-11-14T22:13:50.250Z"  # claimed_at + 30
    assert shown["expires_at"] == "2023-11-14T22:14:21.500Z"  # completed_at + 60


def test_show_honours_the_scope(
    moto_endpoint: str, dynamodb_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _completed(moto_endpoint, dynamodb_table, "k", "/orders", "tenant-a")
    args = ["show", "k", "--route", "/orders", *_store_args(moto_endpoint, dynamodb_table)]
    assert main(args) == EXIT_NOT_FOUND
    assert main([*args, "--scope", "tenant-a"]) == EXIT_OK


def test_delete_removes_the_record_so_the_key_can_run_again(
    moto_endpoint: str, dynamodb_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _completed(moto_endpoint, dynamodb_table, "k", "/orders", None)
    args = ["--route", "/orders", *_store_args(moto_endpoint, dynamodb_table)]
    assert main(["delete", "k", *args]) == EXIT_OK
    assert "deleted record" in capsys.readouterr().out
    assert main(["show", "k", *args]) == EXIT_NOT_FOUND


def test_an_invalid_key_is_a_usage_error(moto_endpoint: str, dynamodb_table: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["show", '"unterminated', "--route", "/o", *_store_args(moto_endpoint, dynamodb_table)]
        )
    assert exit_info.value.code == EXIT_USAGE


def test_a_missing_store_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["show", "k", "--route", "/orders"])
    assert exit_info.value.code == EXIT_USAGE


def test_an_unreachable_store_exits_3_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    args = ["show", "k", "--route", "/o", "--table", "t", "--region", REGION]
    assert main([*args, "--endpoint-url", endpoint]) == EXIT_STORE
    assert capsys.readouterr().err == (
        f"store unreachable: cannot connect to {endpoint}/: check --endpoint-url and the network\n"
    )


def test_a_missing_table_exits_4_saying_how_to_create_it(
    moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"missing-{uuid.uuid4().hex[:8]}"
    code = main(["show", "k", "--route", "/o", *_store_args(moto_endpoint, table)])
    assert code == EXIT_MISCONFIGURED
    assert capsys.readouterr().err == (
        f"table '{table}' does not exist in region {REGION} at {moto_endpoint}: create it with "
        f"`idempotency-middleware create-table --table {table} --region {REGION} "
        f"--endpoint-url {moto_endpoint}`\n"
    )


def test_the_version_is_the_package_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"idempotency-middleware {idempotency_middleware.__version__}\n"


def test_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ([], ["show"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == EXIT_OK
        shown = capsys.readouterr().out
        assert "exit codes:" in shown
        assert "  3  store unreachable or failing" in shown
        assert "  4  store misconfigured" in shown


def test_a_usage_error_after_parsing_prints_the_subcommand_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["delete", "k", "--route", "/orders"])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: idempotency-middleware delete ")
    assert err.endswith(
        "idempotency-middleware delete: error: give --table NAME (DynamoDB), --sqlite PATH, "
        "--redis URL or --postgres DSN\n"
    )


def test_python_dash_m_runs_the_cli_with_help_on_each_command() -> None:
    for command in ([], ["create-table"], ["show"], ["delete"], ["demo"]):
        result = subprocess.run(
            [sys.executable, "-m", "idempotency_middleware", *command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "usage: idempotency-middleware" in result.stdout


def test_show_and_delete_work_on_an_sqlite_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from idempotency_middleware import SQLiteStore

    path = str(tmp_path / "idem.sqlite3")
    hashed = storage_key("POST", "/orders", None, "k")
    with SQLiteStore(path) as store:
        store.claim(ClaimRequest(hashed, "fp", "owner", time.time(), lock_timeout_seconds=30))
    args = ["k", "--route", "/orders", "--sqlite", path]
    assert main(["show", *args]) == EXIT_OK
    assert orjson.loads(capsys.readouterr().out)["status"] == "in_progress"
    assert main(["delete", *args]) == EXIT_OK
    assert main(["show", *args]) == EXIT_NOT_FOUND


def test_show_takes_a_quoted_key_with_spaces_and_tells_a_bare_one_to_quote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from idempotency_middleware import SQLiteStore

    path = str(tmp_path / "idem.sqlite3")
    hashed = storage_key("POST", "/orders", None, "abc def")
    with SQLiteStore(path) as store:
        store.claim(ClaimRequest(hashed, "fp", "owner", time.time(), lock_timeout_seconds=30))

    assert main(["show", '"abc def"', "--route", "/orders", "--sqlite", path]) == EXIT_OK
    assert orjson.loads(capsys.readouterr().out)["key_hash"] == hashed
    with pytest.raises(SystemExit) as exit_info:
        main(["show", "abc def", "--route", "/orders", "--sqlite", path])
    assert exit_info.value.code == EXIT_USAGE
    assert "invalid key: The idempotency key has a space" in capsys.readouterr().err


def test_show_prints_the_content_length_the_handler_sent_where_it_sent_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the command line page says: Content-Length is stored where the handler put it
    # (header order is kept), and a replay sends the body's length in its place.
    from idempotency_middleware import IdempotencyWSGIMiddleware, SQLiteStore
    from tests.support.servers import serve_wsgi

    def app(environ: object, start_response: Any) -> list[bytes]:
        start_response("201 Created", [("X-First", "1"), ("Content-Length", "2"), ("X-Last", "")])
        return [b"ok"]

    path = str(tmp_path / "idem.sqlite3")
    with SQLiteStore(path) as store:
        middleware = IdempotencyWSGIMiddleware(app, store=store)
        with contextlib.closing(middleware), serve_wsgi(middleware) as url:
            for _ in range(2):
                replay = httpx.post(f"{url}/orders", headers={"Idempotency-Key": "k-1"})
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.headers["content-length"] == "2"

    assert main(["show", "k-1", "--route", "/orders", "--sqlite", path]) == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)["response"]["headers"]
    assert [name.lower() for name, _ in shown] == ["x-first", "content-length", "x-last"]
    assert shown[1][1] == "2"
