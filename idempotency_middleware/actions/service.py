"""``OneTimeActions``: create, consume, cancel and read one-time actions on a store.

Each method runs its flow (``flows.py``) against the store's backend (``backends.py``): the
sync methods on a sync store, the ``a``-prefixed ones on an async store; MemoryStore,
SQLiteStore, RedisStore and PostgresStore offer both.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime
from typing import Any, TypeVar, cast

from ..clock import SYSTEM_CLOCK, Clock
from . import flows
from .backends import AsyncBackend, SyncBackend, backend_for
from .flows import StepFlow
from .model import DEFAULT_RETENTION_SECONDS, Action
from .steps import Step, Written

T = TypeVar("T")


class OneTimeActions:
    """Actions that can be consumed exactly once, kept in ``store`` (a ``MemoryStore``,
    ``SQLiteStore``, ``DynamoDBStore``, ``AsyncDynamoDBStore``, ``RedisStore`` or
    ``PostgresStore``; ``TypeError`` for another).

    A consume is one conditional write whose failure says why it failed; a wrong PIN costs
    one more (spending an attempt). Time is the store's clock (its ``clock=`` option).
    A consumed, canceled or expired action is still answered for ``retention_seconds`` after
    its expiry (7 days by default), then forgotten: ``get`` returns ``None`` and its id may
    be used again.
    """

    def __init__(
        self, store: object, *, retention_seconds: float = DEFAULT_RETENTION_SECONDS
    ) -> None:
        if (
            isinstance(retention_seconds, bool)
            or not isinstance(retention_seconds, (int, float))
            or not 0 <= retention_seconds < math.inf
        ):
            raise ValueError(
                "retention_seconds must be a non-negative, finite number of seconds, "
                f"got {retention_seconds!r}"
            )
        self._sync, self._async = backend_for(store)
        self._store_name = type(store).__name__
        clock: Clock = getattr(store, "clock", SYSTEM_CLOCK)
        self._clock = clock
        self.retention_seconds = float(retention_seconds)

    def __repr__(self) -> str:
        return f"OneTimeActions({self._store_name})"

    # -- sync stores ----------------------------------------------------------------------

    def create(
        self,
        *,
        expires_in: float,
        active_at: datetime | None = None,
        pin: str | None = None,
        max_pin_attempts: int = 5,
        data: Any = None,
        action_id: str | None = None,
    ) -> Action:
        """Create an action that expires ``expires_in`` seconds from now, consumable from
        ``active_at`` (an aware datetime; default now), guarded by ``pin`` (at most
        ``max_pin_attempts`` wrong ones), carrying ``data`` (any JSON value). A random
        URL-safe id unless ``action_id`` is given; ``ActionExistsError`` if it is taken."""
        return self._run(
            self._create(expires_in, active_at, pin, max_pin_attempts, data, action_id)
        )

    def consume(
        self, action_id: str, *, pin: str | None = None, reason: str | None = None
    ) -> Action:
        """Consume the action: exactly one caller ever gets the consumed ``Action``; the
        others get an ``ActionError`` saying why (already used, expired, canceled, not
        active yet, wrong or missing PIN, locked, not found)."""
        return self._run(flows.consume(action_id, self._now(), pin=pin, reason=reason))

    def cancel(self, action_id: str) -> Action:
        """Cancel a pending or active action; the canceled ``Action``. Canceling it again
        returns it unchanged; a consumed one raises ``ActionAlreadyUsedError``, an expired
        one ``ActionExpiredError``."""
        return self._run(flows.cancel(action_id, self._now()))

    def get(self, action_id: str) -> Action | None:
        """The action as it stands, or ``None``."""
        return self._run(flows.get(action_id, self._now()))

    # -- async stores ---------------------------------------------------------------------

    async def acreate(
        self,
        *,
        expires_in: float,
        active_at: datetime | None = None,
        pin: str | None = None,
        max_pin_attempts: int = 5,
        data: Any = None,
        action_id: str | None = None,
    ) -> Action:
        """:meth:`create` on an async store."""
        return await self._arun(
            self._create(expires_in, active_at, pin, max_pin_attempts, data, action_id),
            hashes=pin is not None,
        )

    async def aconsume(
        self, action_id: str, *, pin: str | None = None, reason: str | None = None
    ) -> Action:
        """:meth:`consume` on an async store."""
        return await self._arun(
            flows.consume(action_id, self._now(), pin=pin, reason=reason), hashes=pin is not None
        )

    async def acancel(self, action_id: str) -> Action:
        """:meth:`cancel` on an async store."""
        return await self._arun(flows.cancel(action_id, self._now()))

    async def aget(self, action_id: str) -> Action | None:
        """:meth:`get` on an async store."""
        return await self._arun(flows.get(action_id, self._now()))

    # -- running flows --------------------------------------------------------------------

    def _now(self) -> float:
        # Whole microseconds: what every store keeps (DynamoDB numbers are written with six
        # decimals), so a time read back compares equal to the one written.
        return round(self._clock.now(), 6)

    def _create(
        self,
        expires_in: object,
        active_at: object,
        pin: object,
        max_pin_attempts: object,
        data: object,
        action_id: object,
    ) -> StepFlow[Action]:
        return flows.create(
            self._now(),
            self.retention_seconds,
            expires_in=expires_in,
            active_at=active_at,
            pin=pin,
            max_pin_attempts=max_pin_attempts,
            data=data,
            action_id=action_id,
        )

    def _run(self, flow: StepFlow[T]) -> T:
        backend: SyncBackend | None = self._sync
        if backend is None:
            flow.close()
            raise TypeError(
                f"{self._store_name} is an async store: use the a-prefixed methods "
                "(await actions.aconsume(...))"
            )
        sent: Written | None = None
        while True:
            finished, value = _advance(flow, sent)
            if finished:
                return cast(T, value)
            sent = backend.write(cast(Step, value))

    async def _arun(self, flow: StepFlow[T], *, hashes: bool = False) -> T:
        backend: AsyncBackend | None = self._async
        if backend is None:
            flow.close()
            raise TypeError(
                f"{self._store_name} is a sync store: use the methods without the a prefix "
                "(actions.consume(...))"
            )
        sent: Written | None = None
        while True:
            # A PIN is hashed with scrypt (tens of milliseconds of CPU) inside the flow:
            # then the flow runs on the loop's executor, never on the event loop itself.
            if hashes:
                finished, value = await asyncio.to_thread(_advance, flow, sent)
            else:
                finished, value = _advance(flow, sent)
            if finished:
                return cast(T, value)
            sent = await backend.awrite(cast(Step, value))


def _advance(flow: StepFlow[T], sent: Written | None) -> tuple[bool, object]:
    """The flow's next step (``(False, step)``) or its result (``(True, result)``).
    (A flow's end is returned, not raised: a StopIteration cannot cross a Future.)"""
    try:
        return False, (next(flow) if sent is None else flow.send(sent))
    except StopIteration as done:
        return True, done.value
