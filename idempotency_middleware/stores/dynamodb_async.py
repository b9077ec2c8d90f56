"""``AsyncDynamoDBStore``: the DynamoDB store on aioboto3, for the ASGI middleware.

Requests are built and responses parsed by the pure functions of ``dynamodb.py``; this module
only sends them and strings them together. It is also the source of ``dynamodb_sync.py``,
which ``scripts/unasync.py`` generates from it: edit here, then run ``scripts/unasync.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from .. import deferred
from ..errors import TransactionConflictError, TransactionRejectedError
from ..records import Record
from . import dynamodb as ddb
from .base import CLAIMED, Claimed, ClaimRequest, ClaimResult, Completion, Held, StoreUnavailable
from .dynamodb_clients import AsyncClients


class AsyncDynamoDBStore(AsyncClients):
    """DynamoDB store on aioboto3, for the ASGI middleware (the request path on the lean
    transport by default: see ``transport``).

    ``await store.aclose()`` or ``async with store:`` releases its connections.
    The operator interface: ``await store.acreate_table()``, ``aget``, ``adelete``.
    """

    async def _s3_call(self, operation: str, **request: Any) -> dict[str, Any]:
        try:
            client = await self._s3()
            result: dict[str, Any] = await getattr(client, operation)(**request)
            if operation == "get_object":
                result["Blob"] = await self._read_body(result["Body"])
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
            client = await (
                self._dynamodb()
                if operation in ddb.REQUEST_PATH_OPERATIONS
                else self._admin_dynamodb()
            )
            result: dict[str, Any] = await getattr(client, operation)(**request)
        except self._errors as error:
            translated = ddb.translate_error(operation, error, self.layout.table_name)
            if isinstance(translated, StoreUnavailable):
                self.breaker.failed(translated)
            else:
                self.breaker.succeeded()  # a failed condition is an answer
            raise translated from error
        self.breaker.succeeded()
        return result

    async def _conditional(self, operation: str, request: dict[str, Any]) -> bool:
        try:
            await self._call(operation, request)
        except ddb.ConditionFailed:
            return False
        return True

    # -- the store protocol -----------------------------------------------------------

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        """One conditional PutItem; on failure the holder comes back in the same call."""
        if self.breaker.admit():  # the half-open breaker's probe
            try:
                return await self._put_claim(request)
            finally:
                self.breaker.end_probe()
        return await self._put_claim(request)

    async def _put_claim(self, request: ClaimRequest) -> ClaimResult:
        for _ in range(ddb.CLAIM_ATTEMPTS):
            try:
                response = await self._call("put_item", ddb.claim_request(self.layout, request))
            except ddb.ConditionFailed as failed:
                if failed.item is not None:
                    if ddb.claimed_by(failed.item, request.owner):
                        return CLAIMED
                    return Held(await self._record(failed.item))
                # A backend without ALL_OLD on failure: read the holder instead.
                record = await self.aget(request.key_hash)
                skew = request.clock_skew_seconds
                if record is not None and not record.is_claimable(request.now, skew):
                    return Held(record)
                continue
            return Claimed(taken_over=ddb.claim_took_over(response))
        raise StoreUnavailable("DynamoDB claim kept racing with other writers")

    async def acomplete(self, completion: Completion) -> bool:
        """Store the response; ``False`` when the claim is no longer ``owner``'s. With
        business writes, commit them and the completion in one transaction."""
        if completion.writes:
            return await self._commit(completion)
        overflow = self._overflow
        plan = ddb.plan_completion(self.layout, completion, overflow)
        await self._put_overflow(plan)
        try:
            await self._call("update_item", plan.request)
            stored = True
        except ddb.ConditionFailed as failed:
            stored = completion.deferred and ddb.finished_by(failed.item, completion.owner)
        if not stored:
            await self._drop_overflow(plan)
        return stored

    async def _commit(self, completion: Completion) -> bool:
        """The business writes and the completion in one TransactWriteItems."""
        overflow = self._overflow
        plan = ddb.plan_completion(self.layout, completion, overflow)
        request = ddb.transaction_request(plan, completion.writes, completion.owner)
        size = ddb.transaction_size(request)
        if size > ddb.MAX_TRANSACTION_BYTES:
            if overflow is None or plan.overflow_key is not None or completion.streamed:
                raise ddb.too_large(size)
            plan = ddb.plan_completion(self.layout, completion, overflow, force_overflow=True)
            request = ddb.transaction_request(plan, completion.writes, completion.owner)
            size = ddb.transaction_size(request)
            if size > ddb.MAX_TRANSACTION_BYTES:
                raise ddb.too_large(size)
        await self._put_overflow(plan)
        try:
            await self._call("transact_write_items", request)
            return True
        except ddb.TransactionCancelled as cancelled:
            try:
                stored = ddb.commit_outcome(
                    cancelled.reasons, len(completion.writes), completion.owner
                )
            except (TransactionConflictError, TransactionRejectedError):
                await self._drop_overflow(plan)
                raise
        except StoreUnavailable as error:
            if not ddb.refused_outright(error):
                raise  # unknown outcome: the object may belong to a landed commit
            await self._drop_overflow(plan)
            raise ddb.rejected(error) from error
        if not stored:
            await self._drop_overflow(plan)
        return stored

    async def _put_overflow(self, plan: ddb.CompletionPlan) -> None:
        overflow = self._overflow
        if plan.overflow_key is not None and overflow is not None:
            await self._s3_call(
                "put_object", Bucket=overflow.bucket, Key=plan.overflow_key, Body=plan.overflow_body
            )

    async def _drop_overflow(self, plan: ddb.CompletionPlan) -> None:
        """The object belongs to no record (fenced out, nothing committed). Best effort; a
        lifecycle rule on the prefix catches what this misses."""
        overflow = self._overflow
        if plan.overflow_key is not None and overflow is not None:
            with contextlib.suppress(StoreUnavailable):
                await self._s3_call("delete_object", Bucket=overflow.bucket, Key=plan.overflow_key)

    async def arelease(self, key_hash: str, owner: str) -> bool:
        """Delete the claim; ``False`` when it is no longer ``owner``'s."""
        # (A DeleteItem that botocore re-sent after its first attempt landed finds nothing
        # and answers False too: an absent item cannot be told from one never written, and
        # the background release of a lost claim must keep trying until its claim lands.)
        return await self._conditional(
            "delete_item", ddb.release_request(self.layout, key_hash, owner)
        )

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        """Extend an in-progress claim; ``False`` when it is no longer ``owner``'s."""
        return await self._conditional(
            "update_item", ddb.renew_request(self.layout, key_hash, owner, lock_expires_at)
        )

    # -- deferred keys ------------------------------------------------------------------

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: Iterable[tuple[bytes, bytes]] = (),
        body: bytes = b"",
    ) -> bool:
        """Store the final response of work deferred with ``defer_completion()``; from then
        on retries get it replayed. ``False`` when the token no longer applies (completed
        already, expired, taken over); ``ValueError`` when it is malformed."""
        prepared = deferred.prepare_final(token, status, headers, body, self._clock.now())
        if prepared is None:
            return False
        parsed, response = prepared
        plan = ddb.plan_final_completion(self.layout, parsed, response, self._overflow)
        await self._put_overflow(plan)
        stored = await self._conditional("update_item", plan.request)
        if not stored:
            await self._drop_overflow(plan)
        return stored

    async def arelease_deferred(self, token: str) -> bool:
        """The deferred work did not happen: forget the key, so a retry runs the handler
        again. ``False`` when the token no longer applies."""
        parsed = deferred.parse_token(token)
        return await self._conditional(
            "delete_item", ddb.release_deferred_request(self.layout, parsed)
        )

    # -- operators --------------------------------------------------------------------

    async def aget(self, key_hash: str) -> Record | None:
        """The record under ``key_hash`` as stored (expired or not), for operators and tests."""
        response = await self._call("get_item", ddb.get_request(self.layout, key_hash))
        item = response.get("Item")
        return await self._record(item) if item else None

    async def adelete(self, key_hash: str) -> bool:
        """Remove a record whoever owns it (operators re-driving failed work); ``True`` when
        there was one."""
        request = ddb.delete_request(self.layout, key_hash)
        return ddb.deleted_something(await self._call("delete_item", request))

    async def acreate_table(self, *, wait_seconds: float = 60.0) -> None:
        """Create the table (on-demand) with TTL on its expiry attribute; safe to repeat.

        Waits up to ``wait_seconds`` (by the store's clock) for a new table to become ACTIVE.
        """
        try:
            await self._call("create_table", ddb.create_table_request(self.layout))
        except StoreUnavailable as error:
            if error.code != "ResourceInUseException":
                raise
        deadline = self._clock.now() + wait_seconds
        while not ddb.table_active(
            await self._call("describe_table", ddb.table_request(self.layout))
        ):
            if self._clock.now() > deadline:
                raise StoreUnavailable(f"table {self.layout.table_name} did not become ACTIVE")
            await self._clock.asleep(ddb.TABLE_POLL_SECONDS)
        described = await self._call("describe_time_to_live", ddb.table_request(self.layout))
        if not ddb.ttl_enabled(described, self.layout):
            try:
                await self._call("update_time_to_live", ddb.enable_ttl_request(self.layout))
            except StoreUnavailable as error:
                # Another replica enabled TTL between our describe and update: done.
                if error.code != "ValidationException":
                    raise
                described = await self._call(
                    "describe_time_to_live", ddb.table_request(self.layout)
                )
                if not ddb.ttl_enabled(described, self.layout):
                    raise

    # unasync: begin async-only
    async def create_table(self, *, wait_seconds: float = 60.0) -> None:
        """:meth:`acreate_table`, under the name ``await store.create_table()`` has always had."""
        await self.acreate_table(wait_seconds=wait_seconds)

    # unasync: end async-only
