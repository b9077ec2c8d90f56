"""Message consumers: ``IdempotentConsumer`` (the function door plus a verdict for the broker)
and the brokers' translations of that verdict: Lambda batches, the SQS worker, FastStream,
Celery."""

from __future__ import annotations

from .consumer import IdempotentConsumer, Outcome, Verdict, message_payload

__all__ = ["IdempotentConsumer", "Outcome", "Verdict", "message_payload"]
