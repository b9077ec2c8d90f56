"""``DynamoDBStore`` (boto3, for the WSGI middleware) and ``AsyncDynamoDBStore`` (aioboto3,
for the ASGI middleware): the kit's store over the flows of ``ops.py`` and a transport."""

from __future__ import annotations

import shlex
from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...events import OnEvent
from ..breaker import DEFAULT_COOLDOWN_SECONDS, DEFAULT_THRESHOLD
from ..kit import KitStore, require_modules
from .config import ClientSettings, DynamoDBConfig, OverflowSettings, Transport, lean_transport
from .ops import DynamoDBOps
from .requests import TableLayout
from .transport import AsyncTransport, SyncTransport


class DynamoDBStoreBase(KitStore):
    """What both DynamoDB stores share: everything but the transport (httpx's
    ``Client``/``AsyncClient`` idea). ``transport``: ``"lean"`` (the package's own client
    for the request path), ``"sdk"``, or ``"auto"`` (lean unless a ``session``,
    ``client_kwargs`` or a proxy needs the SDK): see the DynamoDB page of the documentation.
    """

    kind = "dynamodb"  # in metrics and traces (``idempotency.store``)

    # The client libraries a flavour needs, the extra that installs them, its transport.
    _libraries: tuple[str, ...] = ()
    _extra = ""
    _transport_class: type[SyncTransport] | type[AsyncTransport]
    _ops: DynamoDBOps

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
        s3_bucket: str | None = None,
        s3_prefix: str = "idempotency/",
        s3_endpoint_url: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        breaker_threshold: int = DEFAULT_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        on_event: OnEvent = None,
        transport: Transport = "auto",
    ) -> None:
        require_modules(type(self).__name__, self._libraries, self._extra)
        limits = (connect_timeout, read_timeout, max_attempts, max_pool_connections)
        settings = ClientSettings(endpoint_url, region_name, *limits)
        overflow = OverflowSettings(s3_bucket, s3_prefix, s3_endpoint_url) if s3_bucket else None
        lean = lean_transport(transport, session, client_kwargs)
        config = DynamoDBConfig(
            table_name, settings, overflow, clock, lean, session, dict(client_kwargs or {})
        )
        self.layout = TableLayout(table_name, key_attribute, ttl_attribute)
        self._settings, self._overflow, self._session = settings, overflow, session
        breaker = (clock, breaker_threshold, breaker_cooldown_seconds)
        super().__init__(
            DynamoDBOps(self.layout, overflow, clock),
            self._transport_class(config),
            *breaker,
            on_event,
        )

    def fix_for(self, cause: str) -> str:
        """The kit's advice, naming this store's table, region and endpoint: the command
        that creates the table this store reads, not one of the command line's choosing."""
        if cause in ("no_table", "bad_schema"):
            command = self.create_table_command()
            how = f"store.create_table(), or `{command}`" if command else "store.create_table()"
            if cause == "no_table":
                return f"create it: {how}"
            return (
                f"point the store at a table made by its create_table(), or recreate it: "
                f"delete table {self.layout.table_name!r}, then {how}"
            )
        if cause == "no_bucket" and self._overflow is not None:
            return f"create the S3 bucket {self._overflow.bucket!r}, or fix s3_bucket"
        return super().fix_for(cause)

    def create_table_command(self) -> str | None:
        """The ``idempotency-middleware create-table`` command line that creates this
        store's table where this store looks for it (its region and endpoint); ``None``
        for a store whose ``key_attribute`` or ``ttl_attribute`` is not the command's
        (``pk``, ``ttl``): its own ``create_table()`` makes that table."""
        if (self.layout.key_attribute, self.layout.ttl_attribute) != ("pk", "ttl"):
            return None
        command = ["idempotency-middleware", "create-table", "--table", self.layout.table_name]
        region = self._region()
        if region:
            command += ["--region", region]
        if self._settings.endpoint_url:
            command += ["--endpoint-url", self._settings.endpoint_url]
        return shlex.join(command)

    def _region(self) -> str | None:
        """The region the store's client uses: the one it was given, else its session's
        (boto3's and aioboto3's sessions have ``region_name``), else the AWS configuration's
        as botocore reads it; ``None`` when there is none."""
        if self._settings.region_name:
            return self._settings.region_name
        if self._session is not None:
            return getattr(self._session, "region_name", None) or None
        import botocore.session

        region = botocore.session.get_session().get_config_variable("region")
        return str(region) if region else None


