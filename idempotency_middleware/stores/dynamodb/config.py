"""The DynamoDB stores' configuration (:class:`DynamoDBConfig`). The lean transport's
(:class:`WireConfig`) is resolved once per store through botocore itself, so
``AWS_ENDPOINT_URL_DYNAMODB``, profiles, FIPS and dual-stack settings mean what they mean to
boto3; credentials come from botocore's chain, read per request (refreshing ones refresh)."""

from __future__ import annotations

import logging
import ssl
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Literal

from ...clock import Clock
from .wire import Endpoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OverflowSettings:
    """Where responses too large for a DynamoDB item go. Objects are not deleted when their
    record expires: give the bucket a lifecycle rule that expires the prefix after your
    longest TTL."""

    bucket: str
    prefix: str = "idempotency/"
    endpoint_url: str | None = None

    def object_key(self, key_hash: str, owner: str) -> str:
        """The S3 object key of ``owner``'s response for ``key_hash``."""
        return f"{self.prefix}{key_hash}/{owner}"


@dataclass(frozen=True)
class ClientSettings:
    """Connection settings. The defaults keep a claim bounded: an unreachable endpoint
    answers 503 within about ``(connect_timeout or read_timeout) * max_attempts`` plus
    backoff, not after botocore's default of a minute per attempt."""

    endpoint_url: str | None = None
    region_name: str | None = None
    connect_timeout: float = 1.0
    read_timeout: float = 2.0
    max_attempts: int = 2
    max_pool_connections: int = 50

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValueError(f"max_attempts must be an integer, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")

    def botocore_config(self) -> Any:
        from botocore.config import Config

        return Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            # total_max_attempts counts the first try; botocore's "max_attempts" key does not.
            retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
            max_pool_connections=self.max_pool_connections,
        )

    def client_arguments(
        self, extra: dict[str, Any], s3: OverflowSettings | None = None
    ) -> dict[str, Any]:
        """An SDK client's arguments: the DynamoDB client's, or the ``s3`` bucket's client's."""
        endpoint_url = self.endpoint_url if s3 is None else s3.endpoint_url
        arguments: dict[str, Any] = {"config": self.botocore_config()}
        if endpoint_url is not None:
            arguments["endpoint_url"] = endpoint_url
        if self.region_name is not None:
            arguments["region_name"] = self.region_name
        return {**arguments, **extra}


# What carries a store's request-path calls (see ``DynamoDBStoreBase``).
Transport = Literal["auto", "lean", "sdk"]
TRANSPORTS: tuple[Transport, ...] = ("auto", "lean", "sdk")


def lean_transport(transport: str, session: Any, client_kwargs: dict[str, Any] | None) -> bool:
    """Whether a store's request path goes through the lean transport (see
    ``DynamoDBStoreBase``); a ``ValueError`` for an unknown or contradictory choice."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    customised = session is not None or bool(client_kwargs)
    if transport == "lean" and customised:
        raise ValueError(
            'transport="lean" cannot honour a session or client_kwargs: '
            'leave transport="auto" (the SDK carries them) or drop them'
        )
    return transport == "lean" or (transport == "auto" and not customised)


# Placeholder credentials for the resolving client: with them botocore does not walk the
# credential chain (which may reach the instance metadata service) just to name an endpoint.
_RESOLVING = {"aws_access_key_id": "resolving", "aws_secret_access_key": "resolving"}


@dataclass(frozen=True)
class WireConfig:
    """Everything a lean client needs besides credentials."""

    endpoint: Endpoint
    region: str
    connect_timeout: float
    read_timeout: float
    max_attempts: int
    max_pool_connections: int
    ssl_context: ssl.SSLContext | None


def resolve(settings: ClientSettings, session: Any) -> WireConfig | None:
    """The lean transport's configuration under ``settings`` and the botocore ``session``,
    or ``None`` when it cannot carry it (a proxy applies to the endpoint: only the SDK
    speaks to proxies). Raises botocore's ``NoRegionError`` as client creation does."""
    region = settings.region_name or session.get_config_variable("region")
    if settings.endpoint_url is not None and region:
        url = settings.endpoint_url
    else:
        client = session.create_client(
            "dynamodb",
            region_name=region,
            endpoint_url=settings.endpoint_url,
            config=settings.botocore_config(),
            **_RESOLVING,
        )
        try:
            url, region = client.meta.endpoint_url, client.meta.region_name
        finally:
            client.close()
    endpoint = Endpoint.parse(url)
    proxy = urllib.request.getproxies().get("https" if endpoint.secure else "http")
    if proxy and not urllib.request.proxy_bypass(endpoint.host):
        logger.info("a proxy applies to %s: DynamoDB calls go through the SDK", url)
        return None
    context = None
    if endpoint.secure:
        from botocore.httpsession import get_cert_path

        bundle = session.get_config_variable("ca_bundle") or get_cert_path(True)
        context = ssl.create_default_context(cafile=bundle)
    limits = (settings.connect_timeout, settings.read_timeout, settings.max_attempts)
    return WireConfig(endpoint, str(region), *limits, settings.max_pool_connections, context)


@dataclass(frozen=True)
class DynamoDBConfig:
    """What a store's transport needs (``table_name`` for error messages)."""

    table_name: str
    settings: ClientSettings
    overflow: OverflowSettings | None
    clock: Clock
    lean: bool
    session: Any = None
    client_kwargs: dict[str, Any] = field(default_factory=dict)
