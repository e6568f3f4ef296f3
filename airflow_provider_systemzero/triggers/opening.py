"""How many streams of a connection a loop's triggers build and open at once (:class:`Opening`).

A trigger whose source changed builds its stream only once it is let in; see :class:`Opening`
for why (the allocator's pools after a crowd of triggers wakes together).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque

__all__ = ["OPENINGS", "Opening"]

log = logging.getLogger("airflow_provider_systemzero.triggers.streaming")  # the triggers' stream log


class Opening:
    """The streams of one connection that a loop's triggers are building and opening now.

    A trigger whose source changed builds its stream only once it is *let in* (at most twice
    ``max_streams_per_process`` of them at once, first come first served); the others wait on
    one future each. A stream waiting for a slot of ``max_streams_per_process`` holds its session,
    tasks and buffers; when a thousand triggers start or wake together, a thousand such streams
    were built and freed one slot at a time, and the freed memory stayed in the allocator's pools
    between the dormant triggers' objects (about 13 KB of free blocks per trigger at N = 1,000).
    Letting in twice the cap keeps a waiter queued for every slot, so a quiet stream is still
    asked to give its slot back (see :class:`StreamLease`).
    """

    __slots__ = ("active", "waiters")

    def __init__(self) -> None:
        self.active = 0  # streams let in and not entered yet
        self.waiters: deque[asyncio.Future[None]] = deque()

    @staticmethod
    def room() -> int:
        """How many streams of a connection may be built and opened at once."""
        from airflow_provider_systemzero.stream.capacity import default_capacity

        return 2 * default_capacity().limit

    async def let_in(self) -> None:
        """Wait until this trigger may build its stream (:meth:`leave` when it is entered)."""
        if not self.waiters and self.active < self.room():
            self.active += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        log.info(
            "waiting to build the stream: %d streams of this connection are being opened (at most %d "
            "at once, twice max_streams_per_process), %d triggers waiting; first come first served",
            self.active,
            self.room(),
            len(self.waiters),
        )
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # let in as it was cancelled: the place goes to the next waiter
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise

    def leave(self) -> None:
        """The stream is entered (or failed to be): its place goes to the oldest waiter."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1


#: Per event loop and connection ID: the streams being opened (a process may run several loops).
OPENINGS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Opening]] = (
    weakref.WeakKeyDictionary()
)
