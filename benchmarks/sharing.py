"""A simulated account: processes, each with the real :class:`StartQueue` and its streams, against
one gateway bucket (the emulator's own :class:`TokenBucket`), on a simulated clock.

Lines arrive on streams (each line a newer version of its stream's state); a stream with an
undecided version asks its process's queue for a start, starts on its newest version when the
queue lets it, and the gateway takes a token when the start arrives (a latency later) or answers
429 with the time to its next token. on_request a refused stream asks again (the queue holds it
first). on_change the gateway retries the start by itself after the Retry-After, and closes the
connection (1013) at the third refusal in a row for one version, as WIRE.md §5 says; the stream
gives that connection back as soon as it hears a 429 and asks for its turn again (the gateway's
retry happens only when it comes before the close reaches the gateway).

Processes may join the account late and leave it early (:class:`Member`): one that leaves gives
up its streams' waits, one that joins starts with a fresh queue that heard the gateway's hello. A
*hiccup* is a span during which the gateway refuses every start with 429 and a Retry-After of
one gap, as a gateway does whose account bucket is out of step with the time (its own bucket is
left untouched). Everything that happens is recorded for the tests and the benchmark to read.

:func:`scale` is the benchmark's scenario over it (``python -m benchmarks.sharing``): 16 or 64
processes of different loads joining and leaving, a hiccup of ten seconds, and the figures of
:data:`TARGETS`.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.starts import StartQueue
from benchmarks.report_format import DASH, md_table

__all__ = ["TARGETS", "Account", "Member", "conforms", "fair_shares", "scale"]

Key = tuple[int, int]  # (process, stream)


@dataclass
class Start:
    """A decision start as the gateway saw it."""

    at: float  # when it reached the gateway
    sent: float  # when the process sent it (the gateway's own retry: when it retried)
    process: int
    stream: Key
    version: int
    refused: bool
    retry: bool = False  # the gateway's own retry (on_change)


@dataclass(frozen=True)
class Member:
    """One process of the account: when it is on it, and how busy it is.

    :param joins: when it joins (its queue starts then, full, as a new process's does).
    :param leaves: when it leaves (its streams stop asking); ``inf``: never.
    :param busy: streams that always have a newer line the moment they are decided.
    :param light: streams that gain a line now and then, ``light_every`` seconds apart on average.
    :param light_every: the mean gap between two lines of a light stream, in seconds.
    """

    joins: float = 0.0
    leaves: float = math.inf
    busy: int = 0
    light: int = 0
    light_every: float = 60.0


@dataclass
class _Flight:
    """A start on its way: the version it decides, the connection it went on."""

    version: int
    connection: int
    sent: float


@dataclass
class _Stream:
    newest: int = 0
    decided: int = 0
    flight: _Flight | None = None  # the start in flight
    connection: int = 0  # on_change: the connection its starts go on (it gives one back on a 429)
    gone: set[int] = field(default_factory=set)  # connections whose close reached the gateway
    refusals: dict[int, int] = field(default_factory=dict)  # the gateway's refusals in a row, per connection
    closed: bool = False  # closed 1013 by the gateway's retry rule
    busy: bool = False  # always a newer line once decided (while its process is on the account)


@dataclass
class Account:
    """The simulation (see the module docstring).

    :param processes: how many processes share the account (all on it from the start), or the
        members, each with its own times and load.
    :param ceiling: the account's starts a second.
    :param burst: the account's burst.
    :param latency: seconds a start takes to reach the gateway (and its answer to come back),
        each drawn between half and one and a half times this.
    :param on_change: the gateway retries a refused start by itself.
    :param seed: the random seed.
    :param hiccups: ``(begin, end)`` spans during which the gateway refuses every start.
    :param queue: makes a process's queue: ``(burst, ceiling per minute, now, rng)``.
    """

    processes: int | Sequence[Member]
    ceiling: float = 1.0
    burst: int = 5
    latency: float = 0.01
    on_change: bool = False
    seed: int = 0
    hiccups: Sequence[tuple[float, float]] = ()
    queue: Callable[[int, int, float, random.Random], StartQueue] | None = None
    starts: list[Start] = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.members: list[Member] = (
            [Member() for _ in range(self.processes)]
            if isinstance(self.processes, int)
            else list(self.processes)
        )
        self.processes = len(self.members)
        self.bucket = TokenBucket(self.ceiling, self.burst, 0.0)
        per_minute = round(self.ceiling * 60)
        make = self.queue or (lambda burst, ceiling, now, rng: StartQueue(burst, ceiling, now=now, rng=rng))
        self.queues: list[StartQueue] = []
        for p, member in enumerate(self.members):
            queue = make(self.burst, per_minute, member.joins, random.Random(self.seed * 31 + p))
            queue.adopt(self.burst, per_minute, member.joins)  # it heard the gateway's hello
            self.queues.append(queue)
        self.streams: dict[Key, _Stream] = {}
        self._events: list[tuple[float, int, str, Key, Any]] = []
        self._order = itertools.count()
        self._timers: list[float | None] = [None] * self.processes
        self._saturated_until = -1.0
        for p, member in enumerate(self.members):
            for s in range(member.busy):
                self.streams[(p, s)] = _Stream(busy=True)
                self.line(member.joins, p, s)
            for s in range(member.busy, member.busy + member.light):
                self._push(member.joins + self._rng.expovariate(1 / member.light_every), "light", (p, s))
            if member.leaves < math.inf:
                self._push(member.leaves, "leave", (p, -1))

    # ------------------------------------------------------------------ driving it

    def line(self, at: float, process: int, stream: int) -> None:
        """A line arrives on ``stream`` of ``process`` at ``at``."""
        self._push(at, "line", (process, stream))

    def keep_busy(self, streams: int, until: float) -> None:
        """Until ``until``, every stream of every process has a newer line the moment it is decided."""
        self._saturated_until = until
        for process in range(self.processes):
            for stream in range(streams):
                self.line(0.0, process, stream)

    def run(self, until: float) -> None:
        """Play the events up to ``until``."""
        while self._events and self._events[0][0] <= until:
            self.now, _, kind, key, value = heapq.heappop(self._events)
            getattr(self, f"_on_{kind}")(key, value)
        self.now = until

    # ------------------------------------------------------------------ what the tests read

    def on(self, process: int, at: float) -> bool:
        """Whether ``process`` is on the account at ``at``."""
        member = self.members[process]
        return member.joins <= at < member.leaves

    def accepted(self, process: int | None = None, since: float = 0.0, until: float = math.inf) -> int:
        """Accepted starts (of ``process``, or all) that reached the gateway in [``since``, ``until``)."""
        return sum(
            1
            for s in self.starts
            if not s.refused and since <= s.at < until and (process is None or s.process == process)
        )

    def refused(self, since: float = 0.0, until: float = math.inf) -> int:
        """429s the gateway answered in [``since``, ``until``)."""
        return sum(1 for s in self.starts if s.refused and since <= s.at < until)

    def undecided(self) -> list[Key]:
        """Streams whose newest line no accepted start covers (of processes still on the account)."""
        return [key for key, s in self.streams.items() if s.decided < s.newest and self.on(key[0], self.now)]

    def closed(self) -> int:
        """Streams the gateway closed with 1013 (three refusals in a row on one connection)."""
        return sum(1 for s in self.streams.values() if s.closed)

    def most_refusals_in_a_row(self) -> int:
        """The most refusals in a row any stream heard for one version (on any connections)."""
        worst, run = 0, {}
        for start in self.starts:
            key = (start.stream, start.version)
            run[key] = run.get(key, 0) + 1 if start.refused else 0
            worst = max(worst, run[key])
        return worst

    # ------------------------------------------------------------------ the events

    def _push(self, at: float, kind: str, key: Key, value: Any = None) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, key, value))

    def _delay(self) -> float:
        return self.latency * self._rng.uniform(0.5, 1.5)

    def _in_hiccup(self) -> bool:
        return any(begin <= self.now < end for begin, end in self.hiccups)

    def _on_line(self, key: Key, _value: Any) -> None:
        if not self.on(key[0], self.now):
            return
        stream = self.streams.setdefault(key, _Stream())
        stream.newest += 1
        queue = self.queues[key[0]]
        if queue.is_waiting(key):
            queue.changed(key, stream.newest, self.now)
        else:
            self._ask(key)

    def _on_light(self, key: Key, _value: Any) -> None:
        if not self.on(key[0], self.now):
            return
        self._on_line(key, None)
        member = self.members[key[0]]
        self._push(self.now + self._rng.expovariate(1 / member.light_every), "light", key)

    def _on_leave(self, key: Key, _value: Any) -> None:
        process = key[0]
        for stream_key in [k for k in self.streams if k[0] == process]:
            self.queues[process].withdraw(stream_key)

    def _ask(self, key: Key) -> None:
        stream = self.streams[key]
        if (
            stream.closed
            or stream.flight is not None
            or stream.decided >= stream.newest
            or not self.on(key[0], self.now)
        ):
            return
        process = key[0]
        if self.queues[process].request(key, stream.newest, self.now):
            stream.flight = flight = _Flight(stream.newest, stream.connection, self.now)
            self._push(self.now + self._delay(), "gateway", key, flight)
        else:
            self._wake_at(process)

    def _wake_at(self, process: int) -> None:
        at = self.queues[process].wakeup(self.now)
        timer = self._timers[process]
        if at is not None and (timer is None or at < timer):
            self._timers[process] = max(at, self.now)
            self._push(max(at, self.now), "timer", (process, -1))

    def _on_timer(self, key: Key, _value: Any) -> None:
        process = key[0]
        if self._timers[process] != self.now:
            return  # replaced by an earlier one
        self._timers[process] = None
        queue = self.queues[process]
        while (grant := queue.grant(self.now)) is not None:
            assert grant.version == self.streams[grant.stream].newest, "a grant for a superseded version"  # type: ignore[index]
            self._ask(grant.stream)  # type: ignore[arg-type]
        self._wake_at(process)

    def _on_gateway(self, key: Key, flight: _Flight, *, retry: bool = False) -> None:
        stream = self.streams[key]
        hiccup = self._in_hiccup()
        refused = hiccup or not self.bucket.try_take(self.now)
        self.starts.append(
            Start(self.now, self.now if retry else flight.sent, key[0], key, flight.version, refused, retry)
        )
        answer = self.now + self._delay()
        if not refused:
            stream.refusals[flight.connection] = 0
            self._push(answer, "accepted", key, flight)
            return
        retry_after = 1 / self.ceiling if hiccup else max(0.001, self.bucket.delay(self.now))
        self._push(answer, "refused", key, (flight, retry_after))
        if self.on_change:
            refusals = stream.refusals[flight.connection] = stream.refusals.get(flight.connection, 0) + 1
            if refusals >= 3:
                stream.closed = True  # fatal, goodbye overload, 1013
            else:
                self._push(self.now + retry_after, "retry", key, flight)

    def _on_retry(self, key: Key, flight: _Flight) -> None:
        if flight.connection not in self.streams[key].gone:  # the client's close has not come yet
            self._on_gateway(key, flight, retry=True)

    def _on_close(self, key: Key, connection: int) -> None:
        self.streams[key].gone.add(connection)

    def _on_accepted(self, key: Key, flight: _Flight) -> None:
        stream = self.streams[key]
        stream.decided = max(stream.decided, flight.version)
        if stream.flight is flight:
            stream.flight = None
        if not self.on(key[0], self.now):
            return
        self.queues[key[0]].accepted(self.now)
        if self.now < self._saturated_until or stream.busy:
            self._on_line(key, None)  # saturated: a newer line is always there
        self._ask(key)

    def _on_refused(self, key: Key, answer: tuple[_Flight, float]) -> None:
        flight, retry_after = answer
        stream = self.streams[key]
        if stream.flight is not flight:
            return  # a refused retry on a connection already given back
        stream.flight = None
        if not self.on(key[0], self.now):
            return
        if self.on_change:  # give the connection back: its close reaches the gateway a latency later
            self._push(self.now + self._delay(), "close", key, flight.connection)
            stream.connection += 1  # the next start goes on a new connection
        self.queues[key[0]].refused(key, stream.newest, retry_after, self.now)
        self._wake_at(key[0])
        self._ask(key)


def fair_shares(account: Account, since: float, until: float = math.inf) -> list[float]:
    """Each process's accepted starts in [``since``, ``until``) ÷ its fair share of them (the
    account's accepted starts ÷ the processes)."""
    total = account.accepted(since=since, until=until)
    fair = total / account.processes
    return [account.accepted(p, since, until) / fair if fair else 1.0 for p in range(account.processes)]


def conforms(times: Sequence[float], ceiling: float, burst: int) -> bool:
    """Whether starts at ``times`` (in order) never exceed a bucket of ``burst`` refilled at
    ``ceiling`` a second that starts full: none of them would be refused."""
    bucket = TokenBucket(ceiling, burst, 0.0)
    return all(bucket.try_take(at) for at in times)


# ------------------------------------------------------------------------------------ the scenario

#: The targets of the scenario's figures, at 16 and 64 processes (and one alone, for the hiccup).
TARGETS = {
    "ceiling_used": 0.95,  # at least
    "worst_fair_share": 0.90,  # at least
    "refused_per_accepted": 0.10,  # at most
    "back_to_90_s": 10.0,  # at most, after the hiccup's end
}
#: Seconds of each phase of a run: all on; some busy processes gone; others joined (the hiccup).
PHASE_S = 3600.0
#: Seconds after a phase's start before it is measured (the processes find their shares).
SETTLE_S = 300.0
#: The hiccup: when in the last phase it begins, and how long it lasts.
HICCUP_AT_S, HICCUP_S = 1800.0, 10.0
#: Seconds after the hiccup's end left out of the phase's other figures.
HICCUP_TAIL_S = 120.0
#: The window over which a rate counts as back to 90 % after the hiccup, in seconds, and the
#: seconds before the hiccup whose rate it is 90 % of.
RATE_WINDOW_S, BEFORE_S = 10.0, 300.0
#: The mean line gap of a light stream, in gaps times the processes: its process asks for about a
#: tenth of its fair share of the account (three light streams a process).
LIGHT_EVERY_UNITS = 10.0


def members(processes: int, seed: int) -> tuple[list[Member], list[tuple[float, float]]]:
    """The members of a run of ``processes`` at once, and its phases ``(begin, end)``.

    Three in four processes are busy (two to six streams that always have a newer line), one in
    four light (three streams with a line now and then); they join over the first 30 s. At the
    end of the first phase an eighth of the processes (busy ones) leave; at the end of the second
    as many new busy processes join. A process alone (``processes`` 1) has 20 busy streams.
    """
    rng = random.Random(seed)
    phases = [(k * PHASE_S, (k + 1) * PHASE_S) for k in range(3)]
    if processes == 1:
        return [Member(busy=20)], phases
    light = processes // 4
    turnover = max(1, processes // 8)
    team = [
        Member(
            joins=rng.uniform(0, 30),
            busy=0 if k < light else rng.randint(2, 6),
            light=3 if k < light else 0,
            light_every=LIGHT_EVERY_UNITS * processes,
        )
        for k in range(processes)
    ]
    for k in range(processes - turnover, processes):  # the last busy ones leave after phase one
        team[k] = Member(joins=team[k].joins, leaves=PHASE_S, busy=team[k].busy)
    team += [Member(joins=2 * PHASE_S + rng.uniform(0, 30), busy=rng.randint(2, 6)) for _ in range(turnover)]
    return team, phases


def scale(
    processes: int,
    *,
    seed: int = 0,
    latency: float = 0.02,
    queue: Callable[[int, int, float, random.Random], StartQueue] | None = None,
) -> dict[str, Any]:
    """One run of the scenario (see :func:`members`) on an account of the published limits (burst
    5, 60 starts a minute), a hiccup of :data:`HICCUP_S` in the last phase. Returns its figures.

    :param processes: how many processes are on the account at once (1: one process alone).
    :param latency: the mean seconds a start takes to the gateway (and its answer back).
    :param queue: makes each process's queue (default: :class:`StartQueue`).
    """
    team, phases = members(processes, seed)
    hiccup = (phases[2][0] + HICCUP_AT_S, phases[2][0] + HICCUP_AT_S + HICCUP_S)
    account = Account(team, latency=latency, seed=seed, hiccups=[hiccup], queue=queue)
    account.run(phases[-1][1])
    busy = [p for p, m in enumerate(team) if m.busy]
    light = [p for p, m in enumerate(team) if m.light]
    used, worst, refused, accepted = [], [], 0, 0
    for begin, end in phases:
        spans = [(begin + SETTLE_S, end)]
        if begin <= hiccup[0] < end:  # the hiccup and its tail are left out
            spans = [(begin + SETTLE_S, hiccup[0]), (hiccup[1] + HICCUP_TAIL_S, end)]
        seconds = sum(b - a for a, b in spans)
        total = sum(account.accepted(since=a, until=b) for a, b in spans)
        used.append(total / (seconds * account.ceiling))
        refused += sum(account.refused(a, b) for a, b in spans)
        accepted += total
        present = [p for p in busy if team[p].joins <= begin + 30 and team[p].leaves >= end]
        light_total = sum(account.accepted(p, a, b) for p in light for a, b in spans)
        if present:
            fair = (total - light_total) / sum(
                1 for p in busy if team[p].joins < begin + SETTLE_S and team[p].leaves >= end
            )
            worst.append(min(sum(account.accepted(p, a, b) for a, b in spans) / fair for p in present))
    back = _back_to_90(account, hiccup, None)
    alone_enough = [  # the processes whose own starts are enough to tell their rate over a window
        p
        for p in range(account.processes)
        if account.accepted(p, hiccup[0] - BEFORE_S, hiccup[0]) * RATE_WINDOW_S / BEFORE_S >= 5
    ]
    slowest = max((_back_to_90(account, hiccup, p) for p in alone_enough), default=None)
    return {
        "processes": processes,
        "ceiling_used": min(used),
        "worst_fair_share": min(worst, default=1.0),
        "refused_per_accepted": refused / max(1, accepted),
        "longest_wait_s": max(q.longest_wait for q in account.queues),
        "longest_wait_light_s": max((account.queues[p].longest_wait for p in light), default=None),
        "back_to_90_s": back,
        "slowest_process_back_to_90_s": slowest,
        "closes_1013": account.closed(),
    }


def _back_to_90(account: Account, hiccup: tuple[float, float], process: int | None) -> float:
    """Seconds from the hiccup's end until the account (or ``process``) starts at 90 % of its rate
    before the hiccup again: the first moment (in steps of half a second) from which the next
    :data:`RATE_WINDOW_S` hold that many accepted starts (``inf``: not within the run)."""
    before = account.accepted(process, hiccup[0] - BEFORE_S, hiccup[0]) / BEFORE_S
    need = 0.9 * before * RATE_WINDOW_S
    times = sorted(
        s.at for s in account.starts if not s.refused and s.at >= hiccup[1] and process in (None, s.process)
    )
    t, k, j = hiccup[1], 0, 0  # times[k:j]: the accepted starts in [t, t + window)
    while t < account.now - RATE_WINDOW_S:
        while k < len(times) and times[k] < t:
            k += 1
        while j < len(times) and times[j] < t + RATE_WINDOW_S:
            j += 1
        if j - k >= need:
            return t - hiccup[1]
        t += 0.5
    return math.inf


#: How each process's queue is made, by policy: the provider's pacing; a local token bucket that
#: honours Retry-After (the mirror alone, no pace of its own).
POLICIES = ("pacing", "local_bucket")
#: Processes on the account at once, and the seeds of each run.
PROCESSES, QUICK_PROCESSES = (1, 2, 4, 16, 64), (1, 16)
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)


def _factory(policy: str) -> Callable[[int, int, float, random.Random], StartQueue]:
    adapt = policy == "pacing"
    return lambda burst, ceiling, now, rng: StartQueue(burst, ceiling, now=now, rng=rng, adapt=adapt)


def run_all(
    processes: Sequence[int] = PROCESSES, seeds: Sequence[int] = SEEDS, policies: Sequence[str] = POLICIES
) -> dict[str, Any]:
    """Every policy at every process count, over the seeds: per figure the worst run (the longest
    waits and times back; the least ceiling used and fair share; the most refusals)."""
    worst = {"ceiling_used": min, "worst_fair_share": min}
    runs: dict[str, dict[str, Any]] = {}
    for policy in policies:
        for n in processes:
            started = time.perf_counter()
            results = [scale(n, seed=seed, queue=_factory(policy)) for seed in seeds]
            figures = {
                key: (worst.get(key, max))((r[key] for r in results if r[key] is not None), default=None)
                for key in results[0]
                if key != "processes"
            }
            figures["seeds"] = list(seeds)
            figures["seconds"] = round(time.perf_counter() - started, 1)
            runs[f"{policy}_{n}"] = {"policy": policy, "processes": n, **figures}
    return {"runs": runs, "targets": TARGETS}


#: A run of this scenario's pacing against earlier code: the report's 'before'.
BEFORE = Path(__file__).resolve().parent / "results" / "before-sharing.json"


async def run(options: Any) -> dict[str, Any]:
    """The scenario for ``python -m benchmarks`` (``--quick``: 1 and 16 processes, one seed)."""
    result = run_all(QUICK_PROCESSES, QUICK_SEEDS) if options.quick else run_all()
    if BEFORE.exists():
        before = json.loads(BEFORE.read_text(encoding="utf-8"))
        result["before"], result["before_commit"] = before.get("runs", {}), before.get("commit")
    return result


def _figure(value: Any, kind: str) -> str:
    if value is None:
        return DASH
    if kind == "share":
        return f"{value:.0%}"
    if kind == "ratio":
        return f"{value:.2f}"
    return "never" if value == math.inf else f"{value:,.0f} s" if value >= 10 else f"{value:.1f} s"


def section(result: dict[str, Any]) -> list[str]:
    """The results page's table: a row per figure and policy (the provider's pacing before and after,
    a local token bucket), a column per count of processes, each figure beside its target.

    :param result: :func:`run`'s result.
    """
    runs, before, targets = result["runs"], result.get("before") or {}, result["targets"]
    commit = result.get("before_commit")
    figures = (
        ("ceiling used", "ceiling_used", "share", f"≥ {targets['ceiling_used']:.0%}"),
        ("worst process ÷ fair share", "worst_fair_share", "share", f"≥ {targets['worst_fair_share']:.0%}"),
        ("429s per accepted start", "refused_per_accepted", "ratio", f"≤ {targets['refused_per_accepted']}"),
        ("back to 90 % after the hiccup", "back_to_90_s", "time", f"≤ {targets['back_to_90_s']:.0f} s"),
        (
            "slowest process back to 90 %",
            "slowest_process_back_to_90_s",
            "time",
            f"≤ {targets['back_to_90_s']:.0f} s",
        ),
        ("longest wait, light process", "longest_wait_light_s", "time", DASH),
        ("longest wait, any start", "longest_wait_s", "time", DASH),
    )
    counts = [n for n in PROCESSES if any(f"{policy}_{n}" in runs for policy in POLICIES)]
    sources = [
        ("before", before, "pacing"),
        ("after", runs, "pacing"),
        ("local bucket", runs, "local_bucket"),
    ]
    rows = []
    for label, key, kind, target in figures:
        for name, source, policy in sources:
            if not any(f"{policy}_{n}" in source for n in counts):
                continue
            cells = [_figure((source.get(f"{policy}_{n}") or {}).get(key), kind) for n in counts]
            rows.append([f"{label}: {name}", target if name == "before" or not before else "", *cells])
    return [
        "### The account's ceiling shared by 16 and 64 processes (simulation)",
        "",
        "The provider's start pacing (`protocol/starts.py`, the code that runs) on a simulated clock, "
        "each process with its own queue, against one simulated account bucket at the published limits "
        "(burst 5, 60 starts a minute, 429 with the Retry-After of its next token): three in four "
        "processes busy (2 to 6 streams that always have a newer line), one in four light (three streams "
        "asking about a tenth of a fair share); an eighth of the processes leave after an hour and as "
        "many join an hour later; in the last hour the gateway refuses every start for 10 s (a hiccup, "
        "each 429 naming a second). Figures over the three hours less 300 s after each change and the "
        "two minutes after the hiccup; each the worst of seeds "
        f"{', '.join(map(str, runs[next(iter(runs))]['seeds']))}. "
        "*Local bucket*: each process a token bucket at the account's limits that honours the "
        "Retry-After and nothing else (`StartQueue(adapt=False)`)."
        + (f" 'Before' is the pacing of commit `{commit}` on the same simulation." if commit else ""),
        "",
        *md_table(["figure (processes →)", "target", *map(str, counts)], rows),
    ]


def main() -> None:
    """``python -m benchmarks.sharing``: every policy at 1 to 64 processes, as JSON (``--table``:
    the results page's table)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharing")
    parser.add_argument("--processes", type=int, nargs="*", default=list(PROCESSES))
    parser.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
    parser.add_argument("--policy", choices=POLICIES, nargs="*", default=list(POLICIES))
    parser.add_argument("--quick", action="store_true", help="1 and 16 processes, one seed")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (with the commit)")
    parser.add_argument("--table", type=Path, default=None, help="print the table of this JSON file")
    args = parser.parse_args()
    if args.table is not None:
        result = json.loads(args.table.read_text(encoding="utf-8"))
        if BEFORE.exists() and "before" not in result:
            before = json.loads(BEFORE.read_text(encoding="utf-8"))
            result["before"], result["before_commit"] = before.get("runs", {}), before.get("commit")
        print("\n".join(section(result)))
        return
    if args.quick:
        args.processes, args.seeds = list(QUICK_PROCESSES), list(QUICK_SEEDS)
    result = run_all(args.processes, args.seeds, args.policy)
    if args.out is None:
        print(json.dumps(result, indent=2))
        return
    from benchmarks.common import machine

    args.out.write_text(json.dumps({"commit": machine().get("commit"), **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
