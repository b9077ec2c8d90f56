"""``idempotency-middleware action show ID`` and ``action cancel ID``, on SQLite and on
moto's DynamoDB server: output, exit codes, and what they change."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from idempotency_middleware import DynamoDBStore, OneTimeActions, SQLiteStore
from idempotency_middleware.cli.main import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STORE,
    EXIT_USAGE,
    main,
)
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION, new_table
from tests.support.db_stores import location, new_store
from tests.support.ports import free_port
from tests.support.servers import REPO_ROOT


class Backend:
    """Where the command line looks (its store options), and actions made there."""

    def __init__(self, options: list[str], store: Any) -> None:
        self.options = options
        self.store = store

    def actions(self, clock: FakeClock | None = None) -> OneTimeActions:
        if clock is not None:
            self.store.clock = clock  # an action made in the past, to be expired by now
        return OneTimeActions(self.store)


@pytest.fixture(params=["sqlite", "dynamodb", "redis", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param in ("redis", "postgres"):
        where = location(request, request.param)
        with new_store(request.param, where) as db_store:
            if request.param == "redis":
                yield Backend(["--redis", where, "--prefix", db_store.prefix], db_store)
            else:
                yield Backend(["--postgres", where, "--table", db_store.table], db_store)
        return
    if request.param == "sqlite":
        path = tmp_path / "cli.sqlite3"
        with SQLiteStore(path) as store:
            # The file exists, as a deployed store's does (the command line refuses a path
            # that names no file rather than creating an empty database).
            store.create_table()
            yield Backend(["--sqlite", str(path)], store)
        return
    endpoint: str = request.getfixturevalue("moto_endpoint")
    table = new_table(endpoint, "cli-actions")
    with DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION) as store:
        yield Backend(["--table", table, "--endpoint-url", endpoint, "--region", REGION], store)


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, Any, str]:
    code = main(list(arguments))
    captured = capsys.readouterr()
    return code, orjson.loads(captured.out) if captured.out else None, captured.err


def test_show_prints_the_action_as_json(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    action = backend.actions().create(expires_in=600, pin="1234", data={"user": 7})
    code, shown, _ = run(capsys, "action", "show", action.action_id, *backend.options)
    assert code == EXIT_OK
    assert shown == action.to_dict()
    assert shown["state"] == "active" and shown["pin_attempts_left"] == 5
    assert "1234" not in orjson.dumps(shown).decode()


def test_show_of_an_unknown_action_exits_not_found(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    code, shown, error = run(capsys, "action", "show", "nope", *backend.options)
    assert (code, shown) == (EXIT_NOT_FOUND, None)
    assert "no such action" in error


def test_cancel_cancels_and_prints_the_canceled_action(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    actions = backend.actions()
    action = actions.create(expires_in=600)
    code, shown, _ = run(capsys, "action", "cancel", action.action_id, *backend.options)
    assert code == EXIT_OK
    assert shown["state"] == "canceled" and shown["canceled_at"] is not None
    after = actions.get(action.action_id)
    assert after is not None and after.to_dict() == shown
    # Again: nothing to do, the same answer.
    assert run(capsys, "action", "cancel", action.action_id, *backend.options)[:2] == (
        EXIT_OK,
        shown,
    )


def test_cancel_of_a_consumed_or_expired_action_is_refused(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    consumed = backend.actions().create(expires_in=600)
    backend.actions().consume(consumed.action_id)
    code, shown, error = run(capsys, "action", "cancel", consumed.action_id, *backend.options)
    assert (code, shown) == (EXIT_REFUSED, None)
    assert "already consumed" in error
    expired = backend.actions(FakeClock(start=time.time() - 120)).create(expires_in=60)
    code, shown, error = run(capsys, "action", "cancel", expired.action_id, *backend.options)
    assert (code, shown) == (EXIT_REFUSED, None)
    assert "expired" in error


def test_cancel_of_an_unknown_action_exits_not_found(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, error = run(capsys, "action", "cancel", f"nope-{uuid.uuid4().hex}", *backend.options)
    assert code == EXIT_NOT_FOUND and "no such action" in error


def test_an_action_command_without_a_store_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["action", "show", "some-id"])
    assert exited.value.code == EXIT_USAGE
    assert "give --table NAME (DynamoDB), --sqlite PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["action"])
    assert exited.value.code == EXIT_USAGE


def test_an_unreachable_store_exits_with_the_store_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = ["--table", "t", "--endpoint-url", endpoint, "--region", REGION]
    code, _, error = run(capsys, "action", "cancel", "some-id", *options)
    assert code == EXIT_STORE and "unreachable" in error


def test_help_lists_the_action_commands_and_the_refused_exit_code() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", "action", "cancel", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "action_id" in shown and "--sqlite PATH" in shown
    assert "5  the action cannot be canceled" in shown


def test_an_id_that_starts_with_a_dash_goes_after_a_double_dash(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    action = backend.actions().create(expires_in=600, action_id=f"-{uuid.uuid4().hex}")
    code, shown, _ = run(capsys, "action", "show", *backend.options, "--", action.action_id)
    assert code == EXIT_OK and shown["action_id"] == action.action_id
