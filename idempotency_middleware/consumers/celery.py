"""Celery: a task whose body runs once per key, however often Celery delivers it.

``idempotent_task(app, store=...)`` registers a function as a Celery task run by an
``IdempotentConsumer``, and words its verdict as Celery does: ``ack`` returns the result
(the handler's, or the replayed one), ``retry`` is ``task.retry(countdown=retry_after)``
(the same task id, delivered again later), ``dead`` raises ``Reject(requeue=False)`` after
``on_exhausted``, so with ``acks_late`` (the default here) RabbitMQ routes the message to the
queue's dead-letter exchange. The delivery count is the task's ``retries`` plus one.

Importing this module imports Celery; importing the package does not.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

try:
    from celery import Celery, Task
    from celery.exceptions import Reject
except ModuleNotFoundError as missing:  # tests/unit/test_missing_extras.py
    raise ModuleNotFoundError(
        "idempotency_middleware.celery needs celery, which is not installed: "
        'pip install "idempotency-middleware[celery]"',
        name="celery",
    ) from missing

from ..clock import SYSTEM_CLOCK, Clock
from ..events import OnEvent
from ..functions.attempts import is_coroutine_callable
from ..functions.options import CallableOptions
from ..functions.results import Serializer
from ..policy.options import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TTL_SECONDS,
    check_option_names,
)
from ..stores.encryption import Encryption
from ..stores.protocol import AsyncStore, SyncStore
from .consumer import IdempotentConsumer

KEY_HEADER = "Idempotency-Key"
"""The header a producer sets (``apply_async(headers={...})``) to name one logical
operation; the default ``key`` reads it first."""


@dataclass(frozen=True)
class TaskCall:
    """One delivery of a task, as ``key``, ``payload`` and ``on_exhausted`` see it: the task
    id, the call's arguments, and Celery's request (``headers``, ``retries``,
    ``delivery_info``...)."""

    id: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    request: Any

    @property
    def headers(self) -> Mapping[str, Any]:
        """The message's headers, those the producer set included."""
        headers = getattr(self.request, "headers", None)
        return headers if isinstance(headers, Mapping) else {}


def header_or_task_id(call: TaskCall) -> str:
    """The default key: the producer's ``Idempotency-Key`` header when it set one (one
    logical operation, however often it was sent), else the task id, which Celery keeps
    across retries and redeliveries (a producer may also choose it:
    ``apply_async(task_id=...)``)."""
    header = call.headers.get(KEY_HEADER) or getattr(call.request, KEY_HEADER, None)
    return str(header) if header else call.id


def call_arguments(call: TaskCall) -> Any:
    """The default payload: the task's arguments."""
    return {"args": list(call.args), "kwargs": dict(call.kwargs)}


TaskFunction = Callable[..., Any]


