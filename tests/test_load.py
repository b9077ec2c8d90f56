"""Load (issue 5): 2,000 requests over 200 keys from 50 concurrent httpx clients, through
uvicorn with ``AsyncDynamoDBStore`` on moto, all on 127.0.0.1 (``benchmarks/load.py``, at its
full default scale: about 15 s on two cores).

Every key's handler runs exactly once, no response is a 5xx or a transport error, and every
replay carries the body of its key's one run. Duplicates in flight together get 409.
"""

from __future__ import annotations

from benchmarks.load import run_load


def test_concurrent_clients_run_every_key_exactly_once_without_5xx() -> None:
    result = run_load(requests=2000, keys=200, clients=50)
    print(result.report())  # the figures, with pytest -s

    assert result.errors == []
    assert result.server_errors == 0, result.statuses
    assert set(result.statuses) <= {201, 409}, result.statuses
    assert sum(result.statuses.values()) == 2000
    assert len(result.runs) == 200
    assert result.keys_not_run_once(list(result.runs)) == []
    assert result.wrong_replays == 0
    assert result.replayed > 0
