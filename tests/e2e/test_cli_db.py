"""The operator command line on Redis and PostgreSQL stores (real servers)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
import uuid

import orjson
import pytest

from idempotency_middleware.cli.main import (
    EXIT_MISCONFIGURED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STORE,
    main,
)
from idempotency_middleware.policy.keys import storage_key
from idempotency_middleware.stores.protocol import ClaimRequest, Completion
from idempotency_middleware.stores.records import StoredResponse
from tests.support.db_stores import location, new_store
from tests.support.ports import free_port
from tests.support.store_kinds import DB_SERVERS


def shown_dsn(dsn: str) -> str:
    """``dsn`` as a hint prints it: in key=value form, without the password."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(dsn)
    return make_conninfo("", **{name: value for name, value in parts.items() if name != "password"})


def store_options(kind: str, where: str, store: object) -> list[str]:
    """The command line's options naming ``store`` on the server at ``where``."""
    if kind == "redis":
        return ["--redis", where, "--prefix", store.prefix]  # type: ignore[attr-defined]
    return ["--postgres", where, "--table", store.table]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", DB_SERVERS)
def test_show_prints_a_completed_record_and_delete_removes_it(
    request: pytest.FixtureRequest, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    where = location(request, kind)
    hashed = storage_key("POST", "/orders", None, "k-1")
    with new_store(kind, where) as store:
        now = time.time()
        store.claim(ClaimRequest(hashed, "fp", "owner-1", now, lock_timeout_seconds=30))
        response = StoredResponse(201, [(b"content-type", b"application/json")], b'{"id": 7}')
        assert store.complete(Completion(hashed, "owner-1", now, 60, response))
        args = ["k-1", "--route", "/orders", *store_options(kind, where, store)]

        assert main(["show", *args]) == EXIT_OK
        shown = orjson.loads(capsys.readouterr().out)
        assert shown["status"] == "completed"
        assert shown["response"]["status"] == 201

        assert main(["delete", *args]) == EXIT_OK
        assert "deleted record" in capsys.readouterr().out
        assert store.get(hashed) is None
        assert main(["show", *args]) == EXIT_NOT_FOUND


def test_create_table_makes_the_postgres_table_and_a_missing_one_names_the_command(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = location(request, "postgres")
    table = f"cli_{uuid.uuid4().hex[:10]}"
    options = ["--postgres", dsn, "--table", table]

    assert main(["show", "k", "--route", "/orders", *options]) == EXIT_MISCONFIGURED
    error = capsys.readouterr().err
    [command] = re.findall(r"`(idempotency-middleware create-table [^`]*)`", error)
    assert shlex.split(command)[2:] == ["--postgres", shown_dsn(dsn), "--table", table]

    assert main(["create-table", *options]) == EXIT_OK
    assert f"table={table!r}" in capsys.readouterr().out
    assert main(["create-table", *options]) == EXIT_OK  # safe to repeat
    capsys.readouterr()
    assert main(["show", "k", "--route", "/orders", *options]) == EXIT_NOT_FOUND


@pytest.mark.parametrize(
    "option",
    [
        ["--redis", "redis://127.0.0.1:{port}/0"],
        ["--postgres", "postgresql://postgres@127.0.0.1:{port}/postgres"],
    ],
)
def test_an_unreachable_server_exits_3_saying_so(
    option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    target = option[1].format(port=free_port())

    code = main(["show", "k", "--route", "/orders", option[0], target])

    assert code == EXIT_STORE
    error = capsys.readouterr().err
    assert "Connection refused" in error
    assert f"check {option[0]} and the network" in error


@pytest.mark.parametrize("command", [["create-table"], ["show", "k", "--route", "/orders"]])
def test_an_unreachable_postgres_prints_only_the_command_line_s_own_message(
    command: list[str],
) -> None:
    # The real command: psycopg_pool's own log line ("error connecting in ...") went to
    # stderr through logging's last-resort handler, ahead of the message that says what to do.
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    result = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", *command, "--postgres", dsn],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_STORE
    assert result.stderr.startswith("store cannot reach PostgreSQL at 127.0.0.1:"), result.stderr
    assert result.stderr.endswith(": check --postgres and the network\n")
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--redis", "localhost:6379", "redis://"),
        ("--postgres", "host=a port", "postgresql://user@host:5432/dbname"),
        ("--postgres", "postgresql://u@h:notaport/db", "port must be a number"),
    ],
)
def test_a_malformed_url_or_dsn_is_a_usage_error_saying_what_is_expected(
    option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["show", "k", "--route", "/orders", option, value])

    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert says in error
    assert "Traceback" not in error
