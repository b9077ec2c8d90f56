"""The DynamoDB store's operations, written once as flows (see ``kit.Flow``): each yields a
``Call`` or :class:`Backoff` and receives the answer, or has the failure thrown in at its
``yield`` (``ConditionFailed``, ``TransactionCancelled``, ``StoreUnavailable``, from
``errors.translate_error``). The claim's PutItem is the one exception: sent as
``CLAIMING``, its failed condition may come back as the value, the ``ConditionFailed``
itself (the lean client does: a replay's claim fails every time, and a raise costs more
than the rest of the store's work on it)."""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

from ...clock import Clock
from ...errors import TransactionConflictError, TransactionRejectedError
from ..kit import Flow
from ..protocol import (
    CLAIMED,
    Claimed,
    ClaimRequest,
    ClaimResult,
    Completion,
    DeferredToken,
    Held,
    StoreUnavailable,
)
from ..records import Record, Status, StoredResponse
from . import requests as ddb
from .config import OverflowSettings
from .errors import ConditionFailed, Item, TransactionCancelled, refused_outright, rejected

DYNAMODB = "dynamodb"
S3 = "s3"
# DynamoDB, for a call whose failed condition may be answered as the value (see above).
CLAIMING = "dynamodb (a failed condition answered)"

# A deferred key past its interim completion: deferred (re-sent) or completed already.
DONE = (Status.DEFERRED, Status.COMPLETED)


# One request: boto3's method ``operation`` of the ``service`` client, with ``params`` (a
# plain tuple: the request path makes one per call).
Call = tuple[str, str, dict[str, Any]]


class Backoff(NamedTuple):
    """Wait ``seconds`` by the store's clock (``sleep`` or ``asleep``)."""

    seconds: float


