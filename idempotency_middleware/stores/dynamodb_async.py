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


class AsyncDynamoDBStore:
    """DynamoDB store on aioboto3.

    One client is created on first use and reused for the life of the store; its connection
    pool is sized by ``max_pool_connections``. ``await store.aclose()`` or
    ``async with store:`` releases it. The client belongs to the event loop that first used
    it, as aiobotocore clients do.
    """

    def __init__(
        self,
        table_name: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        connect_timeout: float = 1.0,
        read_timeout: float = 2.0,
        max_attempts: int = 2,
        max_pool_connections: int = 50,
        key_attribute: str = "pk",
        ttl_attribute: str = "ttl",
        session: Any = None,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.layout = ddb.TableLayout(table_name, key_attribute, ttl_attribute)
        self._settings = ddb.ClientSettings(
            endpoint_url,
            region_name,
            connect_timeout,
            read_timeout,
            max_attempts,
            max_pool_connections,
        )
        self._session = session
        self._client_kwargs = dict(client_kwargs or {})
        self._client: Any = None
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._client_lock: asyncio.Lock | None = None
        self._errors = ddb.store_errors()

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
                    return Held(ddb.item_to_record(self.layout, failed.item))
                # A backend without ALL_OLD on failure: read the holder instead.
                record = await self.get(request.key)
                if record is not None and not record.is_claimable(request.now):
                    return Held(record)
                continue
            return Claimed(taken_over=ddb.claim_took_over(response))
        raise StoreUnavailable("DynamoDB claim kept racing with other writers")

    async def acomplete(self, completion: Completion) -> bool:
        return await self._conditional("update_item", ddb.complete_request(self.layout, completion))

    async def arelease(self, key: str, owner: str) -> bool:
        return await self._conditional("delete_item", ddb.release_request(self.layout, key, owner))

    async def arenew(self, key: str, owner: str, lock_expires_at: float) -> bool:
        return await self._conditional(
            "update_item", ddb.renew_request(self.layout, key, owner, lock_expires_at)
        )

    async def get(self, key: str) -> Record | None:
        """The record under ``key`` as stored (expired or not), for operators and tests."""
        item = (await self._call("get_item", ddb.get_request(self.layout, key))).get("Item")
        return ddb.item_to_record(self.layout, item) if item else None

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
            await self._call("update_time_to_live", ddb.enable_ttl_request(self.layout))

    async def aclose(self) -> None:
        """Release the client and its connections."""
        stack, self._exit_stack, self._client = self._exit_stack, None, None
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
