"""Counting a live (streamed) response as it goes out, for the doors whose stream outlives
the handler's call (WSGI, Django): the attempt finishes when the stream does. (An ASGI
stream ends within the app's call: its capture counts it.)

``finish(size, failed)`` is called exactly once: at the end of the stream (failed when it
did not send the body its headers declared), when it fails midway, or when the server
closes it early, a client gone, which counts as done: the handler started a success.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator

from ..engine.setup import FinishStream


def _whole(size: int) -> bool:
    return True


class _Counted:
    """The count of one live body and its ``finish``, called once."""

    def __init__(self, finish: FinishStream, complete: Callable[[int], bool]) -> None:
        self._finish: FinishStream | None = finish
        # Whether a stream that ran to its end sent the body its headers declared.
        self._complete = complete
        self.size = 0

    def end(self, failed: bool) -> None:
        finish, self._finish = self._finish, None
        if finish is not None:
            finish(self.size, failed)


class LiveBody(_Counted):
    """A live body's chunks (after ``prefix``, what the app had already given), passed
    through and counted. ``close()`` closes the chunks too when ``closes_chunks`` (a WSGI
    server closes only the iterable it was given; Django closes the app's own as well)."""

    def __init__(
        self,
        prefix: bytes,
        chunks: Iterable[bytes],
        finish: FinishStream,
        complete: Callable[[int], bool] = _whole,
        *,
        closes_chunks: bool = True,
    ) -> None:
        super().__init__(finish, complete)
        self._prefix = prefix
        self._chunks = chunks
        self._closes_chunks = closes_chunks

    def __iter__(self) -> Iterator[bytes]:
        failed = False
        try:
            if self._prefix:
                self.size += len(self._prefix)
                yield self._prefix
            for chunk in self._chunks:
                self.size += len(chunk)
                yield chunk
            failed = not self._complete(self.size)
        except Exception:
            failed = True
            raise
        finally:
            self.end(failed)

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None) if self._closes_chunks else None
            if close is not None:
                close()
        finally:
            self.end(failed=False)


class AsyncLiveBody(_Counted):
    """``LiveBody`` of an async stream (Django's async streaming responses), its ``finish``
    (a sync store's completion or release) called off the event loop."""

    def __init__(
        self,
        chunks: AsyncIterable[bytes],
        finish: FinishStream,
        complete: Callable[[int], bool] = _whole,
    ) -> None:
        super().__init__(finish, complete)
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        failed = False
        try:
            async for chunk in self._chunks:
                self.size += len(chunk)
                yield chunk
            failed = not self._complete(self.size)
        except Exception:
            failed = True
            raise
        finally:
            await asyncio.to_thread(self.end, failed)

    def close(self) -> None:
        self.end(failed=False)
