"""Load (issue 5): 50 concurrent httpx clients, ten requests a key, through uvicorn with
``AsyncDynamoDBStore``, all on 127.0.0.1 (``benchmarks/load.py``).

Against DynamoDB Local (run by scripts/dynamodb-local.sh), at the benchmark's full default
scale (2,000 requests over 200 keys), whose conditional writes are atomic: every key's
handler runs exactly once, no response is a 5xx or a transport error,
and every replay carries the body of its key's one run. Duplicates in flight together get
409.

Against moto, 600 requests over 60 keys (the same clients and requests a key, for under a
third of the time: the full scale runs on DynamoDB Local, with every assertion made here and
more), the load must bring no 5xx and no transport error and run every key, but
exactly once is not asserted there: moto's threaded server does not make a conditional
``PutItem`` atomic (tests/contract/test_moto_atomicity.py proves two can both win), so one key in a
few hundred can run twice, which is moto's race and not the middleware's.
"""

from __future__ import annotations

import pytest

from benchmarks.load import run_load


@pytest.mark.parametrize(
    ("backend", "requests", "keys"),
    [("moto", 600, 60), ("dynamodb-local", 2000, 200)],
    ids=["moto", "dynamodb-local"],
)
def test_concurrent_clients_bring_no_5xx_and_run_every_key(
    backend: str, requests: int, keys: int, request: pytest.FixtureRequest
) -> None:
    endpoint_url: str | None = None
    if backend == "dynamodb-local":
        endpoint_url = request.getfixturevalue("dynamodb_local_endpoint")
    result = run_load(requests=requests, keys=keys, clients=50, endpoint_url=endpoint_url)
    print(result.report())  # the figures, with pytest -s

    assert result.errors == []
    assert result.server_errors == 0, result.statuses
    if backend == "dynamodb-local":
        assert set(result.statuses) <= {201, 409}, result.statuses
    else:
        # moto applies an UpdateItem one attribute at a time: a duplicate's read between the
        # completion's status and its response sees a completed key without a response and
        # is answered 410 (seen once in a fresh-clone make test: 1 in 600). Moto's race, as
        # running twice is; DynamoDB Local's atomic writes get 201 or 409 only (above).
        assert set(result.statuses) <= {201, 409, 410}, result.statuses
        assert result.statuses[410] <= requests // 100, result.statuses
    assert sum(result.statuses.values()) == requests
    assert len(result.runs) == keys
    assert all(runs >= 1 for runs in result.runs.values()), result.runs
    assert result.replayed > 0
    if backend == "dynamodb-local":  # atomic conditional writes: the whole guarantee
        assert result.keys_not_run_once(list(result.runs)) == []
        assert result.wrong_replays == 0
