"""``with store:`` and ``async with store:`` for a store that has ``close`` and ``aclose``."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

Self = TypeVar("Self", bound="ClosingStore")


class ClosingStore:
    """Both context managers, closing the store on exit: ``close()`` after ``with``,
    ``await aclose()`` after ``async with``. A subclass defines the two methods."""

    def close(self) -> None:  # pragma: no cover - every store defines its own
        raise NotImplementedError

    async def aclose(self) -> None:  # pragma: no cover - every store defines its own
        raise NotImplementedError

    def __enter__(self: Self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self: Self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
