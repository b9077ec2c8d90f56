"""``benchmarks/sqlite_peers.py`` in its ``--quick`` mode: the table prints ours next to
fastapi-idempotency-key's and fastidempotent's SQLite backends, each row with figures or the
reason it has none, and a contender that answers wrongly gets its row marked."""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
from pathlib import Path

import pytest

from benchmarks import sqlite_peers
from benchmarks._apps import order_app

PEERS = {"fastapi-idempotency-key": "fastapi_idempotency_key", "fastidempotent": "fastidempotent"}


def rows(report: str) -> dict[tuple[str, str], list[str]]:
    """The table's body rows by contender and case."""
    found: dict[tuple[str, str], list[str]] = {}
    for line in report.splitlines():
        if line.startswith("| ") and not line.startswith("| contender"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            found[cells[0], cells[2]] = cells
    return found


def test_the_quick_run_prints_ours_next_to_both_peers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite_peers.main(["--quick", "--dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "ours next to the peers' SQLite backends" in printed
    table = rows(printed)
    for case in sqlite_peers.CASES:
        ours = table["idempotency-middleware (ours)", case]
        assert float(ours[3]) > 0 and float(ours[4]) > 0, ours
        # New key: a claim and a completion at least; replay: a claim at least.
        assert float(ours[5]) >= (2 if case == sqlite_peers.NEW else 1), ours
        assert ours[-1] == ""
    for peer, module in PEERS.items():
        runnable = all(importlib.util.find_spec(name) for name in ("aiosqlite", module))
        for case in sqlite_peers.CASES:
            cells = table[peer, case]
            if runnable:
                assert float(cells[4]) > 0 and float(cells[5]) >= 1, cells
            else:
                assert cells[3:7] == ["n/a"] * 4 and cells[-1], cells  # and its row says why
    assert "CPU per request, ours / fastapi-idempotency-key: new key " in printed
    assert "(target <= 0.4x)" in printed and "(target <= 1.0x)" in printed


def test_a_peer_that_cannot_run_says_why_in_its_row() -> None:
    broken = sqlite_peers.Contender("peer", "1.0", "backend", None, "not installed")
    for case in sqlite_peers.CASES:
        cells = rows(sqlite_peers.report([broken], 1, 1, "here"))["peer", case]
        assert cells[3:7] == ["n/a"] * 4 and cells[-1] == "not installed"


def test_a_contender_that_replays_wrongly_gets_its_replay_row_marked(tmp_path: Path) -> None:
    async def no_idempotency(_path: str) -> sqlite_peers.Built:
        async def close() -> None:
            pass

        return sqlite_peers.Built(order_app(), close)  # runs the handler on every retry

    contender = sqlite_peers.Contender("bare", "1.0", "none", no_idempotency)
    asyncio.run(sqlite_peers._measure([contender], str(tmp_path), 1, 3))
    table = rows(sqlite_peers.report([contender], 1, 3, str(tmp_path)))
    assert float(table["bare", sqlite_peers.NEW][4]) > 0
    replay = table["bare", sqlite_peers.REPLAY]
    assert replay[3:7] == ["n/a"] * 4
    assert replay[-1] == "broken: a retry of a completed key ran the handler again"


def test_statements_are_counted_on_every_connection_opened_while_tracing() -> None:
    log: list[str] = []
    with sqlite_peers.traced_connections(log):
        connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    with connection:
        connection.execute("INSERT INTO t VALUES ('a')")
    connection.close()
    assert sqlite_peers.in_words(log) == "CREATE, BEGIN, INSERT, COMMIT"
    untraced = sqlite3.connect(":memory:")
    untraced.execute("SELECT 1")
    untraced.close()
    assert len(log) == 4
