"""When a gateway connection starts a decide (WIRE.md §4), apart from what it sends.

:class:`Dispatches` is the schedule of one connection: at most one decide in flight; at most
one pending *intent* (a ``decide``, an on_change mutation or a retry wants a dispatch — several
collapse into one, dispatched with the latest accepted version); ``min_interval_ms`` between
dispatch starts; and the gateway's own retries of a failed on_change dispatch, which end the
connection after ``consecutive_retryable_failures`` failures of one version or when the retry
would come after the connection's end.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_RETRY_DELAY_MS", "Dispatches", "InFlightDecide"]

#: Delay before the gateway's own retry of an on_change dispatch when the failure names none
#: (WIRE.md §5 leaves it open; the emulator's choice). Never advertised as a server delay.
DEFAULT_RETRY_DELAY_MS = 1000


@dataclass(slots=True)
class InFlightDecide:
    """The decide call running now."""

    dispatch_id: int
    #: The accepted version it decides (the events up to it are frozen).
    state_version: int
    started: float
    #: How long the intent waited for it, in ms (``decision.queue_ms``).
    queue_ms: float


class Dispatches:
    """The dispatch schedule of one connection.

    :param now: the time the connection opened.
    """

    __slots__ = (
        "_failures",
        "_failures_version",
        "_ids",
        "_last_start",
        "_retry_at",
        "in_flight",
        "pending",
        "pending_since",
    )

    def __init__(self, now: float) -> None:
        #: The decide running now, if any.
        self.in_flight: InFlightDecide | None = None
        #: A dispatch is wanted, since :attr:`pending_since`.
        self.pending = False
        self.pending_since = now
        self._ids = 0
        self._last_start: float | None = None
        self._retry_at: float | None = None
        self._failures = 0
        self._failures_version = 0

    @property
    def started(self) -> int:
        """Dispatches started so far."""
        return self._ids

    def intend(self, now: float) -> None:
        """A dispatch is wanted: from now, unless one was wanted already."""
        if not self.pending:
            self.pending = True
            self.pending_since = now

    def eligible_at(self, min_interval_ms: int) -> float:
        """The earliest start of the next dispatch (``min_interval_ms``, a retry's delay)."""
        at = self._retry_at or 0.0
        if self._last_start is not None:
            at = max(at, self._last_start + min_interval_ms / 1000)
        return at

    def due(self, now: float, min_interval_ms: int) -> bool:
        """Whether a wanted dispatch may start now."""
        return self.in_flight is None and self.pending and now >= self.eligible_at(min_interval_ms)

    def start(self, state_version: int, now: float) -> InFlightDecide:
        """Start the wanted dispatch for ``state_version``."""
        self._ids += 1
        self.in_flight = InFlightDecide(self._ids, state_version, now, (now - self.pending_since) * 1000)
        self.pending = False
        self._retry_at = None
        self._last_start = now
        return self.in_flight

    def finish(self, dispatch_id: int) -> InFlightDecide | None:
        """The decide call ``dispatch_id`` ended: the one in flight, or ``None`` if it is not."""
        flight = self.in_flight
        if flight is None or flight.dispatch_id != dispatch_id:
            return None
        self.in_flight = None
        return flight

    def succeeded(self) -> None:
        """A dispatch succeeded: the count of consecutive failures starts again."""
        self._failures = 0

    def retry_ends_connection(
        self, flight: InFlightDecide, delay_ms: int | None, *, limit: int, remaining_ms: float
    ) -> tuple[bool, float]:
        """Count a failure the gateway retries itself.

        :param flight: the failed dispatch.
        :param delay_ms: the delay the failure named, if any.
        :param limit: ``consecutive_retryable_failures``.
        :param remaining_ms: time left before the connection's ``max_duration``.
        :returns: whether the failure ends the connection instead, and the retry's delay in ms.
        """
        if self._failures_version == flight.state_version:
            self._failures += 1
        else:
            self._failures, self._failures_version = 1, flight.state_version
        retry_in_ms = DEFAULT_RETRY_DELAY_MS if delay_ms is None else delay_ms
        return self._failures >= limit or retry_in_ms >= remaining_ms, retry_in_ms

    def retry_in(self, delay_ms: float, now: float) -> None:
        """Dispatch again, no sooner than ``delay_ms`` from now."""
        self._retry_at = now + delay_ms / 1000
        self.intend(now)

    def stop(self) -> None:
        """Want no more dispatches (shutdown); one in flight may still settle."""
        self.pending = False
        self._retry_at = None