class DynamoDBStore(DynamoDBStoreBase):
    """DynamoDB store on boto3, for the WSGI middleware (the request path on the lean
    transport by default: see ``transport``).

    ``store.close()`` or ``with store:`` releases its connections.
    The operator interface: ``store.create_table()``, ``check``, ``get``, ``delete``.
    """

    _libraries = ("boto3", "botocore")
    _extra = "boto3"
    _transport_class = SyncTransport
    _transport: SyncTransport
    # Sync only, as boto3 is: the ASGI middleware (and the async protocols) refuse it.
    aclaim = acomplete = arelease = arenew = None  # type: ignore[assignment]
    acomplete_deferred = arelease_deferred = None  # type: ignore[assignment]
    aget = adelete = acreate_table = acheck = None  # type: ignore[assignment]

    @property
    def client(self) -> Any:
        """The request path's DynamoDB client (the lean transport's, or boto3's), created
        once; both take ``put_item``, ``update_item``, ``delete_item``, ``get_item`` and
        ``transact_write_items`` as boto3 does."""
        return self._transport.dynamodb()

    def warm_up(self) -> None:
        """Create the client now, so the first claim does not pay for it out of its lease.
        Call it in each worker process after it starts (post-fork), not before forking."""
        self._transport.dynamodb()

    def create_table(self, *, wait_seconds: float = 60.0) -> None:
        """Create the table (on-demand) with TTL on its expiry attribute; safe to repeat.
        Waits up to ``wait_seconds`` (by the store's clock) for a new table to become ACTIVE."""
        self.run_flow("create_table", self._ops.create_table(wait_seconds))


class AsyncDynamoDBStore(DynamoDBStoreBase):
    """DynamoDB store on aioboto3, for the ASGI middleware (the request path on the lean
    transport by default: see ``transport``).

    An aiobotocore client only works on the event loop it was made on: the store keeps one
    set of clients per loop that uses it, closed when ``asyncio.run`` ends the loop.
    ``await store.aclose()`` or ``async with store:`` releases the running loop's.
    The operator interface: ``await store.acreate_table()``, ``acheck``, ``aget``, ``adelete``.
    """

    _libraries = ("aioboto3", "aiobotocore")
    _extra = "dynamodb"
    _transport_class = AsyncTransport
    _transport: AsyncTransport
    # Async only, as aioboto3 is: the WSGI middleware (and the sync protocols) refuse it.
    claim = complete = release = renew = None  # type: ignore[assignment]
    complete_deferred = release_deferred = get = delete = check = None  # type: ignore[assignment]

    async def client(self) -> Any:
        """The request path's DynamoDB client of the running event loop (the lean
        transport's, or aioboto3's), made on first use; both take ``put_item``,
        ``update_item``, ``delete_item``, ``get_item`` and ``transact_write_items`` as
        aioboto3's does (a lean client passes other calls to an aioboto3 client)."""
        return await self._transport.client()

    async def awarm_up(self) -> None:
        """Create the client now (it takes a second or more on a loaded machine), so the
        first claim does not pay for it out of its lease. ``IdempotencyMiddleware`` calls
        this at ASGI lifespan start-up, on the loop that serves requests."""
        await self._transport.client()

    async def acreate_table(self, *, wait_seconds: float = 60.0) -> None:
        """:meth:`DynamoDBStore.create_table`, awaited."""
        await self.arun_flow("create_table", self._ops.create_table(wait_seconds))

    async def create_table(self, *, wait_seconds: float = 60.0) -> None:  # type: ignore[override]
        """:meth:`acreate_table`, under the name ``await store.create_table()`` has always had."""
        await self.acreate_table(wait_seconds=wait_seconds)
