"""A fair queue of decision starts under the account's decision ceiling (sans I/O, time passed in).

Theory of operation
-------------------

An account may *start* ``account_decision_burst`` decisions at once and
``account_decision_ceiling`` per minute, over all its streams and processes (the public limits:
"account_decision_burst — 5 starts", "account_decision_ceiling — 60 starts per minute"). Over
it, a decide fails with 429 ``rate_limited`` and ``retry_after_ms``. A process does not know how much of the
account other processes use: the gateway's 429s are all it hears. :class:`StartQueue` turns them
into one decision per process:

* **Unlimited until told otherwise.** Before any 429 a start goes at once: nothing is added to
  the latency of an account below its ceiling.
* **One Retry-After per process.** A 429 blocks *every* stream of the queue until its
  ``retry_after`` has passed (not once per stream), then lets one start through; the next ones
  follow at a *pace* (seconds between starts), at least half again the Retry-After. The pace
  grows once per Retry-After: the 429s of starts already on their way when the first one was
  heard change nothing more.
* **Sharing an account, told nothing but the 429s.** From one pace after the Retry-After ended,
  the *rate* of starts (1 / pace) grows with *time*, by the same amount a second whatever share
  the process has (additive increase, multiplicative decrease, as TCP shares a link): a process
  that got few starts recovers as fast as one that got many. The time unit is the gateway's own:
  the largest of the latest Retry-Afters (a token bucket never asks for more than its gap between
  starts, so this is about that gap), and the rule is the same at any ceiling. An account quiet
  for :data:`QUIET_UNITS` units (no 429) is unlimited again: its burst is there for the next
  changes.
* **A 429 slows a process by the share it takes.** A plain AIMD is fair only when a start's
  chance of a 429 does not depend on who made it. Against the gateway's bucket it does: the
  process starting at the ceiling takes each token as soon as it is made, and the starts of a
  process far below it find the bucket empty more often — the smaller sender hears as many 429s
  a minute as the larger one and, slowed as much by each, stays small for minutes. So the
  decrease is weighted by the process's *share*, its accepted starts per unit over the last
  :data:`SHARE_UNITS` units (1: the whole ceiling): at :data:`SHARE_FULL` of the ceiling or
  more the pace grows by half, below it by (share ÷ :data:`SHARE_FULL`)² of that half (at a tenth
  of the ceiling by 1.4 %). The larger sender backs off, the smaller keeps its pace and grows
  with time, and the two meet at equal shares; a process alone at the ceiling slows as before.
* **Longest waiting first.** Streams that may not start now wait in arrival order; a stream keeps
  its place when it asks again about a newer version (its wait counts from its first request),
  goes back to the front when its start was refused (429) or came too early, and to the back when
  it left its grant unused for :data:`GRANT_TTL` (it had its turn).
* **"Retry at once", refused again.** 429s naming a Retry-After of 0 with no accepted start in
  between wait at least :data:`MIN_REFUSED_WAIT`, twice as long for each, up to
  :data:`MAX_REFUSED_WAIT`: a gateway that says so over and over is not asked as fast as round
  trips go.
* **Newest version only.** A stream is queued once, with the newest version it asked about: a
  grant is for that version, never for one it has since replaced (in on_request the client sends
  ``decide`` for its current version when the grant arrives, so the gateway starts nothing on a
  superseded state).

The fair-share bound follows: with *n* streams waiting and a pace of *p* seconds, no stream waits
more than about *n · p* for its start (every grant goes to the longest-waiting stream).

The asyncio adapter (:mod:`airflow_provider_systemzero.stream.starts`) holds one queue per
gateway and API key in a process and wakes the granted streams.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from airflow_provider_systemzero.protocol.reconnect import doubled

__all__ = ["Grant", "StartQueue"]

#: Pace multiplier on a 429 (weighted by the process's share, see :data:`SHARE_FULL`): the gap
#: between starts grows by up to half, and is at least half again the Retry-After (from
#: unlimited: half again the unit): a start exactly on the gateway's next token would race it.
PACE_BACKOFF = 1.5
#: Growth of the start rate once a Retry-After is over, in starts per unit per unit (the unit: the
#: largest of the latest Retry-Afters): 1 / pace grows by this much ÷ unit every unit.
PACE_RECOVERY = 0.004
#: How many of the latest Retry-Afters the unit is the largest of.
UNIT_SAMPLES = 64
#: Units without a 429 after which the queue is unlimited again (the account is quiet).
QUIET_UNITS = 50
#: Below this pace (seconds) the queue counts as unlimited again.
MIN_PACE = 0.001
#: Seconds a granted stream has to use its grant before it goes back to the front of the queue.
GRANT_TTL = 5.0
#: Units over which a process counts its own accepted starts: its *share* of the account is
#: that count ÷ this (1: one start a unit, the whole ceiling).
SHARE_UNITS = 10
#: The share at and above which a 429 slows the process by the whole :data:`PACE_BACKOFF`;
#: below it, by (share ÷ this)² of it.
SHARE_FULL = 0.6
#: The shortest wait after a 429 whose Retry-After is 0 with no accepted start since the one
#: before, doubling with each such 429 up to :data:`MAX_REFUSED_WAIT`: a gateway that answers
#: 429 "retry at once" over and over gets starts about once a second, not as fast as round trips
#: go. Any Retry-After of a millisecond or more stands as given.
MIN_REFUSED_WAIT = 0.05
#: The longest that floor grows to (the public account ceiling, 60 starts a minute, is one a second).
MAX_REFUSED_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class Grant:
    """A stream may start one decision now.

    :param stream: the stream (whatever hashable the caller queued).
    :param version: the newest version the stream asked about.
    :param waited: seconds it waited, from its first request to this grant.
    """

    stream: Hashable
    version: int
    waited: float


@dataclass(slots=True)
class _Waiting:
    version: int
    since: float


class StartQueue:
    """Decision starts of one account, as one process sees them (see the module docstring)."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, _Waiting] = {}  # insertion order = longest waiting first
        self._granted: dict[Hashable, tuple[_Waiting, float]] = {}  # stream → (its wait, granted at)
        #: No start before this time (the newest Retry-After).
        self.blocked_until = -math.inf
        #: Seconds between starts once a 429 was seen (0: unlimited).
        self.pace = 0.0
        self._last_start = -math.inf  # the last start or grant
        self._started = -math.inf  # the last start
        #: 429 ``rate_limited`` answers heard.
        self.rate_limited = 0
        #: Starts let through (at once or granted).
        self.starts = 0
        #: The longest any stream waited for its start so far, in seconds.
        self.longest_wait = 0.0
        #: The largest of the latest Retry-Afters, in seconds: the time unit of the pace's recovery.
        self.unit = 0.0
        self._delays: deque[float] = deque(maxlen=UNIT_SAMPLES)  # the latest Retry-Afters, in seconds
        self._recover_from = math.inf  # the pace shrinks from this time on
        # times of this process's latest accepted starts (its share; at most about SHARE_UNITS +
        # the burst fall in the window)
        self._accepted: deque[float] = deque(maxlen=4 * SHARE_UNITS)
        #: 429s heard since the last accepted start (each names a new Retry-After)
        self.refused_in_a_row = 0

    # ------------------------------------------------------------------ views

    @property
    def limited(self) -> bool:
        """Whether starts are paced (a 429 was heard and the pace has not recovered)."""
        return self.pace >= MIN_PACE

    @property
    def waiting(self) -> int:
        """Streams waiting for a start (granted ones not counted)."""
        return len(self._waiting)

    def is_waiting(self, stream: Hashable) -> bool:
        """Whether ``stream`` waits for a start (queued, or granted and not yet started)."""
        return stream in self._waiting or stream in self._granted

    def holds_grant(self, stream: Hashable) -> bool:
        """Whether ``stream`` was granted a start it has not used yet."""
        return stream in self._granted

    def _next_start_at(self) -> float:
        return max(self.blocked_until, max(self._last_start, self._started) + self.pace)

    # ------------------------------------------------------------------ the stream's side

    def request(self, stream: Hashable, version: int, now: float) -> bool:
        """``stream`` wants to start a decision about ``version`` (its newest) now.

        :returns: ``True`` when it may start now (the start is counted); ``False`` when it waits
            (queued, or its newer version replaces the one it waited with — its place is kept).
        """
        self._recover(now)
        granted = self._granted.pop(stream, None)
        if granted is not None:
            waiting = granted[0]
            waiting.version = max(waiting.version, version)
            if now >= max(self.blocked_until, self._started + self.pace):
                self._start(now, now - waiting.since)
                return True
            # a 429 arrived between the grant and its use, or an earlier grant was used late: back
            # to the front, for a later grant
            self._waiting = {stream: waiting, **self._waiting}
            return False
        waiting = self._waiting.get(stream)
        if waiting is None and not self._waiting and not self._granted and now >= self._next_start_at():
            self._start(now, 0.0)
            return True
        if waiting is None:
            self._waiting[stream] = _Waiting(version, now)
        else:
            waiting.version = max(waiting.version, version)
        return False

    def note_start(self, now: float) -> None:
        """A start the queue could not hold (on_change: the ``start`` of a connection schedules one)."""
        self._start(now, 0.0)

    def withdraw(self, stream: Hashable) -> None:
        """``stream`` no longer wants a start (it closed, or its caller gave up)."""
        self._waiting.pop(stream, None)
        self._granted.pop(stream, None)

    def accepted(self, now: float) -> None:
        """A start was not rate limited (a decision arrived, or it failed for another reason).

        The pace shrinks with time (see :meth:`_recover`), never by the count of starts: a
        process's recovery does not depend on the share it already has.
        """
        self._recover(now)
        self._accepted.append(now)
        self.refused_in_a_row = 0

    def share(self, now: float) -> float:
        """This process's share of the account: its accepted starts per unit over the last
        :data:`SHARE_UNITS` units (1.0: the whole ceiling; 1.0 too before any 429 gave a unit)."""
        if self.unit <= 0:
            return 1.0
        since = now - SHARE_UNITS * self.unit
        return min(1.0, sum(1 for at in self._accepted if at > since) / SHARE_UNITS)

    def _recover(self, now: float) -> None:
        # additive increase of the rate, by time: the same for every process whatever its share;
        # not before a whole pace has passed since the last Retry-After ended: the probe after a
        # 429 being accepted does not let a second start into the same window
        if not self.pace or now <= self._recover_from:
            return
        unit = max(self.unit, MIN_PACE)
        self.pace = 1 / (1 / self.pace + PACE_RECOVERY * (now - self._recover_from) / unit**2)
        self._recover_from = now
        if self.pace < MIN_PACE or now >= self.blocked_until + QUIET_UNITS * unit:
            self.pace, self._recover_from = 0.0, math.inf

    def refused(
        self, stream: Hashable, version: int, retry_after: float | None, now: float, *, requeue: bool = True
    ) -> None:
        """A start of ``stream`` was answered 429 ``rate_limited``.

        Every stream of the queue waits out ``retry_after`` (once, together); the pace grows.

        :param version: the newest version the stream holds now.
        :param retry_after: the gateway's delay in seconds (``None``: the current pace, at least 1 s).
        :param requeue: ``True`` (on_request) puts the stream back at the front of the queue;
            ``False`` (on_change: the gateway retries it by itself after ``retry_after``) counts
            that retry as the window's one start instead.
        """
        self.rate_limited += 1
        self._recover(now)
        delay = max(0.0, retry_after if retry_after is not None else max(self.pace, 1.0))
        heard = now < self.blocked_until  # a start on its way when the last 429 was heard
        if not heard:
            self.refused_in_a_row += 1
        if delay < MIN_PACE and self.refused_in_a_row > 1:
            # "retry at once", again, with nothing accepted since the last 429: no time at all is
            # no answer (a token bucket names the time to its next token), so wait the floor
            delay = doubled(MIN_REFUSED_WAIT, MAX_REFUSED_WAIT, self.refused_in_a_row - 2)
        self.blocked_until = max(self.blocked_until, now + delay)
        if delay > 0:
            self._delays.append(delay)
            self.unit = max(self._delays)
        if not heard:  # each Retry-After slows the process once, not once per stream
            first = not self.pace
            if first:  # from unlimited: a pace half again the gateway's gap
                self.pace = max(delay, self.unit, MIN_PACE) * PACE_BACKOFF
            else:  # by as much as the process takes of the account (see the module docstring)
                weight = min(1.0, self.share(now) / SHARE_FULL) ** 2
                self.pace = max(delay * PACE_BACKOFF, self.pace * (1 + (PACE_BACKOFF - 1) * weight))
            if first:  # the probe goes when the Retry-After ends, the next start a pace after it
                self._started = min(self._started, self.blocked_until - self.pace)
                self._last_start = min(self._last_start, self.blocked_until - self.pace)
        self._recover_from = self.blocked_until + self.pace
        self._granted.pop(stream, None)
        if requeue:
            since = now
            waiting = self._waiting.pop(stream, None)
            if waiting is not None:
                since, version = waiting.since, max(version, waiting.version)
            self._waiting = {stream: _Waiting(version, since), **self._waiting}
        else:
            self._last_start = max(self._last_start, now + delay)  # the gateway's own retry

    # ------------------------------------------------------------------ the queue's side

    def grant(self, now: float) -> Grant | None:
        """The next start, if one may happen now: the longest-waiting stream, for its newest version."""
        self._recover(now)
        self._expire(now)
        if not self._waiting or now < self._next_start_at():
            return None
        stream = next(iter(self._waiting))
        waiting = self._waiting.pop(stream)
        self._granted[stream] = (waiting, now)
        self._last_start = now  # reserved: the next grant keeps the pace even before this one is used
        return Grant(stream, waiting.version, now - waiting.since)

    def wakeup(self, now: float) -> float | None:
        """When :meth:`grant` may next return something (or a grant expire), or ``None``."""
        times = [granted_at + GRANT_TTL for _, granted_at in self._granted.values()]
        if self._waiting:
            times.append(max(now, self._next_start_at()))
        return min(times, default=None)

    def _expire(self, now: float) -> None:
        # a grant not used in time loses its turn: its stream waits again behind the others
        for stream in [s for s, (_, at) in self._granted.items() if now >= at + GRANT_TTL]:
            self._waiting[stream] = self._granted.pop(stream)[0]

    def _start(self, now: float, waited: float) -> None:
        self.starts += 1
        self._last_start = max(self._last_start, now)
        self._started = max(self._started, now)
        self.longest_wait = max(self.longest_wait, waited)
