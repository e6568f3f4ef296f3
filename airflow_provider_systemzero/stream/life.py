"""Where a :class:`~airflow_provider_systemzero.stream.DecisionStream` is in its life, and the pulse its waits wait on.

:class:`StreamLife` is the stream's own state, read and written by the stream alone: whether it
is entered, ready, closing, closed or failed, its last retryable failure, and the *pulse*, the
one signal that says "the stream changed: look again" to the stream's waits (entering,
``wait_in_sync``, ``release``, a ``decide()`` retry's sleep). The stream pulses after it handled
what its connection told it. Every other wake-up belongs to the part that sets it, and is
described there; the stream's connection waits on a :class:`Pulse` of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from airflow_provider_systemzero.stream.exceptions import StreamClosed

__all__ = ["Pulse", "StreamLife"]


class Pulse:
    """A signal that says "look again" to whoever waits on it now: fired while nobody waits, it
    does nothing (no flag stays set), so a waiter always looks at its condition before it waits."""

    def __init__(self) -> None:
        #: What the waiters of now wait on (made by the first, dropped when it fires).
        self._event: asyncio.Event | None = None
        #: Tasks waiting now.
        self.waiting = 0

    def fire(self) -> None:
        """Wake whoever waits now."""
        if self.waiting and self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, seconds: float | None) -> None:
        """Wait for the next :meth:`fire`, at most ``seconds`` (``None``: no limit).

        :raises TimeoutError: it did not fire in time.
        """
        event = self._event
        if event is None:
            event = self._event = asyncio.Event()
        self.waiting += 1
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        finally:
            self.waiting -= 1

    async def sleep(self, seconds: float, *, until: Callable[[], bool]) -> None:
        """Sleep ``seconds``, but end early once ``until()`` holds (looked at on each fire).

        :param until: the condition that ends the sleep.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while not until():
            remaining = end - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await self.wait(remaining)


class StreamLife:
    """Where a stream is in its life, and the pulse that says it changed (see the module).

    Each attribute says what it holds and who changes it; nothing else writes it.
    """

    def __init__(self) -> None:
        #: The stream was entered (``DecisionStream.__aenter__``; once).
        self.entered = False
        #: The gateway acknowledged a ``start`` (set by the stream's events; entering waits for it).
        self.ready = False
        #: The stream is closing: the close goes out at the next writer's turn and the run loop
        #: stops (``close_soon``, ``aclose`` and the exit of ``async with``).
        self.closing = False
        #: The stream is closed (``aclose`` and the exit of ``async with``): nothing more is sent.
        self.closed = False
        #: The error that ended the stream (set once, by ``DecisionStream._fail``).
        self.failure: BaseException | None = None
        #: The last retryable failure: set when a connection ends with one and by a failed
        #: decision; cleared by a decision (it was overcome).
        self.last_error: BaseException | None = None
        #: The pulse (see the module).
        self.pulse = Pulse()

    @property
    def ending(self) -> bool:
        """Whether the stream is closing or failed: no new connection, no new wait."""
        return self.closing or self.failure is not None

    def check_usable(self) -> None:
        """Raise what a caller of the stream must hear now: its failure, that it is closed, or that
        it was not entered."""
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise StreamClosed(None, "closed", message="the stream is closed: open a new one")
        if not self.entered:
            raise RuntimeError("use the stream inside 'async with' first")
