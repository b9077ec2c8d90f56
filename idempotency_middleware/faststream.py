"""The FastStream door: ``IdempotencyFastStreamMiddleware`` and its key and payload readers.

The public path of :mod:`idempotency_middleware.consumers.faststream`; import from here.
"""

from __future__ import annotations

from .consumers.faststream import (
    KEY_HEADER,
    IdempotencyFastStreamMiddleware,
    broker_delivery_count,
    header_or_message_id,
    message_body,
    message_id,
    subscriber_name,
)

__all__ = [
    "KEY_HEADER",
    "IdempotencyFastStreamMiddleware",
    "broker_delivery_count",
    "header_or_message_id",
    "message_body",
    "message_id",
    "subscriber_name",
]
