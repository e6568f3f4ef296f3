"""When a trigger gives its quiet stream back: the lease on a stream slot.

A triggerer holds many waiting triggers within ``max_streams_per_process`` because each gives
its stream back (close 1000) once it is quiet, and at once when another stream of the process
waits for a slot; the next change reconnects with a byte-identical replay.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from airflow_provider_systemzero.triggers.currency import Currency

__all__ = ["StreamLease"]

log = logging.getLogger("airflow_provider_systemzero.triggers.streaming")  # the triggers' stream log

#: What :attr:`StreamLease.covered` is before any decision (equal to no state).
_NOTHING: Any = object()


class StreamLease:
    """Says when a trigger gives its quiet stream back: ``after`` seconds after the last decision
    with nothing new, or at once when another stream of the process waits for a slot.

    Nothing polls. After each decision about the current state (:meth:`arm`) the lease sets one
    timer and *offers* the stream's slot to the process's
    :class:`~airflow_provider_systemzero.stream.capacity.StreamCapacity`, which calls the offer the
    moment a waiter queues; either way the future of :meth:`watch` completes (the trigger then
    closes the stream and goes dormant). A change handed to the stream :meth:`disarm` s it.

    :param enabled: lease at all (``False``: keep the stream).
    :param after: seconds without a change before the stream is given back.
    """

    __slots__ = (
        "_offer",
        "_pending",
        "_quiet",
        "_stream",
        "_timer",
        "_unevaluated",
        "after",
        "covered",
        "decided_at",
        "enabled",
    )

    def __init__(self, enabled: bool, after: float) -> None:
        self.enabled = enabled
        self.after = after
        #: the state the last decision covered (the trigger keeps it when the lease ends)
        self.covered: Any = _NOTHING
        #: the loop time of the last decision
        self.decided_at = -math.inf
        self._stream: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._offer: Any = None
        self._quiet: asyncio.Future[str] | None = None
        self._unevaluated = 0  # decisions armed on and not evaluated yet
        self._pending: str | None = None  # why to give the stream back once they are

    def watch(self, currency: Currency) -> asyncio.Future[str]:
        """A future that completes, with the reason, when the stream should be given back.

        The stream is given back only once every decision the lease was armed on was evaluated
        (``currency`` says so), so a decision that ends the wait is never dropped with its stream.

        :param currency: the feeder's :class:`~airflow_provider_systemzero.triggers.currency.Currency`.
        """
        self._quiet = asyncio.get_running_loop().create_future()
        self._unevaluated, self._pending = 0, None
        currency.on_evaluated = self._evaluated
        return self._quiet

    def _evaluated(self) -> None:
        self._unevaluated = max(0, self._unevaluated - 1)
        if not self._unevaluated and self._pending is not None:
            reason, self._pending = self._pending, None
            self._give_back(reason)

    def arm(self, stream: Any) -> None:
        """A decision about the current state came back: start the quiet-time countdown and offer
        the slot to a waiter (every decision re-arms it)."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self.covered = stream.state
        self.decided_at = loop.time()
        self._unevaluated += 1
        if not self.enabled:
            return
        self._stream = stream
        self._timer = loop.call_later(self.after, self._quiet_for_long)
        capacity = getattr(stream, "capacity", None)
        if capacity is not None:
            self._offer = capacity.offer(self._wanted)
            if self._offer.called:  # a waiter queues now: the slot goes back now, not a loop turn later
                self._wanted()

    def disarm(self) -> None:
        """Stop the countdown and withdraw the offer (the state changed, the stream was given back,
        or the trigger ends)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        offer, self._offer = self._offer, None
        if offer is not None:
            self._stream.capacity.withdraw(offer)
        self._stream = None

    def end(self) -> None:
        """The stream is closed or the trigger ends: :meth:`disarm`, and let go of the future of
        :meth:`watch` (a dormant trigger keeps nothing of its last stream)."""
        self.disarm()
        self._quiet = None

    def _quiet_for_long(self) -> None:
        self._timer = None
        self._give_back(f"nothing new for {self.after:.1f} s")

    def _wanted(self) -> None:
        if self._quiet is not None and self._quiet.done():
            return  # already giving the stream back: the waiter gets its slot
        if not self._give_back("another stream waits for a slot"):
            offer, self._offer = self._offer, None  # busy after all: let another idle stream go
            if offer is not None:
                self._stream.capacity.withdraw(offer)

    def _give_back(self, reason: str) -> bool:
        stream, quiet = self._stream, self._quiet
        if stream is None or quiet is None or quiet.done():
            return False
        if stream.has_work() or not (stream.connected or stream.dormant):
            return False  # a change is on its way (its decision re-arms), or the stream reconnects
        if self._unevaluated:
            self._pending = reason  # the decision just in may end the wait: give back once it did not
            return True
        log.info("%s: giving the stream back until the state changes", reason)
        quiet.set_result(reason)
        return True
