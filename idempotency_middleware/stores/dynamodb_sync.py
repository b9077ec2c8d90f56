"""``DynamoDBStore``: the DynamoDB store on boto3, for the WSGI middleware."""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType
from typing import Any

from ..records import Record
from . import dynamodb as ddb
from .base import Claimed, ClaimRequest, ClaimResult, Completion, Held, StoreUnavailable


class DynamoDBStore(ddb.DynamoDBStoreBase):
    """DynamoDB store on boto3. One client, created on first use and reused (boto3 clients
    are thread-safe); ``close()`` or ``with store:`` releases its connections.
    """

    def _init_transport(self) -> None:
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 DynamoDB client, created once."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    import boto3

                    session = self._session or boto3.session.Session()
                    self._client = session.client(
                        "dynamodb", **self._settings.client_arguments(self._client_kwargs)
                    )
        return self._client

    def _s3(self) -> Any:
        """The boto3 S3 client for overflowing responses, created once."""
        if self._s3_client is None:
            with self._client_lock:
                if self._s3_client is None:
                    import boto3

                    assert self._overflow is not None
                    session = self._session or boto3.session.Session()
                    self._s3_client = session.client(
                        "s3", **self._settings.s3_client_arguments(self._overflow)
                    )
        return self._s3_client

    def _s3_call(self, operation: str, **request: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = getattr(self._s3(), operation)(**request)
        except self._errors as error:
            raise ddb.translate_error(f"S3 {operation}", error) from error
        return result

    def _record(self, item: ddb.Item) -> Record:
        ref = ddb.overflow_reference(item)
        if ref is None or self._overflow is None:
            return ddb.item_to_record(self.layout, item)
        try:
            blob = self._s3_call("get_object", Bucket=self._overflow.bucket, Key=ref)["Body"].read()
        except StoreUnavailable as error:
            if error.code not in ("NoSuchKey", "404"):
                raise
            blob = None
        return ddb.item_to_record(self.layout, item, blob)

    def _call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = getattr(self.client, operation)(**request)
        except self._errors as error:
            raise ddb.translate_error(operation, error) from error
        return result

    def _conditional(self, operation: str, request: dict[str, Any]) -> bool:
        try:
            self._call(operation, request)
        except ddb.ConditionFailed:
            return False
        return True

    def claim(self, request: ClaimRequest) -> ClaimResult:
        for _ in range(3):
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

    def release(self, key: str, owner: str) -> bool:
        return self._conditional("delete_item", ddb.release_request(self.layout, key, owner))

    def renew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return self._conditional(
            "update_item", ddb.renew_request(self.layout, key, owner, lock_expires_at)
        )

    def get(self, key: str) -> Record | None:
        """The record under ``key`` as stored (expired or not), for operators and tests."""
        item = self._call("get_item", ddb.get_request(self.layout, key)).get("Item")
        return self._record(item) if item else None

    def delete(self, key: str) -> None:
        """Remove a record unconditionally (operators re-driving failed work)."""
        self._call("delete_item", ddb.delete_request(self.layout, key))

    def create_table(self, *, wait_seconds: float = 60.0) -> None:
        """Create the table (on-demand) with TTL on its expiry attribute; safe to repeat."""
        try:
            self._call("create_table", ddb.create_table_request(self.layout))
        except StoreUnavailable as error:
            if error.code != "ResourceInUseException":
                raise
        deadline = time.monotonic() + wait_seconds
        while True:
            table = self._call("describe_table", {"TableName": self.layout.table_name})
            if table["Table"]["TableStatus"] == "ACTIVE":
                break
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"table {self.layout.table_name} did not become ACTIVE")
            time.sleep(0.5)
        described = self._call("describe_time_to_live", {"TableName": self.layout.table_name})
        if not ddb.ttl_enabled(described, self.layout):
            try:
                self._call("update_time_to_live", ddb.enable_ttl_request(self.layout))
            except StoreUnavailable as error:
                # Another replica enabled TTL between our describe and update: done.
                if error.code != "ValidationException":
                    raise
                described = self._call(
                    "describe_time_to_live", {"TableName": self.layout.table_name}
                )
                if not ddb.ttl_enabled(described, self.layout):
                    raise

    def close(self) -> None:
        """Release the client's connections. The store cannot be used afterwards."""
        with self._client_lock:
            for client in (self._client, self._s3_client):
                if client is not None:
                    client.close()
            self._client = self._s3_client = None

    def __enter__(self) -> DynamoDBStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
