"""Whether a decision is about the state a trigger's stream holds, and the hold that keeps it so.

A trigger feeds a changing source into a stream and fires on a decision only when it covers the
complete state the stream holds (a *current* decision). :class:`Currency` tracks that, and — only
for a source that changes faster than a decision takes — holds the source's newer content back
while a decision is in flight, for at most ``max_staleness`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from airflow_provider_systemzero.durations import is_seconds
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError

__all__ = ["DEFAULT_MAX_STALENESS", "STARVED_AFTER", "Currency", "validate_max_staleness"]

log = logging.getLogger(__name__)

#: Default ``max_staleness``: seconds newer source content may be held back while a decision is in flight.
DEFAULT_MAX_STALENESS = 30.0
#: Decisions skipped as stale in a row after which newer source content is held back.
STARVED_AFTER = 2


def validate_max_staleness(value: Any) -> float:
    """``max_staleness`` as a float.

    :param value: seconds (``0`` never holds a change back).
    :raises SystemZeroArgumentError: naming the field and the fix.
    """
    if not is_seconds(value, at_most=3600):
        raise SystemZeroArgumentError(
            f"max_staleness must be a number of seconds from 0 to 3600, got {value!r}: pass how long "
            "a newer state of the source may wait while a decision is in flight (0: never)",
            code="invalid_max_staleness",
            field="max_staleness",
        )
    return float(value)


class Currency:
    """Which state the stream holds, and whether a decision about it is in flight.

    * :attr:`generation` counts the changes handed to the stream. It is bumped *before* the stream
      takes a change (``set_state`` yields), so a decide started at generation ``g`` is about the
      current state exactly when the generation is still ``g`` once it returns.
    * A source that changes faster than a decision takes would never be decided about (every
      decision comes back about an outdated state, and every one is billed). Once
      :data:`STARVED_AFTER` decisions in a row were skipped as stale, the feeder holds the source's
      newer content back while a decision is in flight (:meth:`hold`), for at most
      ``max_staleness`` seconds from its arrival, so the decision that comes back is about the
      state the stream holds and is evaluated. The cost, only in that case: a decision that fires
      may miss at most ``max_staleness`` seconds (in practice one decision's latency) of the
      source's newest content. The hold ends as soon as a decision comes back with nothing held
      (the source went quiet). ``max_staleness=0`` never holds.
    """

    def __init__(self, max_staleness: float, *, deciding: bool) -> None:
        self.max_staleness = max_staleness
        self.generation = 0
        self.stale_in_a_row = 0
        self._held = False
        #: called by :meth:`evaluated` (a trigger's :class:`~airflow_provider_systemzero.triggers.streaming.StreamLease`
        #: gives a quiet stream back only once every decision it saw was evaluated)
        self.on_evaluated: Callable[[], None] | None = None
        self._settled = asyncio.Event()
        if not deciding:
            self._settled.set()

    @property
    def starved(self) -> bool:
        """Whether the source has been changing faster than decisions come back."""
        return self.max_staleness > 0 and self.stale_in_a_row >= STARVED_AFTER

    def changed(self, deciding: bool) -> None:
        """A change is handed to the stream (on_change: it schedules a decision about it)."""
        self.generation += 1
        if deciding:
            self._settled.clear()

    def deciding(self) -> None:
        """A decision about the current state is in flight (on_request: a decide was sent)."""
        self._settled.clear()

    def skipped(self, *, settle: bool) -> None:
        """A decision came back about an outdated state and was skipped.

        :param settle: nothing else is in flight (on_request; on_change the gateway already
            dispatches the newer state).
        """
        self.stale_in_a_row += 1
        if self.stale_in_a_row == STARVED_AFTER and self.max_staleness > 0:
            log.info(
                "%d decisions in a row were about an outdated state: the source changes faster than a decision "
                "takes, so its newer state now waits (up to max_staleness=%.1f s) while a decision is in flight",
                self.stale_in_a_row,
                self.max_staleness,
            )
        if settle:
            self._settled.set()

    def current(self) -> None:
        """A decision about the current state came back (held changes wait until it is :meth:`evaluated`)."""
        if not self._held:
            self.stale_in_a_row = 0  # the source was quiet while it was decided: nothing to hold back
        self._held = False

    def evaluated(self) -> None:
        """The decision that came back was evaluated and did not end the wait: held changes may go.

        A decision that fires is never followed by this call, so nothing newer is sent (and
        billed) after it.
        """
        self._settled.set()
        if self.on_evaluated is not None:
            self.on_evaluated()

    async def hold(self, source: asyncio.Future[Any]) -> None:
        """When starved, wait while a decision is in flight: at most ``max_staleness`` seconds, or
        until ``source`` (the task reading the source) ends."""
        if self._settled.is_set() or not self.starved:
            return
        self._held = True
        log.info(
            "holding the source's newer state while the decision in flight comes back (at most %.1f s)",
            self.max_staleness,
        )
        settled = asyncio.ensure_future(self._settled.wait())
        try:
            done, _ = await asyncio.wait(
                {settled, source}, timeout=self.max_staleness, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            settled.cancel()
        if not done:
            log.info(
                "no decision within max_staleness (%.1f s): sending the newer state; the decision in flight "
                "will be skipped as stale",
                self.max_staleness,
            )
