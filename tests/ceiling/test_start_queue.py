"""The account's decision starts as one process sees them (protocol/starts.py), on a simulated clock.

The rules one at a time, then properties over a simulated account (benchmarks/sharing.py):
alone, the mirror never lets a process start more than the published burst and ceiling allow (so
the gateway never refuses it); a 429 with a Retry-After still slows it; over one to four
processes and random lines every undecided line gets a start and none goes to a superseded
state; pacing alone never gets the gateway's own retry refused three times in a row; processes
sharing the account each get a fair part of it, with few 429s.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.starts import (
    CAP_MARGIN,
    GRANT_TTL,
    HELLO_WAIT,
    JITTER,
    MAX_REFUSED_WAIT,
    MIN_REFUSED_WAIT,
    PATIENCE_UNITS,
    QUIET_UNITS,
    RETRY_HEADSTART,
    SHARE_FULL,
    StartQueue,
)
from benchmarks.sharing import Account, conforms, fair_shares


def _heard(burst: int = 5, ceiling_per_minute: int = 60, *, rng: random.Random) -> StartQueue:
    """A queue that heard the gateway's hello (the account's limits are known)."""
    queue = StartQueue(burst, ceiling_per_minute, rng=rng)
    queue.adopt(burst, ceiling_per_minute, 0.0)
    return queue


def _next_start(queue: StartQueue, stream: object, version: int, now: float) -> float:
    """The time ``stream`` gets its start (asking, then granted), from ``now`` on."""
    if queue.request(stream, version, now):
        return now
    while (grant := queue.grant(now)) is None or grant.stream != stream:
        wake = queue.wakeup(now)
        assert wake is not None, "a waiting stream with nothing to wake it"
        now = max(now, wake)
    assert queue.request(stream, version, now)
    return now


# ------------------------------------------------------------------ the mirror, alone


def test_alone_the_burst_goes_at_once_then_one_start_a_gap() -> None:
    queue = _heard(5, 60, rng=random.Random(1))
    assert all(queue.request(s, 1, 0.0) for s in range(4))  # the burst, less the margin
    assert not queue.request(4, 1, 0.0)
    times = [_next_start(queue, s, 1, 0.0) for s in range(4, 10)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.5 <= gap <= 1.5 for gap in gaps), gaps  # a gap each, give or take the jitter
    assert times[-1] == pytest.approx(5 + CAP_MARGIN, abs=JITTER)
    assert conforms([0.0] * 4 + times, 1.0, 5) and not queue.limited and queue.rate_limited == 0


@settings(max_examples=60, deadline=None)
@given(
    processes_streams=st.integers(1, 12),
    lines=st.lists(st.tuples(st.floats(0, 60), st.integers(0, 11)), min_size=1, max_size=80),
    ceiling=st.sampled_from([1.0, 20.0]),
    burst=st.sampled_from([1, 2, 5]),
    latency=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**16),
)
def test_alone_the_mirror_never_exceeds_the_burst_or_the_ceiling(
    processes_streams: int,
    lines: list[tuple[float, int]],
    ceiling: float,
    burst: int,
    latency: float,
    seed: int,
) -> None:
    """One process alone on its account, lines arriving at random on its streams: what it sends
    never exceeds the account's burst and ceiling (a bucket refilled at the ceiling that starts
    full would accept every start at the moment it was sent), and every line is decided. With a
    burst of two or more the gateway refuses none, a start taking up to 0.45 of a gap to arrive
    (the mirror's margin: half a gap). With a burst of one there is no room for a margin: a start
    that takes longer to arrive than the next one may be refused, and the mirror learns from it."""
    account = Account(1, ceiling=ceiling, burst=burst, latency=latency / ceiling, seed=seed)
    for at, stream in lines:
        account.line(at / ceiling, 0, stream % processes_streams)
    account.run(until=(60 + 2 * len(lines) + QUIET_UNITS + 10) / ceiling)
    assert conforms(sorted(s.sent for s in account.starts if not s.retry), ceiling, burst)
    assert account.undecided() == []
    if burst > 1:
        assert account.refused() == 0


# ------------------------------------------------------------------ 429s


@settings(max_examples=60, deadline=None)
@given(
    retry_after=st.floats(0.001, 2.0),
    at=st.floats(0.0, 10.0),
    requeue=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_429_with_retry_after_still_slows_it(
    retry_after: float, at: float, requeue: bool, seed: int
) -> None:
    """Another process spent the account: after a 429 nothing starts before its Retry-After is over
    (on_change not before a gap after it either: the gateway's own retry takes that token); at a
    second 429 the process counts as sharing the account and starts fewer than the ceiling allows
    until it has heard no 429 for a while."""
    queue = _heard(5, 60, rng=random.Random(seed))
    assert queue.request("a", 1, at)
    queue.refused("a", 1, retry_after, at + 0.01, requeue=requeue)
    heard = at + 0.01
    start = _next_start(queue, "a" if requeue else "b", 2, heard)
    assert start >= heard + retry_after - 1e-9
    if not requeue:
        assert start >= heard + retry_after + 1.0 - 1e-9
    assert not queue.limited  # one 429 alone may be its own start, slow to reach the gateway
    queue.accepted(start)  # another start got through: the next 429 is not the same run of them
    queue.refused("a" if requeue else "b", 2, retry_after, start + 0.01, requeue=requeue)
    assert queue.limited and queue.rate < queue.ceiling
    second = start + 0.01
    now = _next_start(queue, "c", 1, second)
    assert now >= second + retry_after - 1e-9
    # the next minute: fewer starts than the ceiling (a start a second) allows, none refused
    begin, starts = now, 1
    while now < begin + 60:
        now = _next_start(queue, ("c", starts), 1, now)
        starts += 1
    assert starts < 55
    # alone again once no 429 came for QUIET_UNITS gaps: the ceiling's pace
    now = second + retry_after + QUIET_UNITS + 1
    times = [_next_start(queue, ("d", k), 1, now) for k in range(30)]
    assert not queue.limited and times[-1] - times[0] < 30


def test_each_retry_after_slows_the_process_once() -> None:
    """The 429s of starts already on their way when the first one was heard cut nothing more."""
    queue = _heard(5, 60, rng=random.Random(3))
    assert all(queue.request(s, 1, 0.0) for s in "abcd")  # four starts go out before any answer
    queue.refused("a", 1, 1.0, 0.1)
    rate = queue.rate
    for stream in "bcd":  # the gateway refused them too, for the same reason
        queue.refused(stream, 1, 0.9, 0.12)
    assert queue.rate == rate and queue.rate_limited == 4
    assert queue.blocked_until == pytest.approx(1.1 + RETRY_HEADSTART)  # the first one's Retry-After


def test_a_429_cuts_a_process_by_the_share_it_takes() -> None:
    """The process taking most of the account slows down by a third; one far below its share by
    that part of the third (its share ÷ SHARE_FULL)."""
    big, small = _heard(5, 60, rng=random.Random(1)), _heard(5, 60, rng=random.Random(2))
    for queue in (big, small):
        queue.refused("x", 1, 1.0, 0.0)
        queue.accepted(1.0)
        queue.refused("x", 1, 1.0, 2.0)  # a second 429, after an accepted start: shared from now on
        queue.withdraw("x")
        assert queue.limited
    for k in range(10):
        big.accepted(10.0 + k)  # a start a gap: the whole ceiling
    small.accepted(15.0)  # one start in ten gaps
    assert big.share(20.0) == pytest.approx(0.9) and small.share(20.0) == pytest.approx(0.1)
    big.tokens(20.0), small.tokens(20.0)
    before = big.rate
    assert small.rate == pytest.approx(before)  # the same recovery: by time, not by starts
    big.refused("x", 2, 0.5, 20.0, requeue=False)
    small.refused("x", 2, 0.5, 20.0, requeue=False)
    assert big.rate == pytest.approx(before / 1.5)
    assert small.rate == pytest.approx(before / (1 + 0.5 * 0.1 / SHARE_FULL))


def test_a_local_bucket_honours_retry_after_and_never_paces_itself() -> None:
    """``adapt=False``, the mirror alone: a 429 holds the next start until its Retry-After is
    over, and however many 429s come the process keeps the ceiling's pace."""
    queue = StartQueue(5, 60, rng=random.Random(6), adapt=False)
    queue.adopt(5, 60, 0.0)
    now = 0.0
    for k in range(6):
        assert queue.request(("s", k), 1, now) or _next_start(queue, ("s", k), 1, now) >= now
        queue.refused(("s", k), 1, 1.0, now + 0.01)
        queue.withdraw(("s", k))
        assert _next_start(queue, ("t", k), 1, now + 0.01) >= now + 1.01 - 1e-9
        queue.accepted(now + 1.2)
        now += 2.0
    assert not queue.limited and queue.rate == queue.ceiling


def test_429s_naming_no_delay_are_asked_again_ever_more_slowly() -> None:
    """A gateway answering 429 with Retry-After 0 over and over: the waits double from
    MIN_REFUSED_WAIT up to MAX_REFUSED_WAIT; an accepted start ends the run."""
    queue, now, waits = _heard(rng=random.Random(4)), 0.0, []
    assert queue.request("s", 1, now)
    for _ in range(10):
        queue.refused("s", 1, 0.0, now)
        waits.append(max(0.0, queue.blocked_until - now - RETRY_HEADSTART))
        now = _next_start(queue, "s", 1, max(now, queue.blocked_until))
    assert waits[:3] == pytest.approx([0.0, MIN_REFUSED_WAIT, 2 * MIN_REFUSED_WAIT])
    assert waits[-1] == pytest.approx(MAX_REFUSED_WAIT)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(waits))
    queue.accepted(now)
    queue.refused("s", 1, 0.0, now)
    assert queue.blocked_until == pytest.approx(now + RETRY_HEADSTART)  # a run of refusals starts over


# ------------------------------------------------------------------ who goes first


def _limited(now: float = 0.0) -> StartQueue:
    """A queue whose mirror is empty at ``now`` (a 429 said the next token is a gap away)."""
    queue = _heard(5, 60, rng=random.Random(5))
    queue.refused("x", 1, 1.0, now)
    queue.withdraw("x")
    return queue


def test_the_stream_whose_newest_change_waited_longest_goes_first() -> None:
    queue = _limited()
    assert not queue.request("a", 1, 0.1)  # a's first change
    assert not queue.request("b", 1, 0.2)
    queue.changed("a", 2, 0.3)  # a changed again: its state is newer than b's
    order = []
    now = 0.3
    while len(order) < 2:
        now = queue.wakeup(now) or now
        grant = queue.grant(now)
        if grant is not None:
            order.append((grant.stream, grant.version))
            assert queue.request(grant.stream, grant.version, now)
    assert order == [("b", 1), ("a", 2)]  # the grant is for a's newest version


def test_a_stream_that_never_settles_is_still_decided() -> None:
    """A stream changing every moment counts as settled PATIENCE_UNITS gaps after its first
    undecided change: it goes before the newer changes of streams that came after that."""
    queue = _limited()
    assert not queue.request("busy", 1, 0.0)
    for k in range(1, 400):
        queue.changed("busy", k + 1, float(k))  # a change every gap, for good
    assert not queue.request("late", 1, PATIENCE_UNITS + 50.0)
    grant = queue.grant(PATIENCE_UNITS + 60.0)
    assert grant is not None and grant.stream == "busy"


def test_a_refused_stream_goes_first_and_an_unused_grant_gives_its_token_back() -> None:
    queue = _limited()
    assert not queue.request("a", 1, 0.1) and not queue.request("b", 1, 0.2)
    now = queue.wakeup(0.2) or 0.2
    grant = queue.grant(now)
    assert grant is not None and grant.stream == "a"
    tokens = queue.tokens(now)
    queue.withdraw("a")  # a closed before it used its grant: the token is there again
    assert queue.tokens(now) == pytest.approx(tokens + 1)
    now = queue.wakeup(now) or now
    grant = queue.grant(now)
    assert grant is not None and grant.stream == "b"
    assert queue.request("b", 1, now)
    queue.refused("b", 1, 1.0, now + 0.01)
    assert not queue.request("c", 1, now + 0.02)
    now = queue.wakeup(now + 0.02) or now
    grant = queue.grant(now)
    assert grant is not None and grant.stream == "b"  # refused: first again, before c
    # unused for GRANT_TTL: the token goes back and b waits again, behind nobody it overtook
    assert queue.grant(now + GRANT_TTL) is None or queue.holds_grant("b")
    assert queue.is_waiting("b")


@pytest.mark.parametrize("at_once", [True, False], ids=["counted at once", "granted"])
def test_a_start_that_waits_for_a_socket_gives_its_token_back_and_goes_first(at_once: bool) -> None:
    """A stream let start whose connection must wait for a socket: had its token stayed spent,
    its start would reach the gateway long after the mirror counted it, closer to the next ones
    than the gateway's bucket allows. The token goes back, and the stream goes first once it asks
    again, for its newest version."""
    queue = _heard(5, 60, rng=random.Random(7))
    if at_once:
        assert queue.request("a", 1, 0.0)
        now = 0.0
    else:
        assert all(queue.request(s, 1, 0.0) for s in range(4))  # the burst, less the margin
        assert not queue.request("a", 1, 0.0)
        now = queue.wakeup(0.0) or 0.0
        grant = queue.grant(now)
        assert grant is not None and grant.stream == "a"
    starts, tokens = queue.starts, queue.tokens(now)
    queue.postpone("a", 2, now, counted=at_once)
    assert queue.tokens(now) == pytest.approx(tokens + 1)
    assert queue.starts == starts - (1 if at_once else 0)  # a start counted at once is not made
    assert queue.is_waiting("a") and not queue.holds_grant("a")
    assert not queue.request("b", 1, now)  # a newcomer waits behind it
    later = queue.wakeup(now)
    assert later is not None
    grant = queue.grant(later)
    assert grant is not None and (grant.stream, grant.version) == ("a", 2)
    assert queue.request("a", 2, later)


def test_postponing_a_stream_that_was_let_through_nothing_changes_nothing() -> None:
    queue = _heard(5, 60, rng=random.Random(8))
    tokens = queue.tokens(1.0)
    queue.postpone("a", 1, 1.0)
    assert queue.tokens(1.0) == tokens and not queue.is_waiting("a")


def test_the_gateway_retry_of_an_on_change_start_is_owed_its_token() -> None:
    queue = _heard(5, 60, rng=random.Random(6))
    queue.refused("a", 1, 0.4, 0.0, requeue=False)  # the gateway retries a at 0.4
    assert queue.tokens(0.4) == pytest.approx(1 - 0.4 - 1 + 0.4)  # its token: the retry's
    assert _next_start(queue, "b", 1, 0.0) >= 1.4 - 1e-9  # b's start waits for the next one


def test_before_the_first_hello_one_start_goes_at_a_time() -> None:
    """An on_change start goes before its connection's hello: until a hello says the account's
    limits, the next start waits for it (HELLO_WAIT at most), then the advertised burst goes."""
    queue = StartQueue(rng=random.Random(8))
    assert queue.request("a", 1, 0.0)
    assert not queue.request("b", 1, 0.0) and not queue.request("c", 1, 0.0)
    assert queue.wakeup(0.0) == pytest.approx(HELLO_WAIT)  # no hello at all: it goes anyway then
    queue.adopt(2, 60, 0.01)  # a's connection heard hello: a burst of two (one of them a's)
    now = queue.wakeup(0.01)
    assert now is not None and now <= 0.01 + CAP_MARGIN + JITTER  # b takes the second, less the margin
    grant = queue.grant(now)
    assert grant is not None and grant.stream == "b" and queue.grant(now) is None


def test_limits_a_gateway_advertises_are_the_mirror_s() -> None:
    queue = _heard(rng=random.Random(7))
    queue.adopt(2, 1200, 0.0)  # a gateway 20 × faster, with a burst of two
    assert queue.unit == pytest.approx(0.05)
    times = [_next_start(queue, s, 1, 0.0) for s in range(20)]
    assert times[-1] < 20 * 0.05 * 1.6 and conforms(times, 20.0, 2)


# ------------------------------------------------------------------ properties of a shared account


@settings(max_examples=40, deadline=None)
@given(
    processes=st.integers(1, 4),
    streams=st.integers(1, 6),
    lines=st.lists(
        st.tuples(st.floats(0, 100), st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=120
    ),
    ceiling=st.sampled_from([1.0, 20.0]),
    latency=st.floats(0.0, 0.3),
    on_change=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_undecided_line_gets_a_start_and_none_a_superseded_state(
    processes: int,
    streams: int,
    lines: list[tuple[float, int, int]],
    ceiling: float,
    latency: float,
    on_change: bool,
    seed: int,
) -> None:
    """One to four processes on one account, lines arriving at random: every stream's newest line
    is decided in the end, every grant is for its stream's newest version (the simulation checks
    each one), and the gateway's retry rule never closes a stream."""
    account = Account(processes, ceiling=ceiling, latency=latency / ceiling, on_change=on_change, seed=seed)
    for at, process, stream in lines:
        account.line(at / ceiling, process % processes, stream % streams)
    account.run(until=(100 + QUIET_UNITS + 4 * len(lines) + 50) / ceiling)
    assert account.undecided() == []
    assert account.closed() == 0


#: The account of a simulation: its ceiling (a start a second, or twenty), the latency in gaps, the seed.
_ACCOUNT = {
    "ceiling": st.sampled_from([1.0, 20.0]),
    "latency": st.floats(0.0, 0.3),
    "seed": st.integers(0, 2**16),
}


@settings(max_examples=30, deadline=None)
@given(processes=st.integers(1, 4), streams=st.integers(1, 8), **_ACCOUNT)
def test_pacing_alone_never_gets_a_retry_refused_three_times(
    processes: int, streams: int, ceiling: float, latency: float, seed: int
) -> None:
    """on_change, every stream of one to four processes always has a newer line: none is closed
    with 1013 by the gateway's retry rule (three refusals in a row for one version on one
    connection: a 429'd stream gives its connection back before the gateway's own retry and asks
    for its turn again), and a process alone hears no 429 at all."""
    account = Account(processes, ceiling=ceiling, latency=latency / ceiling, on_change=True, seed=seed)
    account.keep_busy(streams, until=400 / ceiling)
    account.run(until=400 / ceiling)
    assert account.closed() == 0
    assert max((n for s in account.streams.values() for n in s.refusals.values()), default=0) < 3
    if processes == 1:
        assert account.refused() == 0 and account.most_refusals_in_a_row() == 0


@settings(max_examples=20, deadline=None)
@given(processes=st.integers(2, 4), streams=st.integers(2, 8), **_ACCOUNT)
def test_processes_share_the_ceiling(
    processes: int, streams: int, ceiling: float, latency: float, seed: int
) -> None:
    """Two to four processes, each with more streams waiting than the ceiling serves, told nothing
    but the 429s: each gets a fair part of the account's starts, the ceiling is used, and the
    429s stay a small fraction of the starts. (The benchmark measures how fair and how few over a
    longer run: `python -m benchmarks --only ceiling`.)"""
    account = Account(processes, ceiling=ceiling, latency=latency / ceiling, seed=seed)
    account.keep_busy(streams, until=1500 / ceiling)
    account.run(until=1500 / ceiling)
    since = 100 / ceiling
    shares = fair_shares(account, since)
    assert min(shares) >= 0.6, f"parts of the fair share {shares}"
    used = account.accepted(since=since) / (1500 - 100)
    assert used >= 0.9, f"the ceiling was {used:.0%} used"
    assert account.refused() <= 0.25 * account.accepted(), "a retry storm"


# ------------------------------------------------------------------ a hiccup: every start refused a while


def test_a_process_alone_has_its_whole_ceiling_back_right_after_a_hiccup() -> None:
    """20 streams of one process always have a newer line; the gateway refuses every start for ten
    seconds (each 429 naming a gap). From ten seconds after the hiccup's end the process starts at
    90 % of the ceiling or more again, and is not refused: it never had company."""
    account = Account(1, seed=3, hiccups=[(600.0, 610.0)])
    account.keep_busy(20, until=700.0)
    account.run(until=700.0)
    assert account.refused(600.0, 610.5) >= 6  # the hiccup refused it six times or more
    assert account.accepted(since=620.0, until=680.0) >= 0.9 * 60
    assert account.refused(since=611.0) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_processes_sharing_the_account_take_it_back_right_after_a_hiccup(seed: int) -> None:
    """Two busy processes share the account; the gateway refuses every start for ten seconds. From
    ten seconds after the hiccup's end the account is used at 90 % of its ceiling or more, and each
    process has a fair part of it: the hiccup cut neither for good."""
    account = Account(2, seed=seed, hiccups=[(1200.0, 1210.0)])
    account.keep_busy(4, until=1300.0)
    account.run(until=1300.0)
    assert account.accepted(since=1220.0, until=1280.0) >= 0.9 * 60
    assert min(fair_shares(account, 1220.0, 1280.0)) >= 0.6
