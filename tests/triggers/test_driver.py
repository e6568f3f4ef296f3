"""The driver of a trigger's watch, against a stream and a source the test controls (no network):
a decision reaches the driver's own task from the stream's reader; only a decision about what the
source holds now is judged (a read under way first); a waiter gets a quiet stream's slot at once;
a cancellation propagates; and after ``aclose()`` nothing of the run is left — whatever happened
before (a hypothesis property over random runs, which also bounds the driver's wake-ups per input:
it never spins).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.source_watch import SourceWatch
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.sources.base import StateSource
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.triggers.driver import WatchDriver
from tests.policy.test_watch import _decision


class _Source(StateSource):
    """A source the test changes; a read can be held (as a slow read in a thread would be)."""

    def __init__(self, state: Any = "waiting\n") -> None:
        self.state = state
        self.waiters: list[asyncio.Future[None]] = []
        self.release_read: asyncio.Event | None = None  # set: reads wait for it
        self.reads = 0
        self.closed = False

    def set(self, state: Any) -> None:
        self.state = state
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()

    async def read(self) -> Any:
        self.reads += 1
        state = self.state
        if self.release_read is not None:
            await self.release_read.wait()
        return state

    def changed(self) -> asyncio.Future[None]:
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        return waiter

    async def aclose(self) -> None:
        self.closed = True


class _Stream:
    """The part of a DecisionStream the driver uses; the test delivers decisions as the stream's
    reader would (queued, then the one waiter resolved)."""

    stream_id = "s"

    def __init__(self, state: Any, capacity: StreamCapacity) -> None:
        self.state = state
        self.state_version = 1
        self.in_sync = True
        self.capacity = capacity
        self.queued: deque[DecisionResult] = deque()
        self.waiter: asyncio.Future[Any] | None = None
        self.closing = self.closed = False

    def close_soon(self) -> None:
        self.closing = True

    async def aclose(self) -> None:
        self.closed = True

    def take_decision(self) -> DecisionResult | None:
        return self.queued.popleft() if self.queued else None

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        self.waiter = waiter
        if self.queued:
            self._wake()

    def deliver(self, decision: DecisionResult) -> None:
        self.queued.append(decision)
        self._wake()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def set_state(self, state: Any) -> None:
        if state != self.state:
            self.state = state
            self.state_version += 1

    @property
    def state_hash(self) -> str:
        return state_hash(self.state)


class _Streams:
    """The trigger's streams, as the driver sees them: every stream built is a :class:`_Stream`."""

    def __init__(self, capacity: StreamCapacity | None = None) -> None:
        self.capacity = capacity or StreamCapacity(4)
        self.built: list[_Stream] = []
        self.stream: _Stream | None = None

    async def resolve_settings(self) -> None:
        return None

    def opening(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.capacity.opening()

    def build(self, state: Any, **kwargs: Any) -> _Stream:
        self.stream = _Stream(state, self.capacity)
        self.built.append(self.stream)
        return self.stream

    async def enter(self, stream: _Stream) -> None:
        await asyncio.sleep(0)

    async def close(self, stream: _Stream, *, grace: float = 5.0) -> None:
        if self.stream is stream:
            self.stream = None
        await stream.aclose()


class _CountingDriver(WatchDriver):
    """A driver that counts its turns (how often it collected what completed)."""

    __slots__ = ("turns",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.turns = 0

    def _collect(self, now: float) -> None:
        self.turns += 1
        super()._collect(now)


def _driver(source: _Source, streams: _Streams, *, lease_after: float = 3600.0) -> _CountingDriver:
    watch = SourceWatch(
        DecisionWatch(DecisionCondition("ready", True), reviews=False),
        decision_mode="on_change",
        lease_after=lease_after,
    )
    return _CountingDriver(watch, source, streams)  # type: ignore[arg-type]


async def _until(condition: Callable[[], object], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the condition did not hold within {within} s")
        await asyncio.sleep(0)


async def _held(streams: _Streams) -> _Stream:
    """The stream the driver opened, once it waits for its decisions."""
    await _until(lambda: streams.stream is not None and streams.stream.waiter is not None)
    assert streams.stream is not None
    return streams.stream


async def test_the_streams_reader_wakes_the_drivers_own_task() -> None:
    source, streams = _Source(), _Streams()
    driver = _driver(source, streams)
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    # nothing runs but the waiting task: it awaits the very future the reader resolves
    assert asyncio.all_tasks() - before == {waiting}
    assert waiting._fut_waiter is stream.waiter  # type: ignore[attr-defined]
    stream.deliver(_decision(True, version=1))
    await asyncio.sleep(0)  # one loop turn: the waiting task runs, judges and returns
    assert waiting.done() and waiting.result().decision.state_version == 1
    await driver.aclose()


async def test_a_superseded_decision_is_dropped_and_the_newest_state_decides() -> None:
    source, streams = _Source(), _Streams()
    driver = _driver(source, streams)
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    source.set("waiting\nstep 1\n")
    await _until(lambda: stream.state == "waiting\nstep 1\n")  # the change reached the stream (version 2)
    stream.deliver(_decision(True, version=1))  # met, but about the superseded state
    await _until(lambda: stream.waiter is not None)
    assert not waiting.done()
    stream.deliver(_decision(True, version=2))
    async with asyncio.timeout(5):
        verdict = await waiting
    assert verdict.decision.state_version == 2 and verdict.state == "waiting\nstep 1\n"
    await driver.aclose()


async def test_several_decisions_in_one_wake_up_are_all_judged_in_order() -> None:
    source, streams = _Source(), _Streams()
    driver = _driver(source, streams)
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    stream.queued.extend([_decision(False, version=1), _decision(True, version=1)])
    stream.deliver(_decision(False, version=1))  # read before the task ran, all three
    async with asyncio.timeout(5):
        verdict = await waiting
    assert verdict.decision.reply_id == "szd_1" and verdict.decision.answers["ready"].decision is True
    await driver.aclose()


async def test_a_decision_waits_for_the_read_under_way_and_is_not_judged_once_the_source_changed() -> None:
    source, streams = _Source(), _Streams()
    driver = _driver(source, streams)
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    source.release_read = asyncio.Event()  # the next read is slow
    source.set("waiting\nFAILED\n")  # the source moved on: the driver starts reading it
    await _until(lambda: source.reads == 2)
    stream.deliver(_decision(True, version=1))  # met, about the state before the change
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiting.done()  # not judged while the read runs
    source.release_read.set()
    await _until(lambda: stream.state == "waiting\nFAILED\n")
    assert not waiting.done()  # judged against the newest read: superseded
    stream.deliver(_decision(False, version=2))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await driver.aclose()


async def test_a_quiet_stream_gives_its_slot_back_at_once_when_a_waiter_queues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()  # the driver's stream holds the one slot
    source, streams = _Source(), _Streams(capacity)
    driver = _driver(source, streams)  # an hour of lease_after: only a waiter makes it go
    caplog.set_level("INFO", logger="airflow_provider_systemzero.decisions.source_watch")
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    stream.deliver(_decision(False, version=1))  # judged, not met: the stream owes nothing
    await _until(lambda: capacity.offered == 1)
    other = asyncio.ensure_future(capacity.acquire())  # another trigger wants a slot
    await _until(lambda: stream.closing)
    assert "another stream waits for a slot: giving the stream back" in caplog.text
    capacity.release()  # the close completes
    async with asyncio.timeout(5):
        await other
    assert not waiting.done() and driver.dormant
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await driver.aclose()
    capacity.release()
    assert capacity.offered == 0


async def test_a_billed_start_comes_before_its_decision_in_the_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway timed the decision at 0 ms (it reports whole milliseconds): its billed start,
    back-dated by nothing, still comes before the decision in the wait's history. Every clock
    reading here is a millisecond after the one before, so a start read after its decision
    would follow it."""
    ticks = itertools.count(1_800_000_000.0, 0.001)
    monkeypatch.setattr(time, "time", lambda: next(ticks))
    rules = DecisionWatch(DecisionCondition("ready", True), reviews=False, clock=time.time)
    watch = SourceWatch(rules, decision_mode="on_change", timeline=rules.timeline, question="ready")
    source, streams = _Source(), _Streams()
    driver = WatchDriver(watch, source, streams)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    stream.usage = SimpleNamespace(reply_ids={"szd_1"})  # billed when it arrived
    decision = _decision(True, version=1)
    assert (decision.queue_ms or 0) + (decision.decide_ms or 0) == 0
    stream.deliver(decision)
    async with asyncio.timeout(5):
        await waiting
    rows = rules.timeline.to_list()
    (start,) = [row for row in rows if row["kind"] == "billed_start"]
    (decided,) = [row for row in rows if row["kind"] == "decision"]
    assert start["at"] < decided["at"]
    await driver.aclose()


async def test_cancelling_mid_wait_propagates_and_aclose_leaves_nothing() -> None:
    source, streams = _Source(), _Streams()
    driver = _driver(source, streams)
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    waiter = stream.waiter
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiter is not None and waiter.cancelled()
    await driver.aclose()
    assert asyncio.all_tasks() == before
    assert stream.closed and all(w.cancelled() for w in source.waiters)
    assert _provider_timers() == []


def _provider_timers() -> list[asyncio.TimerHandle]:
    loop = asyncio.get_running_loop()
    return [
        h
        for h in loop._scheduled  # type: ignore[attr-defined]
        if not h.cancelled() and "airflow_provider_systemzero" in repr(h._callback)  # type: ignore[attr-defined]
    ]


async def _building(capacity: StreamCapacity) -> None:
    async with capacity.opening():
        await asyncio.get_running_loop().create_future()  # until cancelled


#: What a random run does, step by step.
_STEPS = st.lists(
    st.sampled_from(["change", "met", "unmet", "stale", "waiter", "builder", "release", "pause"]),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS, lease_after=st.sampled_from([0.0, 3600.0]), cancel=st.booleans())
def test_after_aclose_nothing_of_the_run_is_left_and_no_input_spins_the_driver(
    steps: list[str], lease_after: float, cancel: bool
) -> None:
    async def run() -> None:
        capacity = StreamCapacity(1)
        source, streams = _Source(), _Streams(capacity)
        driver = _driver(source, streams, lease_after=lease_after)
        before = asyncio.all_tasks()
        others: list[asyncio.Future[Any]] = []
        waiting = asyncio.ensure_future(driver.next_verdict())
        lines = 0
        for step in steps:
            if waiting.done():
                break
            stream = streams.stream
            if step == "change":
                lines += 1
                source.set("waiting\n" + "line\n" * lines)
            elif step in ("met", "unmet", "stale") and stream is not None and not stream.closing:
                version = stream.state_version - (1 if step == "stale" else 0)
                stream.deliver(_decision(step == "met", version=version))
            elif step == "waiter":
                others.append(asyncio.ensure_future(capacity.acquire()))
            elif step == "builder":  # another trigger building its stream: it holds a place
                others.append(asyncio.ensure_future(_building(capacity)))
            elif step == "release" and capacity.in_use:
                capacity.release()
            turns_before = driver.turns
            for _ in range(5):
                await asyncio.sleep(0)
            woke = driver.turns - turns_before
            assert woke <= 6, f"the driver woke {woke} times for one input"
        if cancel or not waiting.done():
            waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await driver.aclose()
        for other in others:
            other.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        assert asyncio.all_tasks() == before, asyncio.all_tasks() - before
        assert all(stream.closed for stream in streams.built)
        assert all(w.done() for w in source.waiters)
        assert _provider_timers() == []
        assert driver._offer is None
        assert capacity.building == capacity.waiting_to_build == 0  # no place held or queued for

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["file", "callable"])
async def test_a_run_stopped_mid_read_leaves_no_watch_thread_or_task(tmp_path: Any, kind: str) -> None:
    """A run with a real source, stopped while the source is being read or waited on: after the
    driver's ``aclose()`` and the source's, the process's file watcher holds no watch of it and no
    call of the author's function is left running."""
    from airflow_provider_systemzero.sources import build_source, file_watch

    if kind == "file":
        log = tmp_path / "job.log"
        log.write_text("waiting\n")
        source = build_source({"type": "file", "path": str(log), "poll_interval": 3600.0}, "")
    else:
        source = build_source(
            {"type": "callable", "path": "tests.triggers.callables.read_value", "poll_interval": 0.01}, ""
        )
    watcher = file_watch.current_watcher()
    subscriptions = 0 if watcher is None else watcher.stats()["subscriptions"]
    streams = _Streams()
    driver = _driver(source, streams)  # type: ignore[arg-type]
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    if kind == "file":
        log.write_text("waiting\nstep 1\n")  # a read is under way or about to be
    for _ in range(3):
        await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await driver.aclose()
    await source.aclose()
    assert asyncio.all_tasks() == before and stream.closed
    watcher = file_watch.current_watcher()
    assert (0 if watcher is None else watcher.stats()["subscriptions"]) == subscriptions
    if kind == "callable":
        assert not source._calls.running  # type: ignore[attr-defined]
