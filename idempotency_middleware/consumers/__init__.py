"""Message consumers: ``IdempotentConsumer`` (the function door plus a verdict for the broker)
and the brokers' translations of that verdict: Lambda batches, the SQS worker, FastStream,
Celery."""

from __future__ import annotations

from .consumer import Action, IdempotentConsumer, Outcome, message_payload

__all__ = ["Action", "IdempotentConsumer", "Outcome", "message_payload"]