def idempotent_task(
    app: Celery,
    *,
    store: SyncStore | AsyncStore,
    key: Callable[[TaskCall], Any] | None = None,
    payload: Callable[[TaskCall], Any] | None = None,
    max_attempts: int | None = None,
    on_exhausted: Callable[[TaskCall, Exception], Any] | None = None,
    required: bool = True,
    ttl_seconds: float = DEFAULT_TTL_SECONDS,
    lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    wait_seconds: float = 0,
    serializer: Serializer | None = None,
    on_store_error: str = "fail",
    replay_cache_size: int = 0,
    on_event: OnEvent = None,
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
    encryption: Encryption | None = None,
    **task_options: Any,
) -> Callable[[TaskFunction], Task]:
    """Registers the decorated function (a plain function taking the task's arguments) as
    a task of ``app`` whose body runs once per key.

    ``key`` and ``payload`` take a ``TaskCall`` (defaults: ``header_or_task_id``,
    ``call_arguments``); the keys' namespace is the task's name. The other options are
    ``IdempotentConsumer``'s; the store must be sync. ``task_options`` go to ``app.task``
    (``name``, ``queue``, ``default_retry_delay``...), with ``acks_late=True`` and
    ``max_retries=None`` unless given: ``max_attempts`` bounds the retries. A task option
    that is no Celery one and looks like a misspelling of one of these is a ``TypeError``.
    """
    _check_task_options(app, task_options)
    if "bind" in task_options:
        raise TypeError(
            "idempotent_task binds the task itself: the function takes the task's arguments; "
            "what the request holds is in key's and payload's TaskCall"
        )
    options = CallableOptions(
        store=store,
        name=task_options.pop("name", None),  # a task option too: the task's name
        required=required,
        ttl_seconds=ttl_seconds,
        lock_timeout_seconds=lock_timeout_seconds,
        wait_seconds=wait_seconds,
        serializer=serializer,
        on_store_error=on_store_error,
        replay_cache_size=replay_cache_size,
        on_event=on_event,
        clock=clock,
        clock_skew_seconds=clock_skew_seconds,
        encryption=encryption,
    )
    task_options.setdefault("acks_late", True)
    task_options.setdefault("max_retries", None)
    message_key = key or header_or_task_id
    message_payload = payload or call_arguments
    if not callable(message_key) or not callable(message_payload):
        raise TypeError("key and payload must be callables taking a TaskCall")

    def register(function: TaskFunction) -> Task:
        if is_coroutine_callable(function):
            raise TypeError(
                f"{function.__qualname__} is a coroutine function: Celery runs plain "
                "functions; make it one (def, not async def)"
            )
        name = options.name or app.gen_task_name(function.__name__, function.__module__)
        consumer = IdempotentConsumer._of(
            lambda call: function(*call.args, **call.kwargs),
            options,
            key=message_key,
            payload=message_payload,
            max_attempts=max_attempts,
            on_exhausted=on_exhausted,
            name=name,
        )

        def run(task: Task, *args: Any, **kwargs: Any) -> Any:
            request = task.request
            call = TaskCall(str(request.id), args, kwargs, request)
            outcome = consumer.process(call, delivery_count=(request.retries or 0) + 1)
            if outcome.action == "ack":
                return outcome.result
            if outcome.action == "retry":
                # countdown None: the task's default_retry_delay, as any Celery retry.
                raise task.retry(exc=outcome.error, countdown=outcome.retry_after)
            raise Reject(outcome.error, requeue=False)

        # Celery names the task class and reads the docstring from the function it gets.
        run.__name__, run.__qualname__ = function.__name__, function.__qualname__
        run.__module__, run.__doc__ = function.__module__, function.__doc__
        task: Task = app.task(bind=True, name=name, **task_options)(run)
        task.consumer = consumer  # for forget(key) in a redrive
        return task

    return register


# What ``app.task`` takes besides a task class's attributes (celery.app.base, autoretry).
_CELERY_TASK_KEYWORDS = frozenset(
    {
        "base",
        "bind",
        "shared",
        "lazy",
        "filter",
        "pydantic",
        "pydantic_strict",
        "pydantic_context",
        "pydantic_dump_kwargs",
        "autoretry_for",
        "dont_autoretry_for",
        "retry_kwargs",
        "retry_backoff",
        "retry_backoff_max",
        "retry_jitter",
        "queue",
        "exchange",
        "routing_key",
    }
)
# How close an unknown name must be to one of idempotent_task's own to be taken for its
# misspelling ("encyrption") rather than a task attribute of the application's own.
_MISSPELLING_CUTOFF = 0.7


def _check_task_options(app: Celery, task_options: Mapping[str, Any]) -> None:
    """``TypeError`` for a task option that is none of Celery's and is close to one of
    ``idempotent_task``'s own: Celery sets any name it is given as a task attribute, so a
    misspelled ``encryption`` would otherwise be dropped silently. Other unknown names stay
    Celery's (a task attribute of the application's own, as ``app.task`` allows)."""
    ours = frozenset(inspect.signature(idempotent_task).parameters) - {"app", "task_options"}
    ours |= {"name"}  # a task option, and the keys' namespace
    misspelled = [
        given
        for given in task_options
        if given not in _CELERY_TASK_KEYWORDS
        and not hasattr(app.Task, given)
        and difflib.get_close_matches(given, ours, n=1, cutoff=_MISSPELLING_CUTOFF)
    ]
    check_option_names("idempotent_task()", misspelled, ours)


__all__ = [
    "KEY_HEADER",
    "TaskCall",
    "call_arguments",
    "header_or_task_id",
    "idempotent_task",
]
