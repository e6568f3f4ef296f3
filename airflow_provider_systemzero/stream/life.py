"""Where a :class:`~airflow_provider_systemzero.stream.DecisionStream` is in its life, and the pulse its waits wait on.

:class:`StreamLife` is the stream's own state, read and written by the stream alone: whether it
is entered, ready, closing, closed or failed, its last retryable failure, and the *pulse*, the
one signal that says "the stream changed: look again" to the stream's waits (entering,
``wait_in_sync``, ``release``, a ``decide()`` retry's sleep). The stream pulses after it handled
what its connection told it. Every other wake-up belongs to the part that sets it, and is
described there.
"""

from __future__ import annotations

import asyncio
import contextlib

from airflow_provider_systemzero.stream.exceptions import StreamClosed

__all__ = ["StreamLife"]


class StreamLife:
    """Where a stream is in its life, read by all its parts, and the pulse that says it changed.

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
        #: The pulse (see the module): replaced by a fresh event each time it fires, and
        #: only when someone waits (``pulse_waiting``).
        self.pulse_event: asyncio.Event | None = None
        #: Tasks waiting for the pulse now.
        self.pulse_waiting = 0

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

    def start(self) -> None:
        """The stream is entered: the pulse exists from now on (it needs the running loop)."""
        self.entered = True
        self.pulse_event = asyncio.Event()

    def pulse(self) -> None:
        """Wake whoever waits for the stream to change; nothing is done when nobody waits."""
        if self.pulse_waiting and self.pulse_event is not None:
            self.pulse_event.set()
            self.pulse_event = asyncio.Event()

    async def wait_pulse(self, seconds: float | None) -> None:
        """Wait for the next pulse, at most ``seconds`` (``None``: no limit).

        :raises TimeoutError: no pulse in time.
        """
        assert self.pulse_event is not None
        event = self.pulse_event
        self.pulse_waiting += 1
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        finally:
            self.pulse_waiting -= 1

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake early when the stream closes or fails."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while not self.ending:
            remaining = end - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await self.wait_pulse(remaining)
