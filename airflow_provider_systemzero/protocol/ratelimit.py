"""Rate limits with time passed in (seconds, any monotonic origin).

Both sides use the same :class:`TokenBucket`: the gateway to enforce ``max_events_per_second`` /
``event_burst`` and ``max_messages_per_second`` / ``message_burst``, the client to pace itself
under them so its changes coalesce instead of being rejected. The gateway counts its protocol
refusals in a :class:`SlidingWindow` (``protocol_refusal_limit`` within
``protocol_refusal_window``).
"""

from __future__ import annotations

from collections import deque

__all__ = ["SlidingWindow", "TokenBucket"]


class SlidingWindow:
    """How many times something happened within the last ``window`` seconds.

    :param window: the window's length in seconds.
    """

    __slots__ = ("_times", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._times: deque[float] = deque()  # when each counted thing happened, oldest first

    def add(self, now: float) -> int:
        """Count one more at ``now``; how many there are in the window ending at ``now``."""
        self._times.append(now)
        while self._times[0] <= now - self.window:
            self._times.popleft()
        return len(self._times)


class TokenBucket:
    """A bucket of ``burst`` tokens refilled at ``rate`` tokens per second.

    :param rate: tokens per second (``0``: never refills).
    :param burst: capacity; the bucket starts full.
    :param now: the current time in seconds.
    """

    __slots__ = ("burst", "rate", "_tokens", "_updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate >= 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._updated = now

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now

    def tokens(self, now: float) -> float:
        """Tokens available at ``now``."""
        self._refill(now)
        return self._tokens

    def try_take(self, now: float, count: float = 1.0) -> bool:
        """Take ``count`` tokens if available; ``False`` (and nothing taken) otherwise."""
        self._refill(now)
        if self._tokens + 1e-9 >= count:
            self._tokens = max(0.0, self._tokens - count)
            return True
        return False

    def delay(self, now: float, count: float = 1.0) -> float:
        """Seconds until ``count`` tokens are available (``0.0`` if they are now; ``inf`` if never)."""
        self._refill(now)
        missing = count - self._tokens
        if missing <= 1e-9:
            return 0.0
        if self.rate == 0:
            return float("inf")
        return missing / self.rate
