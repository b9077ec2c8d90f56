"""``ThreadedStore``: the async half of a store whose sync half does blocking I/O, each
``a``-prefixed method running its sync twin on the store's threads (:class:`WorkerThreads`,
which also serve ``SQLiteStore``'s transport), so the event loop never waits on a disk, a
network or another process's lock."""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .encryption import Encryption
from .kit import UNUSED_KEY, ClosingStore, unusable
from .protocol import ClaimRequest, ClaimResult, Completion, HeaderPairs, StoreUnavailable
from .records import Record

T = TypeVar("T")


class WorkerThreads:
    """A store's threads (``size`` at most), started on first use, again in a forked child
    (a pool's threads do not survive ``fork()``), and after :meth:`close`."""

    def __init__(self, size: int, name_prefix: str) -> None:
        self._size = size
        self._name_prefix = name_prefix
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        executor = self._executor
        if executor is not None and self._pid == os.getpid():
            return executor
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._size, thread_name_prefix=self._name_prefix
                )
                self._pid = os.getpid()
            return self._executor

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool(), call, *args)

    def close(self) -> None:
        """Stop the threads after their current call (waiting for them)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=True)


class ThreadedStore(ClosingStore, abc.ABC):
    """Implement the sync store protocol and operator interface (``claim`` ... ``get``,
    ``delete``, ``create_table``); get their async forms and both context managers.

    ``check()`` reads an unused key, unless the subclass checks more. ``async_threads``
    bounds the threads running async calls. A subclass with resources of its own extends
    :meth:`close`, calling ``super().close()``.
    """

    def __init__(self, *, async_threads: int = 4, thread_name_prefix: str = "idempotency") -> None:
        if async_threads < 1:
            raise ValueError("async_threads must be positive")
        self._threads = WorkerThreads(async_threads, thread_name_prefix)

    # (What each must do: the protocols' docstrings, in protocol.py.)
    @abc.abstractmethod
    def claim(self, request: ClaimRequest) -> ClaimResult: ...

    @abc.abstractmethod
    def complete(self, completion: Completion) -> bool: ...

    @abc.abstractmethod
    def release(self, key_hash: str, owner: str) -> bool: ...

    @abc.abstractmethod
    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool: ...

    @abc.abstractmethod
    def get(self, key_hash: str) -> Record | None: ...

    @abc.abstractmethod
    def delete(self, key_hash: str) -> bool: ...

    @abc.abstractmethod
    def create_table(self) -> None: ...

    def check(self) -> None:
        """Whether the store answers a read; ``StoreUnavailableError`` saying why not."""
        try:
            self.get(UNUSED_KEY)
        except StoreUnavailable as error:
            raise unusable(self, error) from error

    def complete_deferred(
        self,
        token: str,
        status: int,
        headers: HeaderPairs = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool:
        """Overridden, with :meth:`release_deferred`, by a store that supports deferral."""
        raise NotImplementedError(f"{type(self).__name__} does not support deferred completion")

    def release_deferred(self, token: str) -> bool:
        raise NotImplementedError(f"{type(self).__name__} does not support deferred completion")

    async def _run_async(self, call: Callable[..., T], *args: Any) -> T:
        """How the async methods run their sync twins: on the store's threads. A store
        whose calls can run on the loop without waiting overrides this."""
        return await self._threads.run(call, *args)

    async def aclaim(self, request: ClaimRequest) -> ClaimResult:
        return await self._run_async(self.claim, request)

    async def acomplete(self, completion: Completion) -> bool:
        return await self._run_async(self.complete, completion)

    async def arelease(self, key_hash: str, owner: str) -> bool:
        return await self._run_async(self.release, key_hash, owner)

    async def arenew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        return await self._run_async(self.renew, key_hash, owner, lock_expires_at)

    async def acomplete_deferred(
        self,
        token: str,
        status: int,
        headers: HeaderPairs = (),
        body: bytes = b"",
        *,
        encryption: Encryption | None = None,
    ) -> bool:
        call = self.complete_deferred  # (a subclass's own may not take encryption)
        if encryption is not None:
            call = functools.partial(call, encryption=encryption)
        return await self._run_async(call, token, status, headers, body)

    async def arelease_deferred(self, token: str) -> bool:
        return await self._run_async(self.release_deferred, token)

    async def aget(self, key_hash: str) -> Record | None:
        return await self._run_async(self.get, key_hash)

    async def adelete(self, key_hash: str) -> bool:
        return await self._run_async(self.delete, key_hash)

    async def acreate_table(self) -> None:
        await self._threads.run(self.create_table)

    async def acheck(self) -> None:
        """:meth:`check`, off the event loop."""
        await self._threads.run(self.check)

    def close(self) -> None:
        """Stop the worker threads after their current call; using the store restarts them."""
        self._threads.close()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        # Not on the store's own pool: close() waits for that pool to shut down.
        await asyncio.to_thread(self.close)
