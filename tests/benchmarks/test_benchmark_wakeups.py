"""``benchmarks/wakeups.py`` in its quick mode against the session's servers: its table has
a pushed and a polled row per store, with figures, and the pushed waiters answered first."""

from __future__ import annotations

from benchmarks.wakeups import run


def test_the_wakeup_table_has_pushed_and_polled_rows_per_store(
    redis_url: str, postgres_dsn: str
) -> None:
    report = run(rounds=1, samples=3, redis_url=redis_url, dsn=postgres_dsn)
    rows = {
        (cells[0], cells[1]): cells
        for line in report.splitlines()
        if line.startswith("| ") and not line.startswith("| store ")
        for cells in [[cell.strip() for cell in line.strip().strip("|").split("|")]]
    }
    assert set(rows) == {
        (store, mode) for store in ("Redis", "PostgreSQL") for mode in ("pushed", "polled")
    }
    for store in ("Redis", "PostgreSQL"):
        pushed, polled = float(rows[(store, "pushed")][2]), float(rows[(store, "polled")][2])
        assert rows[(store, "pushed")][4] == "3"
        # (Medians of 3.) A poll comes 100 ms or more after the last; the news, a few ms.
        assert pushed < polled, (store, pushed, polled)
