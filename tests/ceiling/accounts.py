"""A simulated account: processes, each with its :class:`StartQueue` and its streams, against one
gateway bucket (the emulator's own :class:`TokenBucket`), on a simulated clock.

Lines arrive on streams (each line a newer version of its stream's state); a stream with an
undecided version asks its process's queue for a start, starts on its newest version when the
queue lets it, and the gateway takes a token when the start arrives (a latency later) or answers
429 with the time to its next token. on_request a refused stream asks again (the queue holds it
first). on_change the gateway retries the start by itself after the Retry-After, and closes the
connection (1013) at the third refusal in a row for one version, as WIRE.md §5 says; the stream
gives that connection back as soon as it hears a 429 and asks for its turn again (the gateway's
retry happens only when it comes before the close reaches the gateway). Everything that happens
is recorded for the tests to check.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_systemzero.protocol.ratelimit import TokenBucket
from airflow_provider_systemzero.protocol.starts import StartQueue

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


@dataclass
class Account:
    """The simulation (see the module docstring).

    :param processes: how many processes share the account.
    :param ceiling: the account's starts a second.
    :param burst: the account's burst.
    :param latency: seconds a start takes to reach the gateway (and its answer to come back),
        each drawn between half and one and a half times this.
    :param on_change: the gateway retries a refused start by itself.
    :param seed: the random seed.
    """

    processes: int
    ceiling: float = 1.0
    burst: int = 5
    latency: float = 0.01
    on_change: bool = False
    seed: int = 0
    starts: list[Start] = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.bucket = TokenBucket(self.ceiling, self.burst, 0.0)
        self.queues = [
            StartQueue(self.burst, round(self.ceiling * 60), rng=random.Random(self.seed * 31 + p))
            for p in range(self.processes)
        ]
        for queue in self.queues:  # each process heard the gateway's hello
            queue.adopt(self.burst, round(self.ceiling * 60), 0.0)
        self.streams: dict[Key, _Stream] = {}
        self._events: list[tuple[float, int, str, Key, Any]] = []
        self._order = itertools.count()
        self._timers: list[float | None] = [None] * self.processes
        self._saturated_until = -1.0

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

    def accepted(self, process: int | None = None, since: float = 0.0) -> int:
        """Accepted starts (of ``process``, or all) that reached the gateway at ``since`` or later."""
        return sum(
            1
            for s in self.starts
            if not s.refused and s.at >= since and (process is None or s.process == process)
        )

    def refused(self, since: float = 0.0) -> int:
        """429s the gateway answered from ``since`` on."""
        return sum(1 for s in self.starts if s.refused and s.at >= since)

    def undecided(self) -> list[Key]:
        """Streams whose newest line no accepted start covers."""
        return [key for key, s in self.streams.items() if s.decided < s.newest]

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

    def _on_line(self, key: Key, _value: Any) -> None:
        stream = self.streams.setdefault(key, _Stream())
        stream.newest += 1
        queue = self.queues[key[0]]
        if queue.is_waiting(key):
            queue.changed(key, stream.newest, self.now)
        else:
            self._ask(key)

    def _ask(self, key: Key) -> None:
        stream = self.streams[key]
        if stream.closed or stream.flight is not None or stream.decided >= stream.newest:
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
        refused = not self.bucket.try_take(self.now)
        self.starts.append(
            Start(self.now, self.now if retry else flight.sent, key[0], key, flight.version, refused, retry)
        )
        answer = self.now + self._delay()
        if not refused:
            stream.refusals[flight.connection] = 0
            self._push(answer, "accepted", key, flight)
            return
        retry_after = max(0.001, self.bucket.delay(self.now))
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
        self.queues[key[0]].accepted(self.now)
        if self.now < self._saturated_until:
            self._on_line(key, None)  # saturated: a newer line is always there
        self._ask(key)

    def _on_refused(self, key: Key, answer: tuple[_Flight, float]) -> None:
        flight, retry_after = answer
        stream = self.streams[key]
        if stream.flight is not flight:
            return  # a refused retry on a connection already given back
        stream.flight = None
        if self.on_change:  # give the connection back: its close reaches the gateway a latency later
            self._push(self.now + self._delay(), "close", key, flight.connection)
            stream.connection += 1  # the next start goes on a new connection
        self.queues[key[0]].refused(key, stream.newest, retry_after, self.now)
        self._wake_at(key[0])
        self._ask(key)


def fair_shares(account: Account, since: float) -> list[float]:
    """Each process's accepted starts from ``since`` on ÷ its fair share of them (the account's
    accepted starts ÷ the processes)."""
    total = account.accepted(since=since)
    fair = total / account.processes
    return [account.accepted(p, since) / fair if fair else 1.0 for p in range(account.processes)]


def conforms(times: Sequence[float], ceiling: float, burst: int) -> bool:
    """Whether starts at ``times`` (in order) never exceed a bucket of ``burst`` refilled at
    ``ceiling`` a second that starts full: none of them would be refused."""
    bucket = TokenBucket(ceiling, burst, 0.0)
    return all(bucket.try_take(at) for at in times)
