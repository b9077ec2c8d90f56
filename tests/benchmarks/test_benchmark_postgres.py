"""``benchmarks/postgres_peers.py`` in its ``--quick`` mode on the session's PostgreSQL: the
table prints a row for ours and one for fastidempotent, each with figures or the reason it
has none, and the round trips it counts on the wire are the store's real ones."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import postgres_peers


def rows(report: str) -> dict[str, list[str]]:
    """The table's body rows by contender."""
    found: dict[str, list[str]] = {}
    for line in report.splitlines():
        if line.startswith("| ") and not line.startswith("| contender"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            found[cells[0]] = cells
    return found


def test_the_quick_run_prints_ours_next_to_fastidempotent(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    postgres_peers.main(["--quick", "--dsn", postgres_dsn])
    printed = capsys.readouterr().out
    assert "ours next to fastidempotent" in printed
    table = rows(printed)
    ours = table["idempotency-middleware (ours)"]
    # New key: the claim and the completion; replay: the claim alone (one statement each).
    assert ours[5] == "2.00" and ours[8] == "1.00"
    assert all(float(cell) > 0 for cell in (ours[3], ours[4], ours[6], ours[7]))
    peer = table["fastidempotent"]
    if importlib.util.find_spec("asyncpg") is None:
        assert peer[3] == "n/a"  # and its row says why
    else:
        # Its get, lock (delete, insert, commit) and set, each its own transaction.
        assert float(peer[5]) > float(ours[5]) and float(peer[8]) >= 1.0


def test_a_peer_that_cannot_run_says_why_in_its_row() -> None:
    broken = postgres_peers.Contender("peer", "1.0", "backend", None, "not installed")
    report = postgres_peers._report([broken], 1, 1)
    assert rows(report)["peer"][3:] == ["n/a"] * 5 + ["not installed"]
