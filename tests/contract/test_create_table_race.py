"""``create_table()`` on a fresh table is safe when replicas race: another instance enabling
TTL between our describe and our update is success, not a store failure.

moto accepts a second UpdateTimeToLive, so only DynamoDB Local (and real DynamoDB) shows the
race; the DynamoDB Local case runs when ``IDEMPOTENCY_DYNAMODB_LOCAL_URL`` is set
(scripts/dynamodb-local.sh) and is reported as skipped otherwise.
"""

from __future__ import annotations

import uuid

import pytest

from idempotency_middleware import DynamoDBStore
from tests.conftest import REGION

BACKENDS = ["moto", "dynamodb-local"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_table_tolerates_a_replica_enabling_ttl_first(
    request: pytest.FixtureRequest, backend: str
) -> None:
    fixture = "dynamodb_local_endpoint" if backend == "dynamodb-local" else "moto_endpoint"
    endpoint = request.getfixturevalue(fixture)
    table = f"race-{uuid.uuid4().hex[:8]}"
    first = DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION)
    second = DynamoDBStore(table, endpoint_url=endpoint, region_name=REGION)

    def other_instance_wins(**_: object) -> None:
        # After `first` read TTL as disabled, before it enables TTL, another replica runs
        # its whole create_table().
        first.client.meta.events.unregister(
            "before-call.dynamodb.UpdateTimeToLive", other_instance_wins
        )
        second.create_table()

    first.client.meta.events.register("before-call.dynamodb.UpdateTimeToLive", other_instance_wins)
    try:
        first.create_table()
        assert first.client.describe_time_to_live(TableName=table)["TimeToLiveDescription"][
            "TimeToLiveStatus"
        ] in ("ENABLED", "ENABLING")
    finally:
        first.close()
        second.close()
