"""The command line on function and consumer keys (``--function NAME``, ``--consumer
NAME``), on SQLite files written by real ``idempotent`` functions and consumers: ``show``
(a function's result decoded, a consumer's verdict), ``delete``, and ``delete --keys-from``
for a dead-letter redrive."""

from __future__ import annotations

import io
import shlex
from pathlib import Path
from typing import Any

import orjson
import pytest

from idempotency_middleware import IdempotentConsumer, SQLiteStore, idempotent
from idempotency_middleware.cli.main import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, main
from idempotency_middleware.engine.cache import ENTRY_SECONDS
from idempotency_middleware.testing import FakeClock


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "functions.sqlite3"


def run_charge(path: Path, key: str) -> list[str]:
    """Runs ``charge`` (named ``billing.charge``) with ``key``; the keys it ran."""
    runs: list[str] = []
    with SQLiteStore(path) as store:

        @idempotent(store=store, key="order", name="billing.charge")
        def charge(order: str) -> str:
            runs.append(order)
            return f"charged {order}"

        charge(key)
    return runs


def test_show_function_prints_the_record_of_a_functions_key(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_charge(path, "o-1")

    assert main(["show", "o-1", "--function", "billing.charge", "--sqlite", str(path)]) == EXIT_OK

    shown = orjson.loads(capsys.readouterr().out)
    assert shown["function"] == "billing.charge"
    assert shown["key"] == "o-1"
    assert shown["status"] == "completed"
    assert shown["result"] == "charged o-1"
    assert "response" not in shown  # (no HTTP status, headers and body: it is a result)


def test_show_function_prints_a_structured_result_as_json(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SQLiteStore(path) as store:

        @idempotent(store=store, key="order", name="billing.quote")
        def quote(order: str) -> dict[str, Any]:
            return {"order": order, "amount": 12, "lines": [1, 2]}

        quote("o-1")

    assert main(["show", "o-1", "--function", "billing.quote", "--sqlite", str(path)]) == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["result"] == {"order": "o-1", "amount": 12, "lines": [1, 2]}


def test_show_function_prints_a_serializers_bytes_as_hex_without_loading_them(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SQLiteStore(path) as store:

        @idempotent(
            store=store,
            key="order",
            name="billing.raw",
            serializer=(lambda value: b"\x80raw", lambda data: "never loaded here"),
        )
        def raw(order: str) -> str:
            return "never loaded here"

        raw("o-1")

    assert main(["show", "o-1", "--function", "billing.raw", "--sqlite", str(path)]) == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["result_hex"] == b"\x80raw".hex()
    assert "result" not in shown


def consume_once(path: Path, message: dict[str, Any]) -> str:
    """Process ``message`` with the ``orders.ship`` consumer; its verdict."""
    with SQLiteStore(path) as store:
        consumer = IdempotentConsumer(
            lambda message: {"shipped": message["id"]},
            store=store,
            key=lambda message: message["id"],
            name="orders.ship",
        )
        return consumer.process(message).action


def test_show_consumer_prints_the_verdict_a_redelivery_gets(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert consume_once(path, {"id": "m-1"}) == "ack"

    assert main(["show", "m-1", "--consumer", "orders.ship", "--sqlite", str(path)]) == EXIT_OK

    shown = orjson.loads(capsys.readouterr().out)
    assert shown["consumer"] == "orders.ship"
    assert shown["verdict"] == "ack"
    assert shown["verdict_means"].startswith("a redelivery is acknowledged with the stored result")
    assert shown["result"] == {"shipped": "m-1"}
    assert "function" not in shown


def test_show_consumer_of_a_delivery_in_progress_says_retry(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SQLiteStore(path) as store:
        seen: list[int] = []

        def handle(message: dict[str, Any]) -> str:
            # The first delivery still running: what the operator sees meanwhile.
            seen.append(main(["show", "m-1", "--consumer", "orders.ship", "--sqlite", str(path)]))
            return "shipped"

        consumer = IdempotentConsumer(
            handle, store=store, key=lambda message: message["id"], name="orders.ship"
        )
        assert consumer.process({"id": "m-1"}).action == "ack"

    assert seen == [EXIT_OK]
    shown = orjson.loads(capsys.readouterr().out)
    assert (shown["status"], shown["verdict"]) == ("in_progress", "retry")
    assert "result" not in shown


def test_show_function_of_an_unknown_key_exits_1(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_charge(path, "o-1")
    code = main(["show", "o-2", "--function", "billing.charge", "--sqlite", str(path)])
    assert code == EXIT_NOT_FOUND
    assert "no record for key 'o-2' of billing.charge" in capsys.readouterr().err


def test_delete_function_lets_the_key_run_again(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_charge(path, "o-1")

    assert main(["delete", "o-1", "--function", "billing.charge", "--sqlite", str(path)]) == 0

    assert "deleted record" in capsys.readouterr().out
    assert run_charge(path, "o-1") == ["o-1"]
    assert main(["delete", "o-9", "--function", "billing.charge", "--sqlite", str(path)]) == 1


def test_a_running_processs_replay_cache_sees_a_delete_within_its_entry_lifetime(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line cannot reach a running process's replay cache: a key it deletes
    replays there until the cached entry is ``ENTRY_SECONDS`` old, then runs again."""
    runs: list[str] = []
    clock = FakeClock()
    with SQLiteStore(path) as store:

        @idempotent(
            store=store, key="order", name="billing.charge", replay_cache_size=8, clock=clock
        )
        def charge(order: str) -> str:
            runs.append(order)
            return f"charged {order}"

        charge("o-1")
        charge("o-1")  # a replay: the record is now in the cache
        assert main(["delete", "o-1", "--function", "billing.charge", "--sqlite", str(path)]) == 0
        assert "deleted record" in capsys.readouterr().out

        clock.advance(ENTRY_SECONDS - 1)
        assert charge("o-1") == "charged o-1"
        assert runs == ["o-1"]  # still replayed from the cache
        clock.advance(1)
        assert charge("o-1") == "charged o-1"
        assert runs == ["o-1", "o-1"]  # the store was asked again: the delete is seen


def test_delete_keys_from_a_file_redrives_a_consumers_dead_letters(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs: list[str] = []
    dead: list[str] = []

    def handle(message: dict[str, Any]) -> str:
        runs.append(message["id"])
        return "done"

    def consume(message: dict[str, Any]) -> str:
        with SQLiteStore(path) as store:
            consumer = IdempotentConsumer(
                handle,
                store=store,
                key=lambda message: message["id"],
                name="orders",
                on_exhausted=lambda message, error: dead.append(message["id"]),
            )
            return consumer.process(message).action

    for key in ("m-1", "m-2", "m-3"):
        assert consume({"id": key}) == "ack"
    keys = tmp_path / "dead-letters.txt"
    keys.write_text("m-1\nm-3\n\nm-never-seen\n")

    code = main(["delete", "--function", "orders", "--keys-from", str(keys), "--sqlite", str(path)])

    assert code == EXIT_OK
    assert capsys.readouterr().out.strip() == "deleted 2 of 3 keys of orders"
    for key in ("m-1", "m-2", "m-3"):
        consume({"id": key})
    assert runs == ["m-1", "m-2", "m-3", "m-1", "m-3"]


def test_keys_from_standard_input(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_charge(path, "o-1")
    run_charge(path, "o-2")
    monkeypatch.setattr("sys.stdin", io.StringIO("o-1\r\no-2\r\n"))

    code = main(
        ["delete", "--function", "billing.charge", "--keys-from", "-", "--sqlite", str(path)]
    )

    assert code == EXIT_OK
    assert "deleted 2 of 2 keys" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["show", "o-1"], "give --route"),
        (["delete", "--keys-from", "-"], "--keys-from needs --function"),
        (["delete", "o-1", "--function", "f", "--keys-from", "-"], "not both"),
        (["show", "--function", "f"], "give the KEY"),
        (["show", "o-1", "--function", "f", "--route", "/orders"], "drop --route"),
        (["show", "o-1", "--function", "f", "--consumer", "f"], "not both"),
        (["delete", "--function", "f", "--keys-from", "/nonexistent/keys"], "cannot read"),
    ],
    ids=[
        "no-route",
        "keys-from-alone",
        "key-and-file",
        "no-key",
        "route-too",
        "function-and-consumer",
        "no-file",
    ],
)
def test_options_that_address_no_key_are_usage_errors(
    path: Path, arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["create-table", "--sqlite", str(path)]) == 0  # (it refuses a missing file)
    with pytest.raises(SystemExit) as exited:
        main([*arguments, "--sqlite", str(path)])
    assert exited.value.code == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_the_redrive_commands_of_the_consumers_page_do_what_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's commands on a store like its story's (tests/e2e/test_sqs_dead_letters.py
    runs them after real dead letters): payment-3 completed, payment-2 released."""
    snippet = Path(__file__).resolve().parents[2] / "docs/snippets/consumers-redrive.txt"
    lines = snippet.read_text().splitlines()
    commands = [line[2:] for line in lines if line.startswith("$ idempotency-middleware ")]
    monkeypatch.chdir(tmp_path)
    with SQLiteStore(tmp_path / "payments.sqlite3") as store:
        consumer = IdempotentConsumer(
            lambda message: 1, store=store, key=lambda m: m["key"], name="payments.record"
        )
        assert consumer.process({"key": "payment-3"}).action == "ack"
    (tmp_path / "dead-letter-keys.txt").write_text("payment-2\npayment-3\n")

    show, delete = (shlex.split(command)[1:] for command in commands)
    assert main(show) == EXIT_OK
    printed = capsys.readouterr().out
    shown_lines = snippet.read_text().splitlines()[1:5]
    assert printed.splitlines()[:4] == shown_lines
    assert orjson.loads(printed)["status"] == "completed"
    assert main(delete) == EXIT_OK
    printed = capsys.readouterr().out.strip()
    assert printed == lines[lines.index(f"$ {commands[1]}") + 1]
