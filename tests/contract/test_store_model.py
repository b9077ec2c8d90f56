"""Every store against the model: ``check_store_against_model`` over each store kind.

MemoryStore, SQLiteStore, RedisStore and PostgresStore (on the session's real servers,
tests/support/db_servers.py) and DynamoDBStore / AsyncDynamoDBStore on moto's server, each
through its sync and its async methods, run in lockstep with ``StoreModel`` (idempotency_middleware/
store_model.py) over sequences Hypothesis draws from a fixed seed. Bounded for the suite;
``MODEL_EXAMPLES=2000`` (and ``MODEL_STEPS``) runs a longer exploration. The stores'
purges are off and Redis's housekeeping TTLs run an hour past each deadline: the model keeps
an expired record until a claim replaces it.

The model's own rules are pinned below by hand-written sequences, so a change to the model
is a change to the protocol, made on purpose.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore, MemoryStore, SQLiteStore
from idempotency_middleware.stores import CLAIMED, TAKEN_OVER, ClaimRequest, Completion, Held
from idempotency_middleware.stores.dynamodb.requests import MAX_ITEM_RESPONSE_BYTES
from idempotency_middleware.stores.model import (
    Disagreement,
    Flavour,
    StoreModel,
    check_store_against_model,
    claim_differences,
)
from idempotency_middleware.stores.protocol import new_token, parse_token
from idempotency_middleware.stores.records import Status, StoredResponse
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION, table_creator
from tests.support.db_stores import location, new_store
from tests.support.store_kinds import DB_KINDS, MEMORY_KINDS, MOTO_KINDS, SQLITE_KINDS, is_async

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "12"))
STEPS = int(os.environ.get("MODEL_STEPS", "25"))
# The largest body kept by the stores with a limit of their own; DynamoDB's limit is on the
# encoded item, so its bodies are either well under it or over it.
LIMIT = 64
# (Not DynamoDB's own item limit: moto counts an attribute being replaced twice, its old value
# and its new one, so two kept bodies over about 200 KiB in a row fail on moto alone. The
# contract suite keeps a body just under the item limit.)
DYNAMODB_KEPT = 190 * 1024
DYNAMODB_TOO_LARGE = MAX_ITEM_RESPONSE_BYTES + 1

Factory = Callable[[FakeClock], Any]


@pytest.fixture(scope="module")
def model_table(moto_endpoint: str) -> str:
    name = f"idem-model-{uuid.uuid4().hex[:10]}"
    with table_creator(name, moto_endpoint) as creator:
        creator.create_table()
    return name


def factory_of(request: pytest.FixtureRequest, kind: str) -> tuple[Factory, dict[str, Any]]:
    """The store factory for ``kind`` and the body limits the model holds it to."""
    base = kind.removesuffix("-async")
    limits: dict[str, Any] = {"max_response_bytes": LIMIT}
    if base == "memory":
        return lambda clock: MemoryStore(
            max_response_bytes=LIMIT, purge_interval_seconds=math.inf, clock=clock
        ), limits
    if base == "sqlite":
        path: Path = request.getfixturevalue("tmp_path") / "model.sqlite3"
        return lambda clock: SQLiteStore(
            path, purge_interval_seconds=None, max_response_bytes=LIMIT, clock=clock
        ), limits
    if base == "redis":
        where = location(request, base)
        return lambda clock: new_store(
            base, where, clock=clock, max_response_bytes=LIMIT, ttl_grace_seconds=3600
        ), limits
    if base == "postgres":
        where = location(request, base)
        return lambda clock: new_store(
            base, where, clock=clock, max_response_bytes=LIMIT, purge_interval_seconds=None
        ), limits
    endpoint: str = request.getfixturevalue("moto_endpoint")
    table: str = request.getfixturevalue("model_table")
    store_class: Any = AsyncDynamoDBStore if is_async(kind) else DynamoDBStore
    dynamodb = {
        "max_response_bytes": DYNAMODB_KEPT,
        "too_large_bytes": DYNAMODB_TOO_LARGE,
    }
    return lambda clock: store_class(
        table, endpoint_url=endpoint, region_name=REGION, clock=clock
    ), dynamodb


@pytest.mark.parametrize("kind", [*MEMORY_KINDS, *SQLITE_KINDS, *DB_KINDS, *MOTO_KINDS])
def test_store_answers_as_the_model(request: pytest.FixtureRequest, kind: str) -> None:
    factory, limits = factory_of(request, kind)
    flavour: Flavour = "async" if is_async(kind) else "sync"
    explored = check_store_against_model(
        factory, flavour=flavour, max_examples=EXAMPLES, steps=STEPS, **limits
    )
    print(f"{kind}: {explored.sequences} sequences, {explored.steps} steps")
    assert explored.sequences >= EXAMPLES
    assert explored.steps >= explored.sequences


# --- the model's own rules, pinned --------------------------------------------------------

KEY = "a" * 64
NOW = 1_000.0
RESPONSE = StoredResponse(200, [(b"x-a", b"1")], b"first")


def claim(owner: str, now: float, *, lock: float = 5.0, skew: float = 0.0) -> ClaimRequest:
    return ClaimRequest(KEY, "fp", owner, now, lock, skew)


def done(owner: str, now: float, response: StoredResponse = RESPONSE, **more: Any) -> Completion:
    return Completion(KEY, owner, now, 10.0, response, **more)


def test_a_stale_claim_is_taken_over_only_past_the_skew_margin() -> None:
    model = StoreModel()
    assert model.claim(claim("aa-1", NOW)) == CLAIMED
    assert isinstance(model.claim(claim("aa-2", NOW + 5.5, skew=1.0)), Held)
    assert model.claim(claim("aa-2", NOW + 6.0, skew=1.0)) == TAKEN_OVER
    assert model.complete(done("aa-1", NOW + 7)) is False  # fenced
    assert model.release(KEY, "aa-1") is False
    assert model.renew(KEY, "aa-1", NOW + 20) is False


def test_a_second_completion_wins_and_one_not_kept_leaves_no_body() -> None:
    model = StoreModel(max_response_bytes=10)
    model.claim(claim("aa-1", NOW))
    assert model.complete(done("aa-1", NOW + 1)) is True
    too_large = StoredResponse(200, [], b"x" * 11)
    assert model.complete(done("aa-1", NOW + 2, too_large)) is True
    record = model.get(KEY)
    assert record is not None
    assert (record.response, record.response_not_stored, record.response_size) == (None, True, 11)
    assert record.expires_at == NOW + 12


def test_an_expired_completion_is_claimed_afresh_not_taken_over() -> None:
    model = StoreModel()
    model.claim(claim("aa-1", NOW))
    model.complete(done("aa-1", NOW))
    assert isinstance(model.claim(claim("aa-2", NOW + 10 - 1 / 64)), Held)
    assert model.claim(claim("aa-2", NOW + 10)) == CLAIMED


def test_a_deferral_token_finishes_its_key_once_until_it_expires() -> None:
    model = StoreModel()
    model.claim(claim("aa-1", NOW))
    token = parse_token(new_token(KEY, "aa-1", NOW + 10))
    assert model.complete(done("aa-1", NOW, deferred=True)) is True
    assert model.complete_deferred(token, RESPONSE, NOW + 10) is False  # expired
    assert model.complete_deferred(token, RESPONSE, NOW + 9) is True
    record = model.get(KEY)
    assert record is not None
    assert (record.status, record.expires_at) == (Status.COMPLETED, NOW + 10)
    assert model.complete_deferred(token, RESPONSE, NOW + 9) is False
    assert model.release_deferred(token) is False


def test_a_claim_answer_of_another_kind_is_a_disagreement() -> None:
    model = StoreModel()
    model.claim(claim("aa-1", NOW))
    held = model.claim(claim("aa-2", NOW))
    assert claim_differences(held, CLAIMED) != []
    assert claim_differences(CLAIMED, TAKEN_OVER) != []


class ForgetsSecondBody(MemoryStore):
    """A store with the defect the model must catch: a second completion whose response is
    not kept leaves the first one's body behind."""

    def complete(self, completion: Completion) -> bool:
        before = self.get(completion.key_hash)
        if not super().complete(completion):
            return False
        after = self.get(completion.key_hash)
        kept_before = before is not None and before.response is not None
        if kept_before and after is not None and after.response is None:
            assert before is not None
            self._records[completion.key_hash] = after._replace(response=before.response)
        return True


def test_the_check_finds_a_store_that_keeps_an_earlier_body() -> None:
    with pytest.raises(Disagreement, match="response"):
        check_store_against_model(
            # No purge, as for every store the model checks: a purge dropping an expired claim
            # is a disagreement of its own (taken over, or not), which make simulate's longer
            # sequences found beside the one this test is after.
            lambda clock: ForgetsSecondBody(
                max_response_bytes=LIMIT, purge_interval_seconds=math.inf, clock=clock
            ),
            max_response_bytes=LIMIT,
            max_examples=200,
            steps=STEPS,
        )
