"""AWS Step Functions end to end for deferred keys: start the execution that does a
request's work (so that it runs once even when its process dies), and finish the key of an
execution that failed, timed out or was aborted.

The public path of :mod:`idempotency_middleware.workflows`; import from here.
"""

from __future__ import annotations

from .workflows import (
    TOKEN_FIELD,
    UNFINISHED,
    ExecutionConflictError,
    StartedExecution,
    StatusChangeOutcome,
    astart_execution,
    execution_name,
    handle_execution_status_change,
    start_execution,
)

__all__ = [
    "TOKEN_FIELD",
    "UNFINISHED",
    "ExecutionConflictError",
    "StartedExecution",
    "StatusChangeOutcome",
    "astart_execution",
    "execution_name",
    "handle_execution_status_change",
    "start_execution",
]
