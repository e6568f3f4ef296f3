"""Properties of the pure fair queue of decision starts (protocol/starts.py).

A model-driven simulation: streams ask to start decisions about ever newer versions, time passes,
the queue grants, and the gateway accepts a start or answers 429 with a Retry-After. Whatever
the sequence, the queue must keep three promises: a grant is for the stream's newest version, a
Retry-After is honoured once by the whole queue (no start inside it, one start in the window
after it), and no stream waits while another starts twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.starts import GRANT_TTL, StartQueue


@dataclass
class _Sim:
    queue: StartQueue = field(default_factory=StartQueue)
    now: float = 0.0
    newest: dict[int, int] = field(default_factory=dict)  # stream → newest version asked about
    versions: dict[int, int] = field(default_factory=dict)
    starts: list[tuple[float, int, bool]] = field(default_factory=list)  # (time, stream, refused)
    refusals: list[tuple[float, float]] = field(default_factory=list)  # (time, retry_after)
    waiting_since: dict[int, float] = field(default_factory=dict)  # stream → when it began waiting
    overtaken: dict[int, list[int]] = field(default_factory=dict)  # waiting stream → who started meanwhile
    granted: set[int] = field(default_factory=set)

    def ask(self, stream: int) -> bool:
        self.versions[stream] = self.versions.get(stream, 0) + 1
        self.newest[stream] = self.versions[stream]
        started = self.queue.request(stream, self.versions[stream], self.now)
        if started:
            self.granted.discard(stream)
            self.waiting_since.pop(stream, None)
            self.overtaken.pop(stream, None)
        else:
            self.waiting_since.setdefault(stream, self.now)
            self.overtaken.setdefault(stream, [])
        return started

    def outcome(self, stream: int, retry_after: float | None) -> None:
        refused = retry_after is not None
        self.starts.append((self.now, stream, refused))
        if refused:
            self.refusals.append((self.now, retry_after))
            self.queue.refused(stream, self.versions[stream], retry_after, self.now)
            self.waiting_since.setdefault(stream, self.now)
            self.overtaken.setdefault(stream, [])
        else:
            self.queue.accepted(self.now)
            for other, seen in self.overtaken.items():
                if other != stream and not self.queue.holds_grant(other):  # waiting in the queue
                    seen.append(stream)

    def pump(self) -> list[int]:
        granted = []
        while (grant := self.queue.grant(self.now)) is not None:
            assert grant.version == self.newest[grant.stream], "a grant must be for the newest version"
            since = self.waiting_since[grant.stream]
            assert abs(grant.waited - (self.now - since)) < 1e-9 or grant.waited <= self.now - since
            self.granted.add(grant.stream)
            self.overtaken[grant.stream] = []  # its turn came: its wait in the queue is over
            granted.append(grant.stream)
        return granted


_OUTCOMES = st.one_of(st.none(), st.floats(min_value=0.05, max_value=3.0))


@settings(max_examples=100, deadline=None)
@given(st.data(), st.integers(min_value=1, max_value=6))
def test_grants_are_fair_newest_and_honour_retry_after(data: st.DataObject, n: int) -> None:
    sim = _Sim()
    for _ in range(data.draw(st.integers(min_value=5, max_value=60), label="steps")):
        action = data.draw(st.sampled_from(["ask", "advance", "use_grant", "newer"]), label="action")
        if action == "ask":
            stream = data.draw(st.integers(0, n - 1), label="stream")
            if sim.queue.is_waiting(stream) and stream not in sim.granted:
                continue
            if sim.ask(stream):
                sim.outcome(stream, data.draw(_OUTCOMES, label="outcome"))
        elif action == "newer":  # a waiting stream's state changes again: its place is kept
            waiting = sorted(s for s in sim.waiting_since if s not in sim.granted)
            if waiting:
                stream = data.draw(st.sampled_from(waiting), label="newer")
                before = sim.waiting_since[stream]
                assert not sim.ask(stream)
                assert sim.waiting_since[stream] == before
        elif action == "advance":
            wake = sim.queue.wakeup(sim.now)
            step = data.draw(st.floats(min_value=0.0, max_value=2.0), label="dt")
            sim.now = max(sim.now + step, wake if wake is not None and wake < sim.now + 3 else sim.now)
            sim.pump()
            for stream in [s for s in sim.granted if not sim.queue.is_waiting(s)]:
                sim.granted.discard(stream)
        elif sim.granted:  # a granted stream uses its grant (asking again, about its newest version)
            stream = data.draw(st.sampled_from(sorted(sim.granted)), label="granted")
            sim.versions[stream] -= 1  # asks about the same version it was granted for
            if sim.ask(stream):
                sim.outcome(stream, data.draw(_OUTCOMES, label="outcome"))

    # a Retry-After is honoured once by the whole queue: nothing starts inside it, and in the
    # window after it at most the one start that probes the gateway again
    for at, retry_after in sim.refusals:
        inside = [t for t, _, _ in sim.starts if at < t < at + retry_after - 1e-9]
        assert not inside, f"a start at {inside[0]} inside the Retry-After of {at} + {retry_after}"
        after = [t for t, _, _ in sim.starts if at + retry_after - 1e-9 <= t < at + 2 * retry_after - 1e-9]
        assert len(after) <= 1, f"{len(after)} starts in the window after the Retry-After of {at}"
    # no starvation: while a stream waits, no other stream starts (and is accepted) twice
    for stream, seen in sim.overtaken.items():
        assert len(seen) == len(set(seen)), f"stream {stream} waited while {seen} started"


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=2, max_value=12),
    st.lists(_OUTCOMES, min_size=20, max_size=120),
)
def test_every_stream_is_granted_within_one_round(n: int, outcomes: list[float | None]) -> None:
    """Every stream keeps wanting a decision; each one is granted before any other starts twice,
    and within a bound of time: the streams ahead of it times the largest gap between starts."""
    sim = _Sim()
    results = iter(outcomes)
    longest_gap = 0.0
    last_start = 0.0

    def keep_asking(stream: int) -> None:
        nonlocal longest_gap, last_start
        while sim.ask(stream):  # it wants the next decision as soon as one started
            longest_gap = max(longest_gap, sim.now - last_start)
            last_start = sim.now
            outcome = next(results, "end")
            if outcome == "end":
                return
            sim.outcome(stream, outcome)  # type: ignore[arg-type]
            if sim.queue.is_waiting(stream):
                return

    for stream in range(n):
        keep_asking(stream)
    for _ in range(len(outcomes)):
        wake = sim.queue.wakeup(sim.now)
        if wake is None:
            break  # nothing waits: the gateway accepted everything at once
        sim.now = max(sim.now, wake)
        for stream in sim.pump():
            keep_asking(stream)
    for stream, seen in sim.overtaken.items():
        assert len(seen) == len(set(seen)), f"stream {stream} waited while {seen} started"
    for stream, since in sim.waiting_since.items():
        assert sim.now - since <= (n + 1) * max(longest_gap, GRANT_TTL) + 1e-6, (stream, since, sim.now)


def test_unlimited_until_a_429() -> None:
    queue = StartQueue()
    assert all(queue.request(s, 1, 0.0) for s in range(20))
    assert queue.waiting == 0 and not queue.limited


def test_a_429_holds_every_stream_once_then_one_at_a_time() -> None:
    queue = StartQueue()
    assert queue.request("a", 1, 0.0)
    queue.refused("a", 1, 2.0, 0.1)
    assert not queue.request("b", 1, 0.5) and not queue.request("c", 1, 0.6)
    assert queue.grant(2.0) is None  # still inside the Retry-After (0.1 + 2.0)
    grant = queue.grant(2.1)
    assert grant is not None and grant.stream == "a"  # the refused stream keeps the front
    assert queue.grant(2.1) is None  # one start per window
    assert queue.request("b", 3, 2.2) is False  # a newer version keeps b's place
    assert queue.request("a", 1, 2.2)
    queue.accepted(2.3)
    assert queue.grant(4.1) is None  # a pace after a's start (2.2 + 2.0)
    grant = queue.grant(4.2)
    assert grant is not None and (grant.stream, grant.version) == ("b", 3)


def test_an_unused_grant_loses_its_turn() -> None:
    queue = StartQueue()
    queue.refused("x", 1, 1.0, 0.0)
    assert not queue.request("a", 1, 0.1) and not queue.request("b", 1, 0.2)
    assert queue.grant(1.0).stream == "x"  # type: ignore[union-attr]
    queue.withdraw("x")
    assert queue.grant(1.0) is None
    grant = queue.grant(2.5)
    assert grant is not None and grant.stream == "a"
    grant = queue.grant(2.5 + GRANT_TTL + 2.0)  # a never used it: b's turn, a waits behind
    assert grant is not None and grant.stream == "b"
