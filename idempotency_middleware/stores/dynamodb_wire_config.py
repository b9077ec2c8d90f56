"""What the lean DynamoDB transport resolves once per store: endpoint, region, TLS, limits.

Resolution goes through botocore itself (a throwaway client's ``meta.endpoint_url`` and
``meta.region_name``), so ``AWS_ENDPOINT_URL_DYNAMODB``, profiles, FIPS and dual-stack settings
mean what they mean to boto3. Credentials come from botocore's chain (``dynamodb_wire_sync``,
``dynamodb_wire_async``) and are read per request, so refreshing ones refresh.
"""

from __future__ import annotations

import logging
import ssl
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .dynamodb_wire import Endpoint

if TYPE_CHECKING:
    from .dynamodb import ClientSettings

logger = logging.getLogger(__name__)

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

    @property
    def endpoint_url(self) -> str:
        """The URL requests go to, as botocore's exceptions name it."""
        return self.endpoint.request_url


def _proxied(endpoint: Endpoint) -> bool:
    scheme = "https" if endpoint.secure else "http"
    proxies = urllib.request.getproxies()
    return bool(proxies.get(scheme)) and not urllib.request.proxy_bypass(endpoint.host)


def _ssl_context(session: Any) -> ssl.SSLContext:
    from botocore.httpsession import get_cert_path

    bundle = session.get_config_variable("ca_bundle") or get_cert_path(True)
    return ssl.create_default_context(cafile=bundle)


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
    if _proxied(endpoint):
        logger.info("a proxy applies to %s: DynamoDB calls go through the SDK", url)
        return None
    return WireConfig(
        endpoint,
        str(region),
        settings.connect_timeout,
        settings.read_timeout,
        settings.max_attempts,
        settings.max_pool_connections,
        _ssl_context(session) if endpoint.secure else None,
    )
