"""``AsyncDynamoDBStore``: the DynamoDB store on aioboto3, for the ASGI middleware."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import Any

from ..records import Record
from . import dynamodb as ddb
from .base import Claimed, ClaimRequest, ClaimResult, Completion, Held, StoreUnavailable


class AsyncDynamoDBStore(ddb.DynamoDBStoreBase):
    """DynamoDB store on aioboto3.

    One client is created on first use and reused for the life of the store; its connection
    pool is sized by ``max_pool_connections``. ``await store.aclose()`` or
    ``async with store:`` releases it. The client belongs to the event loop that first used
    it, as aiobotocore clients do.
    """

    def _init_transport(self) -> None:
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._client_lock: asyncio.Lock | None = None

    async def client(self) -> Any:
        """The aioboto3 DynamoDB client, created once."""
        if self._client is not None:
            return self._client
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:
            if self._client is None:
                import aioboto3

                session = self._session or aioboto3.Session()
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    session.client(
                        "dynamodb", **self._settings.client_arguments(self._client_kwargs)
                    )
                )
                self._exit_stack = stack
        return self._client

    async def _s3(self) -> Any:
        """The aioboto3 S3 client for overflowing responses, created once."""
        if self._s3_client is not None:
            return self._s3_client
        await self.client()  # creates the exit stack and the lock
        assert self._client_lock is not None and self._exit_stack is not None
        async with self._client_lock:
            if self._s3_client is None:
                import aioboto3

                assert self._overflow is not None
                session = self._session or aioboto3.Session()
                self._s3_client = await self._exit_stack.enter_async_context(
                    session.client("s3", **self._settings.s3_client_arguments(self._overflow))
                )
        return self._s3_client

    async def _s3_call(self, operation: str, **request: Any) -> dict[str, Any]:
        try:
            client = await self._s3()
            result: dict[str, Any] = await getattr(client, operation)(**request)
            if operation == "get_object":
                async with result["Body"] as stream:
                    result["Blob"] = await stream.read()
        except self._errors as error:
            raise ddb.translate_error(f"S3 {operation}", error) from error
        return result

    async def _record(self, item: ddb.Item) -> Record:
        ref = ddb.overflow_reference(item)
        if ref is None or self._overflow is None:
            return ddb.item_to_record(self.layout, item)
        try:
            response = await self._s3_call("get_object", Bucket=self._overflow.bucket, Key=ref)
            blob: bytes | None = response["Blob"]
        except StoreUnavailable as error:
            if error.code not in ("NoSuchKey", "404"):
                raise
            blob = None
        return ddb.item_to_record(self.layout, item, blob)

    async def _call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            client = await self.client()
            result: dict[str, Any] = await getattr(client, operation)(**request)
        except self._errors as error:
            raise ddb.translate_error(operation, error) from error
        return result

    async def _conditional(self, operation: str, request: dict[str, Any]) -> bool:
        try:
            await self._call(operation, request)
        except ddb.ConditionFailed:
            return False
        return True

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        for _ in range(3):
            try:
                response = await self._call("put_item", ddb.claim_request(self.layout, request))
            except ddb.ConditionFailed as failed:
                if failed.item is not None:
                    return Held(await self._record(failed.item))
                # A backend without ALL_OLD on failure: read the holder instead.
                record = await self.get(request.key_hash)
                if record is not None and not record.is_claimable(request.now):
                    return Held(record)
                continue
            return Claimed(taken_over=ddb.claim_took_over(response))
        raise StoreUnavailable("DynamoDB claim kept racing with other writers")

    async def acomplete(self, completion: Completion) -> bool:
        overflow = self._overflow
        plan = ddb.plan_completion(self.layout, completion, overflow)
        if plan.overflow_key is not None and overflow is not None:
            await self._s3_call(
                "put_object", Bucket=overflow.bucket, Key=plan.overflow_key, Body=plan.overflow_body
            )
        stored = await self._conditional("update_item", plan.request)
        if not stored and plan.overflow_key is not None and overflow is not None:
            # Fenced out: the object belongs to no record. Best effort; a lifecycle rule
            # on the prefix catches what this misses.
            with contextlib.suppress(StoreUnavailable):
                await self._s3_call("delete_object", Bucket=overflow.bucket, Key=plan.overflow_key)
        return stored

    async def arelease(self, key: str, owner: str) -> bool:
        return await self._conditional("delete_item", ddb.release_request(self.layout, key, owner))

    async def arenew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return await self._conditional(
            "update_item", ddb.renew_request(self.layout, key, owner, lock_expires_at)
        )

    async def get(self, key: str) -> Record | None:
        """The record under ``key`` as stored (expired or not), for operators and tests."""
        item = (await self._call("get_item", ddb.get_request(self.layout, key))).get("Item")
        return await self._record(item) if item else None

    async def delete(self, key: str) -> None:
        """Remove a record unconditionally (operators re-driving failed work)."""
        await self._call("delete_item", ddb.delete_request(self.layout, key))

    async def create_table(self, *, wait_seconds: float = 60.0) -> None:
        """Create the table (on-demand) with TTL on its expiry attribute; safe to repeat."""
        try:
            await self._call("create_table", ddb.create_table_request(self.layout))
        except StoreUnavailable as error:
            if error.code != "ResourceInUseException":
                raise
        deadline = time.monotonic() + wait_seconds
        while True:
            table = await self._call("describe_table", {"TableName": self.layout.table_name})
            if table["Table"]["TableStatus"] == "ACTIVE":
                break
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"table {self.layout.table_name} did not become ACTIVE")
            await asyncio.sleep(0.5)
        described = await self._call("describe_time_to_live", {"TableName": self.layout.table_name})
        if not ddb.ttl_enabled(described, self.layout):
            try:
                await self._call("update_time_to_live", ddb.enable_ttl_request(self.layout))
            except StoreUnavailable as error:
                # Another replica enabled TTL between our describe and update: done.
                if error.code != "ValidationException":
                    raise
                described = await self._call(
                    "describe_time_to_live", {"TableName": self.layout.table_name}
                )
                if not ddb.ttl_enabled(described, self.layout):
                    raise

    async def aclose(self) -> None:
        """Release the client and its connections."""
        stack, self._exit_stack = self._exit_stack, None
        self._client = self._s3_client = None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> AsyncDynamoDBStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
