"""The pure parts of a commit's outcome: how a cancelled TransactWriteItems is read, how big
a transaction is counted, the problems a refused one is answered with, and the errors a
function raises surviving a trip between processes (pickle)."""

from __future__ import annotations

import pickle
from typing import Any

import orjson
import pytest

from idempotency_middleware import (
    StoreUnavailableError,
    TransactionConflictError,
    TransactionRejectedError,
)
from idempotency_middleware.engine import decisions, refusals
from idempotency_middleware.stores.dynamodb.requests import (
    commit_outcome,
    commit_token,
    transaction_size,
)

OWNER = "0123456789abcdef01234567-1f"
FINE = {"Code": "None"}


def test_a_completion_that_failed_on_its_own_earlier_commit_landed() -> None:
    ours = {"Code": "ConditionalCheckFailed", "Item": {"txn": {"S": commit_token(OWNER)}}}
    theirs = {"Code": "ConditionalCheckFailed", "Item": {"txn": {"S": "someone else"}}}
    assert commit_outcome([FINE, ours], 1, OWNER) is True
    assert commit_outcome([FINE, theirs], 1, OWNER) is False
    assert commit_outcome([FINE, {"Code": "ConditionalCheckFailed"}], 1, OWNER) is False


def test_a_business_condition_is_a_conflict_at_its_position() -> None:
    with pytest.raises(TransactionConflictError) as raised:
        commit_outcome([FINE, {"Code": "ConditionalCheckFailed"}, FINE], 2, OWNER)
    assert (raised.value.position, raised.value.reason) == (1, "ConditionalCheckFailed")


def test_a_write_dynamodb_will_never_accept_is_rejected() -> None:
    reasons = [{"Code": "ValidationError", "Message": "Item size has exceeded the limit"}, FINE]
    with pytest.raises(TransactionRejectedError) as raised:
        commit_outcome(reasons, 1, OWNER)
    assert raised.value.reason == "ValidationError"
    assert "Item size" in str(raised.value)


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        ("TransactionConflict", "server_error"),
        ("ProvisionedThroughputExceeded", "throttled"),
        ("ThrottlingError", "throttled"),
    ],
)
def test_contention_and_capacity_are_outages_the_finishing_retries_try_again(
    code: str, cause: str
) -> None:
    with pytest.raises(StoreUnavailableError) as raised:
        commit_outcome([{"Code": code}, FINE], 1, OWNER)
    assert raised.value.cause == cause
    assert code in raised.value.reason


def test_a_transactions_size_counts_names_and_values_of_every_kind() -> None:
    item: dict[str, Any] = {
        "s": {"S": "ab"},
        "n": {"N": "123"},
        "b": {"B": b"xyz"},
        "t": {"BOOL": True},
        "z": {"NULL": True},
        "ss": {"SS": ["a", "bc"]},
        "bs": {"BS": [b"a", b"bc"]},
        "l": {"L": [{"S": "a"}, {"N": "1"}]},
        "m": {"M": {"k": {"S": "v"}}},
    }
    request = {"TransactItems": [{"Put": {"TableName": "t", "Item": item}}]}
    names = sum(len(name) for name in item)
    values = 2 + 3 + 3 + 1 + 1 + 3 + 3 + (3 + 2 + 2) + (3 + 1 + 1 + 1)
    assert transaction_size(request) == names + values


def test_a_refused_transaction_is_answered_500_with_its_own_slug() -> None:
    too_large = TransactionRejectedError("over 4 MB", reason="too_large")
    invalid = TransactionRejectedError("bad", reason="ValidationException")
    large = refusals.problem_for(decisions.Refusal("transaction_rejected", error=too_large))
    rejected = refusals.problem_for(decisions.Refusal("transaction_rejected", error=invalid))
    assert (large.status, large.slug) == (500, "transaction-too-large")
    assert (rejected.status, rejected.slug) == (500, "transaction-rejected")


def test_an_unconfirmed_commit_is_a_503_saying_it_landed_whole_or_not_at_all() -> None:
    problem = refusals.problem_for(decisions.COMMIT_UNAVAILABLE)
    document = orjson.loads(problem.body())
    assert (problem.status, problem.retry_after) == (503, 1)
    assert "whole or not at all" in document["detail"]


def test_a_conflict_problem_carries_position_and_reason_after_the_standard_members() -> None:
    conflict = TransactionConflictError("x", position=3, reason="ConditionalCheckFailed")
    problem = refusals.problem_for(decisions.Refusal("transaction_conflict", error=conflict))
    document = orjson.loads(problem.body())
    assert list(document) == ["type", "title", "status", "detail", "position", "reason"]
    assert (document["position"], document["reason"]) == (3, "ConditionalCheckFailed")


def test_the_transaction_errors_survive_pickling() -> None:
    conflict = pickle.loads(
        pickle.dumps(TransactionConflictError("c", position=2, reason="ConditionalCheckFailed"))
    )
    rejected = pickle.loads(pickle.dumps(TransactionRejectedError("r", reason="too_large")))
    assert (str(conflict), conflict.position, conflict.reason) == (
        "c",
        2,
        "ConditionalCheckFailed",
    )
    assert (str(rejected), rejected.reason) == ("r", "too_large")
