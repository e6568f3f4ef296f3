"""Where a :class:`~airflow_provider_systemzero.stream.DecisionStream` is in its life, and the one set of signals its parts wake each other with.

A stream is made of parts, each with its own state (:mod:`~airflow_provider_systemzero.stream.decision_stream`
lists them). What they all read — whether the stream is entered, ready, closing, closed or failed —
is one :class:`StreamLife`, and so is the *pulse*, the one signal that says "the stream changed:
look again". Every other wake-up belongs to the part that sets it. This table is the complete set
(``tests/stream/test_stream_parts.py`` checks it against the parts of an open stream):

| signal (`part.attribute`) | set by | means | what happens on it |
|---|---|---|---|
| `StreamLife.pulse_event` | `StreamLife.pulse()`: the events of a frame were handled, a connection closed, a `kick` (a change, a `decide()`, a decision start granted), the stream failed or closed | the stream changed | every waiter looks at its condition again: entering, `wait_in_sync`, `release`, a `decide()` retry's sleep, the run loop waiting for work or for its backoff |
| `ConnectionServer.turn_soon` | `ConnectionServer.kick()`, for what does not run in a socket callback or the caller's own task | the writer has something to look at | one writer's turn in the next loop iteration, however often it was asked |
| `ConnectionServer.alarm` | the writer's turn, and a frame that made something due later | something falls due at a time | a writer's turn then: the earliest of the session's `next_wakeup`, the receipt deadline and the next decision-wait report |
| `ConnectionServer.pong_turn` | a native ping received | pongs are owed | a writer's turn, at most every 1/40 s however fast pings come |
| `DecisionDelivery.waiter` | the `decisions()` consumer (`wake_on_decision`) | it waits for what `take_decision()` returns | resolved when a decision or a failure is queued, or the stream fails or closes: the consumer is the next task to run |
| `DecisionDelivery.intents` | `decide()`, one future per decide intent | the gateway's answer to that intent | resolved by the decision or failure that covers it, the budget's refusal, the stream's failure or close |
| `CoreEvents.opening_turn` | the account's decision starts (`DecisionStarts`), when they grant this stream its turn | on_change: the connection whose `start` starts a decision may open | the run loop takes a slot of `max_streams_per_process` and connects; while no slot is free, the turn goes back and the stream stays first in line |
| `GatewaySocket.lost` | the socket, once its TCP connection is gone | the connection ended | the run loop plans the next connection |

The run loop has no signal of its own: it waits for work on the pulse, since a change that needs
a connection kicks, and a kick pulses; on_change, it waits for the opening turn of the stream's
core events before it connects.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.stream.exceptions import StreamClosed
from airflow_provider_systemzero.stream.settings import StreamSettings

__all__ = ["StreamLife", "StreamView"]


class StreamView(Protocol):
    """What a part reads of its stream: the stream's public, read-only view."""

    @property
    def settings(self) -> StreamSettings | None: ...

    @property
    def session(self) -> ClientSession: ...

    @property
    def last_error_text(self) -> str | None: ...


class StreamLife:
    """Where a stream is in its life, read by all its parts, and the pulse that says it changed.

    Each attribute says what it holds and who changes it; nothing else writes it.
    """

    def __init__(self) -> None:
        #: The stream was entered (``DecisionStream.__aenter__``; once).
        self.entered = False
        #: The gateway acknowledged a ``start`` (set by the core's events; entering waits for it).
        self.ready = False
        #: The stream is closing: the close goes out at the next writer's turn and the run loop
        #: stops (``close_soon``, ``aclose`` and the exit of ``async with``).
        self.closing = False
        #: The stream is closed (``aclose`` and the exit of ``async with``): nothing more is sent.
        self.closed = False
        #: The error that ended the stream (set once, by ``DecisionStream._fail``).
        self.failure: BaseException | None = None
        #: The last retryable failure: set by the run loop when a connection ends with one and by
        #: a failed decision; cleared by a decision (it was overcome).
        self.last_error: BaseException | None = None
        #: The pulse (see the module's table): replaced by a fresh event each time it fires, and
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
