"""The options every door that wraps a callable shares: one definition, validated once.

``idempotent``, ``IdempotentConsumer`` (and through it the Lambda batches and ``SQSWorker``),
Celery's ``idempotent_task`` and FastStream's middleware take the same options, with the
same defaults and meanings: the store, the keys' namespace, the attempt's timings, how a
result is stored, events, the clock and encryption. ``CallableOptions`` is that set. A door
builds one from what it was given (a ``TypeError`` or ``ValueError`` naming a bad option,
from here), reads it, and adds only its own options (a consumer's ``max_attempts``,
Celery's task options).

A door whose signature documents each option lists them, with ``CallableOptions``'
defaults, and passes them all on; ``tests/contract/test_door_options.py`` walks every door
over every option, so one a door leaves out fails there. A new door need not list them:
``**options: Unpack[CallableKeywords]`` and ``CallableOptions.from_keywords`` give it every
one, its misspellings refused by name.

Here rather than in ``policy/``: the serializer, its pickle warning and the store of either
flavour are the callable doors' alone, and every callable door builds on ``functions``
already. The part of these options an attempt reads is ``policy.options.Options``, the HTTP
doors' too, which this builds (``attempt_options``) and which validates that part.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from ..clock import SYSTEM_CLOCK, Clock
from ..events import OnEvent
from ..policy.options import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TTL_SECONDS,
    Options,
    check_option_names,
)
from ..stores.catalog import A_SYNC_STORE, AN_ASYNC_STORE
from ..stores.encryption import Encryption
from ..stores.protocol import AsyncStore, SyncStore
from .attempts import unpickles
from .results import Serializer

if TYPE_CHECKING:
    from typing_extensions import Unpack

# The package's modules: a warning about an option points past their frames, at the line
# that passed it, however deep in a door it was found.
_PACKAGE = __name__.partition(".")[0]


class CallableKeywords(TypedDict, total=False):
    """``CallableOptions`` but the store, as keyword arguments: what a door takes as
    ``**options: Unpack[CallableKeywords]`` and hands to ``CallableOptions.from_keywords``."""

    name: str | None
    required: bool
    ttl_seconds: float
    lock_timeout_seconds: float
    wait_seconds: float
    serializer: Serializer | None
    on_store_error: str
    replay_cache_size: int
    on_event: OnEvent
    clock: Clock
    clock_skew_seconds: float
    encryption: Encryption | None


@dataclass(frozen=True)
class CallableOptions:
    """The options a door wrapping a callable takes, validated.

    ``store`` (either flavour: the door checks it against its callable's); ``name`` the
    keys' namespace (``None``: the door derives one); ``required``: a call without a key
    raises (``False``: runs unprotected); ``serializer`` a ``(dumps, loads)`` pair for
    results that are not JSON values, dataclasses or Pydantic models. The others mean what
    the middlewares' options of the same name mean. ``attempt_options`` is what an attempt
    reads of them.
    """

    store: SyncStore | AsyncStore
    name: str | None = None
    required: bool = True
    ttl_seconds: float = DEFAULT_TTL_SECONDS
    lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    wait_seconds: float = 0
    serializer: Serializer | None = None
    on_store_error: str = "fail"
    replay_cache_size: int = 0
    on_event: OnEvent = None
    clock: Clock = SYSTEM_CLOCK
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    encryption: Encryption | None = None
    attempt_options: Options = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.store, (SyncStore, AsyncStore)):
            raise TypeError(f"store must be {A_SYNC_STORE} or {AN_ASYNC_STORE}, got {self.store!r}")
        if self.name is not None and not (isinstance(self.name, str) and self.name):
            raise TypeError(f"name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.required, bool):
            raise TypeError(f"required must be True or False, got {self.required!r}")
        serializer = self.serializer
        if serializer is not None and not (
            isinstance(serializer, tuple)
            and len(serializer) == 2
            and all(map(callable, serializer))
        ):
            raise TypeError(
                f"serializer must be a (dumps, loads) pair of callables, got {serializer!r}"
            )
        # The options an HTTP door shares are validated where the HTTP doors' are.
        attempt_options = Options.build(
            required=self.required,
            ttl_seconds=self.ttl_seconds,
            lock_timeout_seconds=self.lock_timeout_seconds,
            wait_seconds=self.wait_seconds,
            on_store_error=self.on_store_error,
            replay_cache_size=self.replay_cache_size,
            on_event=self.on_event,
            clock=self.clock,
            clock_skew_seconds=self.clock_skew_seconds,
            encryption=self.encryption,
        )
        object.__setattr__(self, "attempt_options", attempt_options)
        _warn_if_pickle(serializer, self.encryption)

    @classmethod
    def from_keywords(
        cls,
        door: str,
        *,
        store: SyncStore | AsyncStore,
        own: Collection[str] = (),
        **options: Unpack[CallableKeywords],
    ) -> CallableOptions:
        """The options of ``door``, which takes them as ``**options`` beside its ``own``
        (its other parameters): a name that is none of them is a ``TypeError`` listing them
        all and suggesting the closest."""
        check_option_names(door, options, {*OPTION_NAMES, *own})
        return cls(store=store, **options)


# Every option's name, the store's included.
OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(CallableOptions) if field.init)


def _warn_if_pickle(serializer: Serializer | None, encryption: Encryption | None) -> None:
    """Warn, once per door, about a ``serializer`` whose ``loads`` is ``pickle.loads``:
    whoever can write the store could run code at a replay. Not with ``encryption``: such a
    door reads back only the records it encrypted (authenticated), never a plain one."""
    if encryption is not None or not unpickles(serializer):
        return
    warnings.warn(
        "serializer loads with pickle: whoever can write to the idempotency store could "
        "run code when a result is replayed. Prefer JSON results (the default), or pass "
        "encryption=Encryption(...) so stored results are authenticated",
        UserWarning,
        stacklevel=_outside_the_package(),
    )


def _outside_the_package() -> int:
    """The ``stacklevel`` of the first caller outside this package, seen from the function
    that calls ``warnings.warn`` after calling this."""
    level = 2  # the caller of that function
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        f"{_PACKAGE}."
    ):
        frame = frame.f_back
        level += 1
    return level


__all__ = ["OPTION_NAMES", "CallableKeywords", "CallableOptions"]
