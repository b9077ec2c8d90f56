"""``benchmarks/functions.py`` (ours vs Powertools' ``idempotent_function``) at a tiny scale
on DynamoDB Local: the table has every row, and the timed calls did what each row claims
(a new key ran the body once and returned its output; a replay returned the stored result
without running it). Run by ``scripts/dynamodb-local.sh -k benchmark_functions`` (or with
the other DynamoDB Local cases); skipped in a normal run, which checks the command line only.
"""

from __future__ import annotations

import pytest

from benchmarks.functions import (
    ASYNC,
    HOW_TO_RUN,
    MODES,
    NEW,
    NO_ASYNC,
    OURS,
    POWERTOOLS,
    REPLAY,
    ROWS,
    SYNC,
    FunctionsResult,
    main,
    resolve_endpoint,
    run,
)

ROUNDS = 2
CALLS = 3  # per contender, case and round: a few seconds in all


def table_rows(report: str) -> dict[tuple[str, str], list[str]]:
    """The printed table's body rows by (call, "ours" or "Powertools")."""
    rows: dict[tuple[str, str], list[str]] = {}
    for line in report.splitlines():
        if not line.startswith("| ") or line.startswith("| call "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[(cells[0], cells[1].split(" ", 1)[0])] = cells
    return rows


def check_ours(result: FunctionsResult) -> None:
    for mode in MODES:
        new = result.get(NEW, mode, OURS)
        replay = result.get(REPLAY, mode, OURS)
        assert new is not None and replay is not None
        assert (new.calls, new.runs, new.right) == (ROUNDS * CALLS,) * 3, (mode, new)
        assert (replay.calls, replay.runs, replay.right) == (ROUNDS * CALLS, 0, ROUNDS * CALLS)
        assert len(new.wall) == len(new.cpu) == ROUNDS
        assert all(seconds > 0 for seconds in new.wall + replay.wall)
        # Each call reached DynamoDB Local: a claim at least, and a replay no more than a
        # new key (it has nothing to complete).
        assert replay.requests_per_call() >= 1, replay.requests
        assert new.requests_per_call() >= replay.requests_per_call(), (new, replay)


@pytest.mark.parametrize(
    "with_powertools", [True, False], ids=["dynamodb-local", "dynamodb-local-no-powertools"]
)
def test_the_table_has_every_row_and_the_calls_did_what_it_says(
    with_powertools: bool, dynamodb_local_endpoint: str
) -> None:
    result = run(
        dynamodb_local_endpoint,
        rounds=ROUNDS,
        calls=CALLS,
        warmup_rounds=0,
        with_powertools=with_powertools,
    )
    report = result.report()
    print(report)  # the figures, with pytest -s
    rows = table_rows(report)
    assert sorted(rows) == sorted(
        (f"{case}, {mode}", "ours" if who == OURS else "Powertools") for case, mode, who in ROWS
    )
    check_ours(result)
    for case in (NEW, REPLAY):
        async_row = rows[(f"{case}, {ASYNC}", "Powertools")]
        assert result.get(case, ASYNC, POWERTOOLS) is None
        assert async_row[2:4] == [NO_ASYNC, NO_ASYNC]

    if not with_powertools or result.powertools_error:
        # Powertools left out or not importable: its rows say why, ours are all there.
        assert result.powertools_error
        assert f"Powertools' rows are missing: {result.powertools_error}" in report
        for case in (NEW, REPLAY):
            assert result.get(case, SYNC, POWERTOOLS) is None
            assert rows[(f"{case}, {SYNC}", "Powertools")][2] == f"n/a ({result.powertools_error})"
        return

    new = result.get(NEW, SYNC, POWERTOOLS)
    replay = result.get(REPLAY, SYNC, POWERTOOLS)
    assert new is not None and replay is not None
    assert (new.calls, new.runs, new.right) == (ROUNDS * CALLS,) * 3
    assert (replay.calls, replay.runs, replay.right) == (ROUNDS * CALLS, 0, ROUNDS * CALLS)
    # Powertools claims with a conditional PutItem and completes with an UpdateItem; a
    # replay's PutItem fails and returns the record (ReturnValuesOnConditionCheckFailure).
    assert new.requests == {"PutItem": 3, "UpdateItem": 3}
    assert replay.requests == {"PutItem": 3}
    ratio = rows[(f"{NEW}, {SYNC}", "Powertools")][4]
    assert ratio.endswith("x") and ", " in ratio


def test_without_an_endpoint_it_says_how_to_run_it_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("IDEMPOTENCY_DYNAMODB_LOCAL_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert HOW_TO_RUN in capsys.readouterr().err


@pytest.mark.parametrize(
    "endpoint", ["https://dynamodb.us-east-1.amazonaws.com", "http://10.0.0.5:8000"]
)
def test_it_refuses_an_endpoint_off_loopback(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IDEMPOTENCY_DYNAMODB_LOCAL_URL", endpoint)
    with pytest.raises(SystemExit) as exited:
        resolve_endpoint(None)
    assert exited.value.code == 2
    assert "refusing" in capsys.readouterr().err
    # An explicit --endpoint-url is held to the same rule, and wins over the variable.
    assert resolve_endpoint("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    with pytest.raises(SystemExit):
        resolve_endpoint(endpoint)
