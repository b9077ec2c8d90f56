"""A small ``make bench-failover``: Redis with two replicas 300 ms behind (a crash of the
primary loses what they had not received; the run checks at the crash that Sentinel kept them
behind) and three Sentinels, two uvicorn workers and a consumer process, two retrying senders
per key, the primary SIGKILLed halfway. With ``replicas=1`` no key runs twice, counted from the
handlers' own ledger, and both senders of every key get the same answer. The same on a Redis
Cluster (three primaries, two replicas each), one primary SIGKILLed."""

from __future__ import annotations

import pytest

from benchmarks.failover import measure
from tests.support.session_servers import ServerUnavailable, require_or_skip

pytestmark = pytest.mark.servers


def test_with_replicas_acknowledging_no_key_runs_twice_through_a_primary_crash() -> None:
    try:
        result = measure("redis-lag", on=True, keys=48)
    except ServerUnavailable as error:
        require_or_skip(f"Redis Sentinel set unavailable: {error}")
    assert result.unanswered == 0
    assert result.twice == 0
    assert result.different == 0
    assert result.failover is not None  # (a replica was promoted)
    assert result.recovery is not None  # (the run went on past the crash)


def test_on_a_cluster_with_replicas_acknowledging_no_key_runs_twice_through_a_primary_crash() -> (
    None
):
    try:
        result = measure("redis-cluster", on=True, keys=48)
    except ServerUnavailable as error:
        require_or_skip(f"Redis Cluster unavailable: {error}")
    assert result.unanswered == 0  # (the promoted replica has a replica of its own)
    assert result.twice == 0
    assert result.different == 0
    assert result.failover is not None
    assert result.recovery is not None
