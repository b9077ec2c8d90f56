"""The Celery door: ``idempotent_task`` and its key and payload readers.

The public path of :mod:`idempotency_middleware.consumers.celery`; import from here.
"""

from __future__ import annotations

from .consumers.celery import (
    KEY_HEADER,
    TaskCall,
    call_arguments,
    header_or_task_id,
    idempotent_task,
)

__all__ = [
    "KEY_HEADER",
    "TaskCall",
    "call_arguments",
    "header_or_task_id",
    "idempotent_task",
]
