"""``web.live_body``: a live response counted as it goes out (the WSGI and Django doors).

Its ``finish(size, failed)`` is called exactly once: at the end (failed when the body is not
the one its headers declared), when the stream fails, or when it is closed early (done).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from idempotency_middleware.web.capture import is_complete
from idempotency_middleware.web.live_body import AsyncLiveBody, LiveBody


class Finishes:
    """A ``finish`` that records its calls and the thread each came from."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, size: int, failed: bool) -> None:
        self.calls.append((size, failed))
        self.threads.append(threading.current_thread())


class Chunks:
    """An app's iterable that says whether it was closed."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = chunks
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)

    def close(self) -> None:
        self.closed = True


def test_a_live_body_passes_its_prefix_and_chunks_through_and_finishes_at_its_end() -> None:
    finish = Finishes()
    body = LiveBody(b"ab", [b"cd", b"e"], finish)
    assert list(body) == [b"ab", b"cd", b"e"]
    assert finish.calls == [(5, False)]


def test_a_live_body_shorter_than_it_declared_finishes_failed() -> None:
    finish = Finishes()
    body = LiveBody(b"", [b"abc"], finish, lambda size: is_complete(200, 10, size))
    assert list(body) == [b"abc"]
    assert finish.calls == [(3, True)]


def test_a_live_body_whose_chunks_raise_finishes_failed_and_raises_on() -> None:
    def failing() -> Iterator[bytes]:
        yield b"abc"
        raise RuntimeError("the stream broke")

    finish = Finishes()
    body = LiveBody(b"", failing(), finish)
    with pytest.raises(RuntimeError, match="the stream broke"):
        list(body)
    assert finish.calls == [(3, True)]


def test_a_live_body_closed_early_finishes_as_done_and_closes_its_chunks() -> None:
    finish = Finishes()
    chunks = Chunks(b"abc", b"def")
    body = LiveBody(b"", chunks, finish)
    sent = iter(body)
    assert next(sent) == b"abc"
    body.close()
    assert chunks.closed
    assert finish.calls == [(3, False)]


def test_a_live_body_that_does_not_own_its_chunks_leaves_them_open_when_closed() -> None:
    finish = Finishes()
    chunks = Chunks(b"abc")
    body = LiveBody(b"", chunks, finish, closes_chunks=False)
    body.close()
    assert not chunks.closed
    assert finish.calls == [(0, False)]


def test_a_live_body_finishes_once_whatever_ends_it_first() -> None:
    finish = Finishes()
    body = LiveBody(b"", [b"abc"], finish)
    assert list(body) == [b"abc"]
    body.close()
    body.close()
    assert finish.calls == [(3, False)]


async def chunks_of(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        await asyncio.sleep(0)
        yield chunk


async def test_an_async_live_body_finishes_at_its_end_off_the_event_loop() -> None:
    finish = Finishes()
    body = AsyncLiveBody(chunks_of(b"ab", b"cde"), finish)
    assert [chunk async for chunk in body] == [b"ab", b"cde"]
    assert finish.calls == [(5, False)]
    # Finishing calls a sync store: never on the loop's own thread.
    assert finish.threads != [threading.current_thread()]


async def test_an_async_live_body_longer_than_it_declared_finishes_failed() -> None:
    finish = Finishes()
    body = AsyncLiveBody(chunks_of(b"abcdef"), finish, lambda size: is_complete(200, 4, size))
    assert [chunk async for chunk in body] == [b"abcdef"]
    assert finish.calls == [(6, True)]


async def test_an_async_live_body_whose_chunks_raise_finishes_failed() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"ab"
        raise RuntimeError("the stream broke")

    finish = Finishes()
    body = AsyncLiveBody(failing(), finish)
    with pytest.raises(RuntimeError, match="the stream broke"):
        async for _ in body:
            pass
    assert finish.calls == [(2, True)]


async def test_an_async_live_body_closed_before_it_ended_finishes_as_done() -> None:
    finish = Finishes()
    body = AsyncLiveBody(chunks_of(b"ab", b"cde"), finish)
    body.close()
    assert finish.calls == [(0, False)]
