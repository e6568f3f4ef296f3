"""The account's decision starts as one process sees them: a mirror of the account's bucket and a
queue of the streams that want a start (sans I/O, time passed in).

Theory of operation
-------------------

The public document gives every account a fixed budget of decision *starts*, over all its streams
and processes: ``account_decision_burst`` (5 starts) at once, refilled to
``account_decision_ceiling`` (60 starts a minute). Over it, a decide fails with 429
``rate_limited`` and a Retry-After. :class:`StartQueue` keeps a **mirror** of that bucket — the
tokens the account holds, had this process alone spent them — and lets a stream start a decision
only when the mirror holds one. A process alone on its account spends the burst, then one start
per *gap* (1 / ceiling: a second at the published ceiling) as the gateway refills, and the gateway
never has to say no. The burst and the ceiling are the published ones until a ``hello``
advertises others (:meth:`StartQueue.adopt`); until the first ``hello`` of the account is heard,
one start goes at a time (an on_change ``start`` goes before its connection's ``hello``), so a
gateway advertising a smaller burst is not sent the published one. The mirror keeps :data:`CAP_MARGIN` below the
burst: a start reaches the gateway a little after the mirror counted it, and while the account's
bucket is full that time's refill is lost to the gateway, not to the mirror.

**Sharing an account.** Other processes on the same account are heard only through the 429s (the
mirror never lets a start go without a token, so a 429 means someone else took it). A 429 adapts
the mirror: it holds no more than the Retry-After says the account holds (its next token is that
far away). It also makes the process **shared**: from then on its starts follow its own *rate*
too, which the 429s cut and time restores — additive increase, multiplicative decrease, as TCP
shares a link — at random moments (each start takes between 1 − :data:`SPREAD` and
1 + :data:`SPREAD` of its pace), so that which process a 429 hits does not depend on who happened
to start right as the gateway made a token. A 429 cuts the rate by up to a third
(:data:`PACE_BACKOFF`), weighted by the share of the account the process takes: at
:data:`SHARE_FULL` of the ceiling or more the whole third, below it share ÷ :data:`SHARE_FULL` of
it, so the processes above their share back off more than those below and they meet at equal
shares. The rate grows by :data:`PACE_RECOVERY` of a start per gap, every gap, whatever the share
(a process that got few starts recovers as fast as one that got many). The 429s of starts already
on their way when the first was heard cut nothing more. After :data:`QUIET_UNITS` gaps without a
429 the process is alone again.

**A hiccup.** A gateway may refuse every start for a while, whoever takes what (a *hiccup*); the
429s say nothing about the process's share then, and its rate must not stay cut once the gateway
is back. A *run* is the 429s heard in a row, with no accepted start between them. A process alone
that the second 429 of one run made shared is alone again after :data:`BRIEF_QUIET_UNITS` gaps
without a 429 (not :data:`QUIET_UNITS`). A run of :data:`HICCUP_RUN` refusals or more that cut the
rate below :data:`HICCUP_KEEPS` of what it was when the run began is a hiccup: the rate goes back
to that (alone: to the share it took), and the rest of the run cuts nothing — the Retry-After
alone keeps the process waiting. A process below :data:`HICCUP_SHARE` of the account gets nothing
back: refusals in a row are its competitors' doing there, and its cuts are small.

Alone, a start waits a little past its token (up to
:data:`JITTER` of a gap): a process that took every token the moment the gateway made it would
leave another process nothing to start with, and never hear that it is not alone.

**Longest waiting first.** Among the streams that want a start, the next one goes to the stream
whose *newest* undecided change has waited longest: a state that keeps changing is decided once it
settles, and no start is spent on a state about to be replaced. So that a source that never
settles is still decided, a stream counts as settled :data:`PATIENCE_UNITS` gaps after its
*first* undecided change at the latest; ties go in arrival order. A grant is for the stream's
newest version: a state already superseded never gets a start (on_request the ``decide`` names
the version the stream holds when its turn comes; on_change the mutation is planned then). A
stream refused with 429 goes first; one that leaves its grant unused for :data:`GRANT_TTL` gives
its token back and waits again.

**The gateway's own retry.** on_change, the gateway retries a 429'd dispatch by itself once the
Retry-After has passed, and closes the stream with 1013 at the third refusal in a row for one
version. A stream that lets it retry (:meth:`~StartQueue.refused` with ``requeue=False``) is owed
the token the gateway makes for that retry: no start of this process takes it. (The stream client
gives its connection back on such a 429 instead, and asks for its turn again.)

The rules, in one table: what each input does to the mirror and to the queue.

=================================================  ================================================  ==============================
input                                              mirror                                            queue
=================================================  ================================================  ==============================
a ``hello``                                        burst and ceiling as it advertises them (the      —
                                                   published ones if it does not); before the
                                                   first, one start at a time
a request (:meth:`~StartQueue.request`)            a token taken, if one is there and none waits     else the stream waits; a newer
                                                                                                     version keeps its place and
                                                                                                     counts anew
a grant (:meth:`~StartQueue.grant`)                a token taken for the stream                      the longest-waiting stream
a grant unused for :data:`GRANT_TTL`               the token given back                              the stream waits again
a grant postponed (:meth:`~StartQueue.postpone`)   the token given back                              the stream waits again, first
a start not held (:meth:`~StartQueue.note_start`)  a token taken, owed if there is none              —
a start accepted (:meth:`~StartQueue.accepted`)    — (the share counts it)                           —
a 429 (:meth:`~StartQueue.refused`)                no more tokens than the Retry-After says; a       the stream goes first, or
                                                   new one (not of a start on its way) makes a       (the gateway retries it) its
                                                   process alone doubt, a doubting one shared,       token is owed
                                                   and cuts a shared one's rate by the
                                                   share-weighted third; a hiccup gives the
                                                   run's cuts back
time passing                                       refills at the ceiling (shared: the pace, at the  —
                                                   rate, which grows by :data:`PACE_RECOVERY`);
                                                   :data:`QUIET_UNITS` gaps without a 429 (after
                                                   one run: :data:`BRIEF_QUIET_UNITS`): alone
=================================================  ================================================  ==============================

The asyncio adapter (:mod:`airflow_provider_systemzero.stream.starts`) holds one queue per gateway
and API key in a process and wakes the granted streams.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from airflow_provider_systemzero.protocol.limits import DOCUMENT_LIMITS
from airflow_provider_systemzero.protocol.reconnect import doubled

__all__ = ["Grant", "StartQueue"]

#: Tokens the mirror keeps below the account's burst (see the module docstring): a start may take
#: up to half a gap to reach the gateway before the mirror could be ahead of the account.
CAP_MARGIN = 0.5
#: Alone, a start waits for up to this much of a gap past its token (drawn anew after each start).
JITTER = 0.5
#: After a 429, the part of a gap past the Retry-After before this process starts again: the
#: gateway's own retries of other processes' refused starts go first, at the Retry-After.
RETRY_HEADSTART = 0.1
#: A 429 divides a shared process's rate by up to this (the first one: the ceiling ÷ this).
PACE_BACKOFF = 1.5
#: Growth of a shared process's rate, in starts per gap, every gap (additive increase).
PACE_RECOVERY = 0.002
#: Shared, a start takes a random part of the pace between 1 − this and 1 + this (mean one).
SPREAD = 0.5
#: Gaps over which a process counts its own accepted starts: its *share* of the account is that
#: count ÷ this (1: one start a gap, the whole ceiling).
SHARE_UNITS = 10
#: The share at and above which a 429 cuts the rate by the whole :data:`PACE_BACKOFF`; below it,
#: by (share ÷ this) of it.
SHARE_FULL = 0.3
#: Gaps without a 429 after which a shared process counts as alone on the account again.
QUIET_UNITS = 100
#: The same, for a process that became shared within one *run* of 429s (refusals in a row, no
#: accepted start between them): the gateway may have refused every start for a while (a
#: hiccup), and a process alone takes its whole ceiling back this soon.
BRIEF_QUIET_UNITS = 10
#: Refusals in a row after which a run that cut the rate below :data:`HICCUP_KEEPS` of what it
#: was is a *hiccup*: the gateway refuses every start, whoever takes what.
HICCUP_RUN = 2
#: The part of its rate a run may cut before it can count as a hiccup (a smaller cut stands: the
#: process keeps 90 % of its pace through any run).
HICCUP_KEEPS = 0.9
#: The share below which a hiccup gives nothing back: a process that takes so little of the
#: account is refused in a row by its competitors, and its cuts are small.
HICCUP_SHARE = 0.15
#: The slowest a shared process paces itself, in starts per gap.
MIN_RATE = 0.001
#: Seconds a start waits for the first ``hello`` of the account (which may advertise a smaller
#: burst than the published one) before it goes anyway, while an earlier start's connection opens.
HELLO_WAIT = 2.0
#: Seconds a granted stream has to use its grant before it gives the token back and waits again.
GRANT_TTL = 5.0
#: Gaps after its first undecided change at which a stream counts as settled, whatever changed
#: since (see *Longest waiting first*).
PATIENCE_UNITS = 300
#: The shortest wait after a 429 whose Retry-After is 0 with no accepted start since the one
#: before, doubling with each such 429 up to :data:`MAX_REFUSED_WAIT`: a gateway that answers
#: 429 "retry at once" over and over gets starts about once a second, not as fast as round trips
#: go. Any Retry-After of a millisecond or more stands as given.
MIN_REFUSED_WAIT = 0.05
#: The longest that floor grows to (the published ceiling, 60 starts a minute, is one a second).
MAX_REFUSED_WAIT = 1.0
#: Tokens the mirror counts as one (float sums of refills).
_EPSILON = 1e-9


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
    since: float  # its first undecided change: when it began to ask
    newest: float  # when it asked about its newest version
    front: bool = False  # refused by the gateway: it goes first


class StartQueue:
    """Decision starts of one account, as one process sees them (see the module docstring).

    :param burst: the account's ``account_decision_burst`` (default: the published 5).
    :param ceiling_per_minute: the account's ``account_decision_ceiling`` (default: the published 60).
    :param now: the time the mirror starts from (full, as an account nobody used).
    :param rng: the random source of the jitter and the shared pace (tests pass a seeded one).
    :param adapt: ``False`` keeps the mirror alone: a local token bucket at the account's limits
        that honours each Retry-After and never paces itself below them (what the pacing is
        measured against: ``python -m benchmarks.sharing``).
    """

    def __init__(
        self,
        burst: int = DOCUMENT_LIMITS.account_decision_burst,
        ceiling_per_minute: int = DOCUMENT_LIMITS.account_decision_ceiling_per_minute,
        now: float = 0.0,
        rng: random.Random | None = None,
        *,
        adapt: bool = True,
    ) -> None:
        self._rng = rng or random.Random()
        self._adapt = adapt
        self._waiting: dict[Hashable, _Waiting] = {}  # insertion order: arrival order
        self._granted: dict[Hashable, tuple[_Waiting, float]] = {}  # stream → (its wait, granted at)
        #: The account's burst (starts at once).
        self.burst = max(1, burst)
        #: The account's ceiling, in starts a second.
        self.ceiling = max(1, ceiling_per_minute) / 60
        self._tokens = self._capacity  # the mirror: the account's tokens, had this process alone spent them
        self._at = now  # the time of _tokens and _paced
        self._jitter = 0.0  # alone: the part of a gap past its token the next start waits
        self._shared = False
        self._doubted = False  # a 429 came lately: the next one within QUIET_UNITS makes it shared
        self._known = False  # a hello said the account's limits (until then: one start at a time)
        self._hello_wait = -math.inf  # before a hello: no further start before this
        #: This process's own rate, in starts a second (the ceiling while it is alone).
        self.rate = self.ceiling
        self._paced = 1.0  # shared: the pace's tokens (at most one; a start takes a random part)
        #: No start before this time (the newest Retry-After).
        self.blocked_until = -math.inf
        self._recover_from = math.inf  # the rate grows from this time on
        self._quiet_from = -math.inf  # alone again QUIET_UNITS gaps after this
        self._quiet_units = QUIET_UNITS  # BRIEF_QUIET_UNITS while sharing rests on one run of 429s
        self._run_from = self.rate  # the rate when the current run of 429s began
        self._hiccup = False  # the current run of 429s is a hiccup: it cuts nothing more
        self._accepted: deque[float] = deque()  # this process's accepted starts of the share window
        #: 429 ``rate_limited`` answers heard.
        self.rate_limited = 0
        #: Starts let through (at once, granted, or not held).
        self.starts = 0
        #: The longest any stream waited for its start so far, in seconds.
        self.longest_wait = 0.0
        #: 429s heard since the last accepted start (each names a new Retry-After).
        self.refused_in_a_row = 0

    # ------------------------------------------------------------------ views

    @property
    def unit(self) -> float:
        """The account's gap between starts, in seconds (1 / ceiling): the time unit of the rules."""
        return 1 / self.ceiling

    @property
    def limited(self) -> bool:
        """Whether a 429 said another process spends the account (this one paces itself below it)."""
        return self._shared

    @property
    def pace(self) -> float:
        """Seconds between this process's starts at its own rate (the gap while it is alone)."""
        return 1 / self.rate

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

    def tokens(self, now: float) -> float:
        """The mirror's tokens at ``now``: the most the account may hold (below 0: starts owed to
        the gateway's own retries)."""
        self._advance(now)
        return self._tokens

    def share(self, now: float) -> float:
        """This process's share of the account: its accepted starts per gap over the last
        :data:`SHARE_UNITS` gaps (1.0: the whole ceiling)."""
        since = now - SHARE_UNITS * self.unit
        while self._accepted and self._accepted[0] <= since:
            self._accepted.popleft()
        return min(1.0, len(self._accepted) / SHARE_UNITS)

    # ------------------------------------------------------------------ the mirror

    @property
    def _capacity(self) -> float:
        return max(1.0, self.burst - CAP_MARGIN)

    def _advance(self, now: float) -> None:
        """Bring the mirror, the pace and the rate to ``now``."""
        if now <= self._at:
            return
        alone_at = self._quiet_from + self._quiet_units * self.unit
        if self._shared and now >= alone_at:  # no 429 for long: alone again, at the account's rate
            self._refill(alone_at)
            self._shared, self.rate, self._recover_from, self._paced = False, self.ceiling, math.inf, 1.0
            # but it shared the account lately: the next 429 means company again
            self._quiet_from, alone_at = alone_at, alone_at + QUIET_UNITS * self.unit
            self._quiet_units = QUIET_UNITS
        if self._doubted and now >= alone_at:
            self._doubted = False
        self._refill(now)

    def _refill(self, until: float) -> None:
        """Refill up to ``until``; past the end of the last Retry-After (and a pace), a shared rate
        grows with time and the pace refills at its mean over the span."""
        span = until - self._at
        if span <= 0:
            return
        self._tokens = min(self._capacity, self._tokens + span * self.ceiling)
        mean = self.rate
        if self.rate < self.ceiling and until > self._recover_from:
            begin = max(self._at, self._recover_from)
            grown = min(self.ceiling, self.rate + PACE_RECOVERY * self.ceiling**2 * (until - begin))
            mean = ((begin - self._at) * self.rate + (until - begin) * (self.rate + grown) / 2) / span
            self.rate, self._recover_from = grown, until
        self._paced = min(1.0, self._paced + span * mean)
        self._at = until

    def _next_start_at(self, now: float) -> float:
        """When the mirror (and, shared, the pace) allows the next start: ``now`` if it does."""
        self._advance(now)
        need = 1.0 if self._shared else min(self._capacity, 1.0 + self._jitter)
        at = now if self._tokens >= need - _EPSILON else now + (need - self._tokens) / self.ceiling
        if self._shared and self._paced < 1 - _EPSILON:
            at = max(at, now + (1 - self._paced) / self.rate)
        return max(at, self.blocked_until, self._hello_wait)

    def _take(self, now: float) -> None:
        """A start leaves: a token of the mirror and, shared, a random part of the pace; alone, the
        next start's jitter is drawn."""
        self._advance(now)
        self._tokens -= 1
        if not self._known:  # the next one waits for the hello this start's connection brings
            self._hello_wait = now + HELLO_WAIT
        if self._shared:
            self._paced -= self._spacing()
        else:
            self._jitter = self._rng.uniform(0.0, JITTER)

    def _spacing(self) -> float:
        return self._rng.uniform(1 - SPREAD, 1 + SPREAD)

    def _started(self, waited: float) -> None:
        self.starts += 1
        self.longest_wait = max(self.longest_wait, waited)

    # ------------------------------------------------------------------ the stream's side

    def adopt(self, burst: int, ceiling_per_minute: int, now: float) -> None:
        """The gateway advertised the account's limits (``hello``): the mirror follows them.

        :param burst: ``account_decision_burst``.
        :param ceiling_per_minute: ``account_decision_ceiling``, in starts a minute.
        :param now: the time it was heard.
        """
        burst, ceiling = max(1, burst), max(1, ceiling_per_minute) / 60
        self._known, self._hello_wait = True, -math.inf
        if burst == self.burst and ceiling == self.ceiling:
            return
        self._advance(now)
        self.rate = min(ceiling, self.rate * ceiling / self.ceiling)
        before = self._capacity
        self.burst, self.ceiling = burst, ceiling
        # the account began with the smaller burst: what was spent of it was spent of this one
        self._tokens = min(self._capacity, self._tokens - max(0.0, before - self._capacity))

    def request(self, stream: Hashable, version: int, now: float) -> bool:
        """``stream`` wants to start a decision about ``version`` (its newest) now.

        :returns: ``True`` when it may start now (the start is counted); ``False`` when it waits
            (queued, or its newer version replaces the one it waited with — its place is kept).
        """
        granted = self._granted.pop(stream, None)
        if granted is not None:
            waiting = granted[0]
            if now >= self.blocked_until:
                self._started(now - waiting.since)  # its token was taken with the grant
                return True
            # a 429 arrived between the grant and its use (the mirror was synced since): first again
            waiting.front = True
            self._waiting[stream] = waiting
        waiting = self._waiting.get(stream)
        if waiting is None:
            if not self._waiting and self._next_start_at(now) <= now:
                self._take(now)
                self._started(0.0)
                return True
            self._waiting[stream] = _Waiting(version, now, now)
        else:
            self.changed(stream, version, now)
        return False

    def changed(self, stream: Hashable, version: int, now: float) -> None:
        """``stream``, waiting for its start, changed its state to ``version``: its grant is for
        that one, and its newest change counts from now (nothing happens if it does not wait)."""
        waiting = self._waiting.get(stream) or self._granted.get(stream, (None, 0.0))[0]
        if waiting is not None and version > waiting.version:
            waiting.version, waiting.newest = version, now

    def note_start(self, now: float) -> None:
        """A start the queue could not hold (an on_change ``start`` that must go out): its token is
        taken, or owed when the mirror has none."""
        self._take(now)
        self._started(0.0)

    def postpone(self, stream: Hashable, version: int, now: float, *, counted: bool = False) -> None:
        """``stream`` was let start (granted, or at once) but cannot send its start yet (its
        connection waits for a socket): the token goes back, and the stream waits again, first in
        line. A start counted by a token taken long before it reaches the gateway would let the
        gateway see starts closer together than the mirror spaced them.

        :param version: the stream's newest version.
        :param counted: the start was let through at once by :meth:`request` (it is uncounted).
        """
        self._advance(now)
        granted = self._granted.pop(stream, None)
        if granted is not None:
            waiting = granted[0]
        elif counted:
            self.starts -= 1
            waiting = self._waiting.pop(stream, None) or _Waiting(version, now, now)
        else:
            return  # nothing was let through
        if version > waiting.version:
            waiting.version, waiting.newest = version, now
        waiting.front = True
        self._waiting[stream] = waiting
        self._tokens = min(self._capacity, self._tokens + 1)

    def withdraw(self, stream: Hashable) -> None:
        """``stream`` no longer wants a start (it closed, or its caller gave up); an unused grant's
        token goes back."""
        self._waiting.pop(stream, None)
        if self._granted.pop(stream, None) is not None:
            self._tokens = min(self._capacity, self._tokens + 1)

    def accepted(self, now: float) -> None:
        """A start was not rate limited (a decision arrived, or it failed for another reason)."""
        self._advance(now)
        self._accepted.append(now)
        self.refused_in_a_row = 0

    def refused(
        self, stream: Hashable, version: int, retry_after: float | None, now: float, *, requeue: bool = True
    ) -> None:
        """A start of ``stream`` was answered 429 ``rate_limited``.

        The mirror holds no more than the Retry-After says the account holds; the first 429 of a
        Retry-After cuts the process's rate (see the module docstring).

        :param version: the newest version the stream holds now.
        :param retry_after: the gateway's delay in seconds (``None``: the process's pace, at least 1 s).
        :param requeue: ``True`` (on_request) puts the stream back at the front of the queue;
            ``False`` (on_change: the gateway retries it by itself after ``retry_after``) owes
            that retry its token instead.
        """
        self.rate_limited += 1
        self._advance(now)
        delay = max(0.0, retry_after if retry_after is not None else max(self.pace, 1.0))
        if now >= self.blocked_until:  # not a start on its way when the last 429 was heard
            self.refused_in_a_row += 1
            if delay < _EPSILON and self.refused_in_a_row > 1:
                # "retry at once", again, with nothing accepted since the last 429: no time at all
                # is no answer (a token bucket names the time to its next token): wait the floor
                delay = doubled(MIN_REFUSED_WAIT, MAX_REFUSED_WAIT, self.refused_in_a_row - 2)
            self._cut(delay, now)
        # the gateway's own retries (on_change) take the token at its very moment: a start of
        # this process comes a little after, so that it never takes it from one
        self.blocked_until = max(self.blocked_until, now + delay + RETRY_HEADSTART * self.unit)
        self._quiet_from = self.blocked_until
        self._recover_from = self.blocked_until + self.pace
        self._tokens = min(self._tokens, 1 - delay * self.ceiling)  # the next token is `delay` away
        self._granted.pop(stream, None)
        if requeue:
            waiting = self._waiting.pop(stream, None) or _Waiting(version, now, now)
            if version > waiting.version:
                waiting.version, waiting.newest = version, now
            waiting.front = True
            self._waiting[stream] = waiting
        else:
            self._tokens -= 1  # the gateway's own retry takes the token it makes

    def _cut(self, delay: float, now: float) -> None:
        """A new 429 (one that names a new Retry-After).

        Alone, the first 429 only makes it doubt: one start slow to reach the gateway can be
        refused with nobody else on the account (the mirror counted it when it left). A second
        one makes it shared; when both came in one run (no accepted start between them), the
        sharing rests on that run alone and lapses after :data:`BRIEF_QUIET_UNITS` gaps without a
        429. Shared, each 429 cuts the rate by the share-weighted third, until the run is a
        *hiccup*: :data:`HICCUP_RUN` refusals in a row that took the rate below
        :data:`HICCUP_KEEPS` of what it was when the run began. Then the gateway refuses every
        start, whoever takes what: the rate goes back to what it was, and the rest of the run
        cuts nothing (the Retry-After alone keeps the process waiting)."""
        if not self._adapt:
            return
        if self.refused_in_a_row == 1:  # a run begins: what a hiccup gives back
            share = self.share(now)
            self._run_from = (
                0.0 if share < HICCUP_SHARE else self.rate if self._shared else share * self.ceiling
            )
            self._hiccup = False
        if not self._shared and not self._doubted:
            self._doubted = True
            return
        if not self._shared:
            self._shared, self._doubted, self.rate = True, True, self.ceiling / PACE_BACKOFF
            self._quiet_units = QUIET_UNITS if self.refused_in_a_row == 1 else BRIEF_QUIET_UNITS
        elif not self._hiccup:
            weight = min(1.0, self.share(now) / SHARE_FULL)
            self.rate = max(MIN_RATE * self.ceiling, self.rate / (1 + (PACE_BACKOFF - 1) * weight))
        if (
            not self._hiccup
            and self.refused_in_a_row >= HICCUP_RUN
            and self.rate < HICCUP_KEEPS * self._run_from
        ):
            self._hiccup, self.rate = True, max(self.rate, self._run_from)
        if delay > 0:  # never faster than the gap the gateway named
            self.rate = min(self.rate, 1 / delay)
        self._paced = min(self._paced, 1 - self._spacing())

    # ------------------------------------------------------------------ the queue's side

    def _first(self) -> Hashable:
        """The waiting stream whose newest undecided change waited longest (refused ones first)."""
        patience = PATIENCE_UNITS * self.unit
        return min(
            self._waiting,
            key=lambda s: (
                not self._waiting[s].front,
                min(self._waiting[s].newest, self._waiting[s].since + patience),
            ),
        )

    def grant(self, now: float) -> Grant | None:
        """The next start, if one may happen now: the longest-waiting stream, for its newest version."""
        self._expire(now)
        if not self._waiting or self._next_start_at(now) > now:
            return None
        stream = self._first()
        waiting = self._waiting.pop(stream)
        waiting.front = False
        self._take(now)  # reserved: the next grant keeps the pace even before this one is used
        self._granted[stream] = (waiting, now)
        return Grant(stream, waiting.version, now - waiting.since)

    def wakeup(self, now: float) -> float | None:
        """When :meth:`grant` may next return something (or a grant expire), or ``None``."""
        times = [granted_at + GRANT_TTL for _, granted_at in self._granted.values()]
        if self._waiting:
            times.append(self._next_start_at(now))
        return min(times, default=None)

    def _expire(self, now: float) -> None:
        # a grant not used in time gives its token back; its stream waits again
        for stream in [s for s, (_, at) in self._granted.items() if now >= at + GRANT_TTL]:
            self._waiting[stream] = self._granted.pop(stream)[0]
            self._advance(now)
            self._tokens = min(self._capacity, self._tokens + 1)
