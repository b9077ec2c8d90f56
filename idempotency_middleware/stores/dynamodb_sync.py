"""``DynamoDBStore``: the DynamoDB store on boto3, for the WSGI middleware.

Generated from ``dynamodb_async.py`` by ``scripts/unasync.py``: do not edit; edit the async
store and run the script.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..records import Record
from . import dynamodb as ddb
from .base import Claimed, ClaimRequest, ClaimResult, Completion, Held, StoreUnavailable
from .dynamodb_clients import SyncClients


class DynamoDBStore(SyncClients):
    """DynamoDB store on boto3, for the WSGI middleware.

    ``store.close()`` or ``with store:`` releases its connections.
    The operator interface: ``store.create_table()``, ``get``, ``delete``.
    """

    def _s3_call(self, operation: str, **request: Any) -> dict[str, Any]:
        try:
            client = self._s3()
            result: dict[str, Any] = getattr(client, operation)(**request)
            if operation == "get_object":
                result["Blob"] = self._read_body(result["Body"])
        except self._errors as error:
            raise ddb.translate_error(f"S3 {operation}", error) from error
        return result

    def _record(self, item: ddb.Item) -> Record:
        ref = ddb.overflow_reference(item)
        if ref is None or self._overflow is None:
            return ddb.item_to_record(self.layout, item)
        try:
            response = self._s3_call("get_object", Bucket=self._overflow.bucket, Key=ref)
            blob: bytes | None = response["Blob"]
        except StoreUnavailable as error:
            if error.code not in ("NoSuchKey", "404"):
                raise
            blob = None
        return ddb.item_to_record(self.layout, item, blob)

    def _call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            client = self._dynamodb()
            result: dict[str, Any] = getattr(client, operation)(**request)
        except self._errors as error:
            raise ddb.translate_error(operation, error, self.layout.table_name) from error
        return result

    def _conditional(self, operation: str, request: dict[str, Any]) -> bool:
        try:
            self._call(operation, request)
        except ddb.ConditionFailed:
            return False
        return True

    # -- the store protocol -----------------------------------------------------------

    def claim(self, request: ClaimRequest) -> ClaimResult:
        """One conditional PutItem; on failure the holder comes back in the same call."""
        for _ in range(ddb.CLAIM_ATTEMPTS):
            try:
                response = self._call("put_item", ddb.claim_request(self.layout, request))
            except ddb.ConditionFailed as failed:
                if failed.item is not None:
                    return Held(self._record(failed.item))
                # A backend without ALL_OLD on failure: read the holder instead.
                record = self.get(request.key_hash)
                if record is not None and not record.is_claimable(request.now):
                    return Held(record)
                continue
            return Claimed(taken_over=ddb.claim_took_over(response))
        raise StoreUnavailable("DynamoDB claim kept racing with other writers")

    def complete(self, completion: Completion) -> bool:
        """Store the response; ``False`` when the claim is no longer ``owner``'s."""
        overflow = self._overflow
        plan = ddb.plan_completion(self.layout, completion, overflow)
        if plan.overflow_key is not None and overflow is not None:
            self._s3_call(
                "put_object", Bucket=overflow.bucket, Key=plan.overflow_key, Body=plan.overflow_body
            )
        stored = self._conditional("update_item", plan.request)
        if not stored and plan.overflow_key is not None and overflow is not None:
            # Fenced out: the object belongs to no record. Best effort; a lifecycle rule
            # on the prefix catches what this misses.
            with contextlib.suppress(StoreUnavailable):
                self._s3_call("delete_object", Bucket=overflow.bucket, Key=plan.overflow_key)
        return stored

    def release(self, key_hash: str, owner: str) -> bool:
        """Delete the claim; ``False`` when it is no longer ``owner``'s."""
        # (A DeleteItem that botocore re-sent after its first attempt landed finds nothing
        # and answers False too: an absent item cannot be told from one never written, and
        # the background release of a lost claim must keep trying until its claim lands.)
        return self._conditional("delete_item", ddb.release_request(self.layout, key_hash, owner))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """Extend an in-progress claim; ``False`` when it is no longer ``owner``'s."""
        return self._conditional(
            "update_item", ddb.renew_request(self.layout, key_hash, owner, lock_expires_at)
        )

    # -- operators --------------------------------------------------------------------

    def get(self, key_hash: str) -> Record | None:
        """The record under ``key_hash`` as stored (expired or not), for operators and tests."""
        response = self._call("get_item", ddb.get_request(self.layout, key_hash))
        item = response.get("Item")
        return self._record(item) if item else None

    def delete(self, key_hash: str) -> bool:
        """Remove a record whoever owns it (operators re-driving failed work); ``True`` when
        there was one."""
        request = ddb.delete_request(self.layout, key_hash)
        return ddb.deleted_something(self._call("delete_item", request))

    def create_table(self, *, wait_seconds: float = 60.0) -> None:
        """Create the table (on-demand) with TTL on its expiry attribute; safe to repeat.

        Waits up to ``wait_seconds`` (by the store's clock) for a new table to become ACTIVE.
        """
        try:
            self._call("create_table", ddb.create_table_request(self.layout))
        except StoreUnavailable as error:
            if error.code != "ResourceInUseException":
                raise
        deadline = self._clock.now() + wait_seconds
        while not ddb.table_active(self._call("describe_table", ddb.table_request(self.layout))):
            if self._clock.now() > deadline:
                raise StoreUnavailable(f"table {self.layout.table_name} did not become ACTIVE")
            self._clock.sleep(ddb.TABLE_POLL_SECONDS)
        described = self._call("describe_time_to_live", ddb.table_request(self.layout))
        if not ddb.ttl_enabled(described, self.layout):
            try:
                self._call("update_time_to_live", ddb.enable_ttl_request(self.layout))
            except StoreUnavailable as error:
                # Another replica enabled TTL between our describe and update: done.
                if error.code != "ValidationException":
                    raise
                described = self._call("describe_time_to_live", ddb.table_request(self.layout))
                if not ddb.ttl_enabled(described, self.layout):
                    raise
