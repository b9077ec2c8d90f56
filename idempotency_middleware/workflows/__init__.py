"""Deferred keys finished by a workflow engine (AWS Step Functions): starting an execution
for the current request so that the work runs once even when its process dies
(``executions``), and the end of an execution that failed, timed out or was aborted
(``status_changes``). The public path is ``idempotency_middleware.step_functions``.

Neither runs inside the engine: ``start_execution`` is called by a handler (it reaches the
attempt through ``handler/``), ``handle_execution_status_change`` by a Lambda function
behind an EventBridge rule, with a store's deferral operations.
"""

from __future__ import annotations

from .executions import (
    TOKEN_FIELD,
    ExecutionConflictError,
    StartedExecution,
    astart_execution,
    execution_name,
    start_execution,
)
from .status_changes import UNFINISHED, StatusChangeOutcome, handle_execution_status_change

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
