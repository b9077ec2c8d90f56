"""``benchmarks/redis_peers.py`` in its quick mode against the session's Redis: both tables
are printed, ours with figures and exactly the round trips the store promises (2 for a new
key, 1 for a replay), each peer with figures or the reason it has none (not installed, or
what broke)."""

from __future__ import annotations

import importlib.metadata

import pytest

from benchmarks.redis_peers import main

PEERS = {
    "fastapi-idempotency-key, RedisBackend": "fastapi-idempotency-key",
    "fastidempotent, RedisBackend": "fastidempotent",
    "asgi-idempotency-header, RedisBackend": "asgi-idempotency-header",
    "Powertools idempotent_function, RedisCachePersistenceLayer": "aws-lambda-powertools",
    "Powertools idempotent_function in a sync FastAPI route, RedisCachePersistenceLayer": (
        "aws-lambda-powertools"
    ),
}


def rows(report: str) -> dict[tuple[str, str], list[str]]:
    """The tables' body rows by (contender, case)."""
    found: dict[tuple[str, str], list[str]] = {}
    for line in report.splitlines():
        if not line.startswith("| ") or line.startswith("| contender "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        found[(cells[0], cells[2])] = cells
    return found


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_the_quick_benchmark_prints_ours_next_to_each_peer(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--quick", "--redis-url", redis_url])
    report = capsys.readouterr().out
    assert "### HTTP: ASGI middlewares, and Powertools in a FastAPI route, on Redis" in report
    assert "### Functions: idempotent decorators on Redis" in report
    table = rows(report)
    for ours in ("idempotency-middleware (ours), RedisStore", "idempotent (ours), RedisStore"):
        new, replay = table[(ours, "new key")], table[(ours, "replay")]
        assert float(new[3]) > 0 and float(new[4]) > 0
        assert float(replay[3]) > 0
        assert (new[5], replay[5]) == ("2.0", "1.0")  # round trips per request
    for peer, distribution in PEERS.items():
        for case in ("new key", "replay"):
            cells = table[(peer, case)]
            if not installed(distribution):
                assert "not installed" in cells[3]
            else:
                # A figure, or what the peer got wrong (never an empty cell).
                assert cells[3].replace(".", "", 1).isdigit() or cells[3].startswith(
                    ("broken", "failed")
                ), cells
    # Powertools runs here (the bench extra pins it): its HTTP row is measured, with the
    # round trips its layer makes (SET NX and SET for a new key).
    if installed("aws-lambda-powertools"):
        route = "Powertools idempotent_function in a sync FastAPI route, RedisCachePersistenceLayer"
        new = table[(route, "new key")]
        assert float(new[4]) > 0 and new[5] == "2.0", new
