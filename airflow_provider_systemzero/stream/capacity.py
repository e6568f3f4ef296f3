"""The process-wide stream cap (the reconnect backoff lives in the core, re-exported here).

The public document limits a client process to ``max_streams_per_process`` open streams (4).
A triggerer runs many triggers in one process and one event loop, and a worker may run sync
decides on helper threads with their own loops, so :class:`StreamCapacity` is thread-safe and
loop-agnostic: waiters queue in FIFO order, each woken on its own loop, and a waiter that is
cancelled leaves the queue (or hands a slot it was just granted to the next waiter).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.protocol.reconnect import Backoff

__all__ = ["Backoff", "StreamCapacity", "default_capacity"]


class _Waiter:
    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.granted = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class StreamCapacity:
    """A fair (FIFO), cancellable counting semaphore shared by every stream of a process.

    :param limit: how many streams may be open at once (at least 1).
    """

    def __init__(self, limit: int = Limits().max_streams_per_process) -> None:
        self._lock = threading.Lock()
        self._limit = self._check(limit)
        self._in_use = 0
        self._max_in_use = 0
        self._waiters: deque[_Waiter] = deque()

    @staticmethod
    def _check(limit: int) -> int:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"the stream limit must be a positive integer, got {limit!r}")
        return limit

    @property
    def limit(self) -> int:
        """How many streams may be open at once."""
        return self._limit

    @property
    def in_use(self) -> int:
        """Slots currently held."""
        return self._in_use

    @property
    def max_in_use(self) -> int:
        """The most slots ever held at once (since the last :meth:`set_limit`)."""
        return self._max_in_use

    @property
    def waiting(self) -> int:
        """Waiters queued for a slot."""
        return len(self._waiters)

    def set_limit(self, limit: int) -> None:
        """Change the limit (tests; a deployment that knows better); queued waiters may proceed.

        :param limit: the new limit (at least 1).
        """
        with self._lock:
            self._limit = self._check(limit)
            self._max_in_use = self._in_use
            self._grant_locked()

    def adopt_advertised(self, limit: int) -> None:
        """Lower the limit to what a gateway advertised in ``hello`` (never raises it).

        :param limit: ``hello.limits.max_streams_per_process``.
        """
        if isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit < self._limit:
            with self._lock:
                if limit < self._limit:
                    self._limit = limit

    async def acquire(self) -> None:
        """Wait for a slot, first come first served.

        Cancelling the waiting task removes it from the queue; a slot granted at the moment of
        cancellation is passed on, never lost.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._in_use < self._limit and not self._waiters:
                self._take_locked()
                return
            waiter = _Waiter(loop)
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._waiters.remove(waiter)
            if granted:
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back; the oldest waiter gets it."""
        with self._lock:
            if self._in_use <= 0:
                raise RuntimeError("StreamCapacity.release() without a matching acquire()")
            self._in_use -= 1
            self._grant_locked()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """``async with capacity.slot():`` holds one slot for the block."""
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    def _take_locked(self) -> None:
        self._in_use += 1
        self._max_in_use = max(self._max_in_use, self._in_use)

    def _grant_locked(self) -> None:
        while self._waiters and self._in_use < self._limit:
            waiter = self._waiters.popleft()
            waiter.granted = True
            self._take_locked()
            try:
                waiter.loop.call_soon_threadsafe(_wake, waiter.future)
            except RuntimeError:  # the waiter's loop is closed: it will never take the slot
                waiter.granted = False
                self._in_use -= 1


_DEFAULT = StreamCapacity()


def default_capacity() -> StreamCapacity:
    """The process-wide :class:`StreamCapacity` every stream uses unless given another."""
    return _DEFAULT