class DynamoDBOps:
    """The flows of one table layout, S3 overflow, and clock (``create_table()``'s wait)."""

    supports_deferral = True

    def __init__(
        self, layout: ddb.TableLayout, overflow: OverflowSettings | None, clock: Clock
    ) -> None:
        self.layout = layout
        self.overflow = overflow
        self._clock = clock

    def _conditional(self, operation: str, params: dict[str, Any]) -> Flow[bool]:
        try:
            yield (DYNAMODB, operation, params)
        except ConditionFailed:
            return False
        return True

    def _record(self, item: Item) -> Flow[Record]:
        ref = ddb.overflow_reference(item)
        if ref is None or self.overflow is None:
            return ddb.item_to_record(self.layout, item)
        blob: bytes | None
        try:
            response = yield (S3, "get_object", {"Bucket": self.overflow.bucket, "Key": ref})
            blob = response["Blob"]
        except StoreUnavailable as error:
            if error.code not in ("NoSuchKey", "404"):
                raise
            blob = None
        return ddb.item_to_record(self.layout, item, blob)

    def claim(self, request: ClaimRequest) -> Flow[ClaimResult]:
        """One conditional PutItem; on failure the holder comes back in the same call."""
        for _ in range(ddb.CLAIM_ATTEMPTS):
            try:
                response = yield (CLAIMING, "put_item", ddb.claim_request(self.layout, request))
            except ConditionFailed as thrown:
                # A fresh value, not the exception: its traceback would tie this
                # generator's frame into a cycle left for the garbage collector.
                response = ConditionFailed(thrown.item)
            if type(response) is not ConditionFailed:
                return Claimed(taken_over=ddb.claim_took_over(response))
            if response.item is not None:
                if ddb.owned_in(response.item, request.owner, Status.IN_PROGRESS):
                    return CLAIMED
                return Held((yield from self._record(response.item)))
            # A backend without ALL_OLD on failure: read the holder instead.
            record = yield from self.get(request.key_hash)
            skew = request.clock_skew_seconds
            if record is not None and not record.is_claimable(request.now, skew):
                return Held(record)
        raise StoreUnavailable("DynamoDB claim kept racing with other writers")

    def complete(self, completion: Completion) -> Flow[bool]:
        """One conditional UpdateItem (S3 first for a large response); with business
        writes, one transaction."""
        if completion.writes:
            return (yield from self._commit(completion))
        plan = ddb.plan_completion(self.layout, completion, self.overflow)
        yield from self._put_overflow(plan)
        try:
            yield (DYNAMODB, "update_item", plan.request)
            return True
        except ConditionFailed as failed:
            to = completion.deferred_to
            stored = completion.deferred and (
                ddb.owned_in(failed.item, completion.owner, *DONE)
                or (to is not None and ddb.owned_in(failed.item, to, *DONE))
            )
        if not stored:
            yield from self._drop_overflow(plan)
        return stored

    def _commit(self, completion: Completion) -> Flow[bool]:
        """The business writes and the completion in one TransactWriteItems."""
        for force in (False, True):  # too large with the response: the response to S3
            plan = ddb.plan_completion(self.layout, completion, self.overflow, force_overflow=force)
            request = ddb.transaction_request(plan, completion.writes, completion.owner)
            size = ddb.transaction_size(request)
            if size <= ddb.MAX_TRANSACTION_BYTES:
                break
            if force or self.overflow is None or plan.overflow_key or completion.streamed:
                raise ddb.too_large(size)
        yield from self._put_overflow(plan)
        try:
            yield (DYNAMODB, "transact_write_items", request)
            return True
        except TransactionCancelled as cancelled:
            try:
                stored = ddb.commit_outcome(
                    cancelled.reasons, len(completion.writes), completion.owner
                )
            except (TransactionConflictError, TransactionRejectedError):
                yield from self._drop_overflow(plan)
                raise
        except StoreUnavailable as error:
            if not refused_outright(error):
                raise  # unknown outcome: the object may belong to a landed commit
            yield from self._drop_overflow(plan)
            raise rejected(error) from error
        if not stored:
            yield from self._drop_overflow(plan)
        return stored

    def _put_overflow(self, plan: ddb.CompletionPlan) -> Flow[None]:
        if plan.overflow_key is not None and self.overflow is not None:
            params = {"Bucket": self.overflow.bucket, "Key": plan.overflow_key}
            yield (S3, "put_object", {**params, "Body": plan.overflow_body})

    def _drop_overflow(self, plan: ddb.CompletionPlan) -> Flow[None]:
        # The object belongs to no record (fenced out, nothing committed). Best effort: a
        # lifecycle rule on the prefix catches what this misses.
        if plan.overflow_key is not None and self.overflow is not None:
            params = {"Bucket": self.overflow.bucket, "Key": plan.overflow_key}
            with contextlib.suppress(StoreUnavailable):
                yield (S3, "delete_object", params)

    def release(self, key_hash: str, owner: str) -> Flow[bool]:
        # (A DeleteItem that botocore re-sent after its first attempt landed finds nothing
        # and answers False too: an absent item cannot be told from one never written, and
        # the background release of a lost claim must keep trying until its claim lands.)
        return self._conditional("delete_item", ddb.release_request(self.layout, key_hash, owner))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> Flow[bool]:
        request = ddb.renew_request(self.layout, key_hash, owner, lock_expires_at)
        return self._conditional("update_item", request)

    def complete_final(
        self, token: DeferredToken, response: StoredResponse, now: float
    ) -> Flow[bool]:
        plan = ddb.plan_final_completion(self.layout, token, response, self.overflow)
        yield from self._put_overflow(plan)
        stored = yield from self._conditional("update_item", plan.request)
        if not stored:
            yield from self._drop_overflow(plan)
        return stored

    def release_unfinished(self, token: DeferredToken) -> Flow[bool]:
        return self._conditional("delete_item", ddb.release_deferred_request(self.layout, token))

    def get(self, key_hash: str) -> Flow[Record | None]:
        response = yield (DYNAMODB, "get_item", ddb.get_request(self.layout, key_hash))
        item = response.get("Item")
        return (yield from self._record(item)) if item else None

    def delete(self, key_hash: str) -> Flow[bool]:
        response = yield (DYNAMODB, "delete_item", ddb.delete_request(self.layout, key_hash))
        return bool(response.get("Attributes"))  # ALL_OLD: there was an item

    def check(self) -> Flow[None]:
        """DescribeTable and DescribeTimeToLive: the table exists, keyed and swept as
        ``create_table()`` makes it (and the credentials are accepted)."""
        table = {"TableName": self.layout.table_name}
        described = yield (DYNAMODB, "describe_table", table)
        ttl = yield (DYNAMODB, "describe_time_to_live", table)
        problem = ddb.schema_problem(self.layout, described["Table"], ttl)
        if problem is not None:
            raise StoreUnavailable(
                f"DynamoDB check failed: {problem}", cause="bad_schema", reason=problem
            )

    def create_table(self, wait_seconds: float = 60.0) -> Flow[None]:
        """CreateTable (on-demand), a wait by the clock for ACTIVE, TTL enabled."""
        layout = self.layout
        table = {"TableName": layout.table_name}
        try:
            yield (DYNAMODB, "create_table", ddb.create_table_request(layout))
        except StoreUnavailable as error:
            if error.code != "ResourceInUseException":
                raise
        deadline = self._clock.now() + wait_seconds
        while (yield (DYNAMODB, "describe_table", table))["Table"]["TableStatus"] != "ACTIVE":
            if self._clock.now() > deadline:
                raise StoreUnavailable(f"table {layout.table_name} did not become ACTIVE")
            yield Backoff(ddb.TABLE_POLL_SECONDS)
        described = yield (DYNAMODB, "describe_time_to_live", table)
        if not ddb.ttl_enabled(described, layout):
            try:
                yield (DYNAMODB, "update_time_to_live", ddb.enable_ttl_request(layout))
            except StoreUnavailable as error:
                # Another replica enabled TTL between our describe and update: done.
                if error.code != "ValidationException":
                    raise
                described = yield (DYNAMODB, "describe_time_to_live", table)
                if not ddb.ttl_enabled(described, layout):
                    raise
