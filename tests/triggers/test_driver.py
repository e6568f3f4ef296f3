"""The driver of a trigger's watch, against a stream and a source the test controls (no network;
:mod:`tests.helpers.scripted`): a decision reaches the driver's own task from the stream's
reader; only a decision about what the source holds now is judged (a read under way first); a
waiter gets a quiet stream's slot at once; a cancellation propagates; and after ``aclose()``
nothing of the run is left. ``test_driver_states.py`` runs the same driver as a state machine,
through every order of what can happen to it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.source_watch import SourceWatch
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.triggers.driver import WatchDriver
from tests.helpers import live_timers
from tests.helpers.scripted import ScriptedSource, ScriptedStream, ScriptedStreams


def _driver(source: ScriptedSource, streams: ScriptedStreams, *, lease_after: float = 3600.0) -> WatchDriver:
    watch = SourceWatch(
        VerdictRules(DecisionCondition("ready", True), reviews=False),
        decision_mode="on_change",
        lease_after=lease_after,
    )
    return WatchDriver(watch, source, streams)  # type: ignore[arg-type]


async def _until(condition: Callable[[], object], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the condition did not hold within {within} s")
        await asyncio.sleep(0)


async def _held(streams: ScriptedStreams) -> ScriptedStream:
    """The stream the driver opened, once it waits for its decisions."""
    await _until(lambda: streams.stream is not None and streams.stream.waiter is not None)
    assert streams.stream is not None
    return streams.stream


async def test_the_streams_reader_wakes_the_drivers_own_task() -> None:
    source, streams = ScriptedSource(), ScriptedStreams()
    driver = _driver(source, streams)
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    # nothing runs but the waiting task: it awaits the very future the reader resolves
    assert asyncio.all_tasks() - before == {waiting}
    stream.deliver(stream.decision(True, 1))
    await asyncio.sleep(0)  # one loop turn: the waiting task runs, judges and returns
    assert waiting.done() and waiting.result().decision.state_version == 1
    await driver.aclose()


async def test_a_superseded_decision_is_dropped_and_the_newest_state_decides() -> None:
    source, streams = ScriptedSource(), ScriptedStreams()
    driver = _driver(source, streams)
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    source.set("waiting\nstep 1\n")
    await _until(lambda: stream.state == "waiting\nstep 1\n")  # the change reached the stream (version 2)
    stream.deliver(stream.decision(True, 1))  # met, but about the superseded state
    await _until(lambda: stream.waiter is not None)
    assert not waiting.done()
    stream.deliver(stream.decision(True, 2))
    async with asyncio.timeout(5):
        verdict = await waiting
    assert verdict.decision.state_version == 2 and verdict.state == "waiting\nstep 1\n"
    await driver.aclose()


async def test_several_decisions_in_one_wake_up_are_all_judged_in_order() -> None:
    source, streams = ScriptedSource(), ScriptedStreams()
    driver = _driver(source, streams)
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    met = stream.decision(True, 1)
    stream.queued.extend([stream.decision(False, 1), met])
    stream.deliver(stream.decision(False, 1))  # read before the task ran, all three
    async with asyncio.timeout(5):
        verdict = await waiting
    assert verdict.decision is met
    await driver.aclose()


async def test_a_decision_waits_for_the_read_under_way_and_is_not_judged_once_the_source_changed() -> None:
    source, streams = ScriptedSource(), ScriptedStreams()
    driver = _driver(source, streams)
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    source.hold_reads = True  # the next read is slow
    source.set("waiting\nFAILED\n")  # the source moved on: the driver starts reading it
    await _until(lambda: source.reads == 2)
    stream.deliver(stream.decision(True, 1))  # met, about the state before the change
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiting.done()  # not judged while the read runs
    source.finish_read()
    await _until(lambda: stream.state == "waiting\nFAILED\n")
    assert not waiting.done()  # judged against the newest read: superseded
    stream.deliver(stream.decision(False, 2))
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
    source, streams = ScriptedSource(), ScriptedStreams(capacity)  # the driver's stream takes the one slot
    driver = _driver(source, streams)  # an hour of lease_after: only a waiter makes it go
    caplog.set_level("INFO", logger="airflow_provider_systemzero.decisions.source_watch")
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    stream.deliver(stream.decision(False, 1))  # judged, not met: the stream owes nothing
    await _until(lambda: capacity.offered == 1)
    other = asyncio.ensure_future(capacity.acquire())  # another trigger wants a slot
    async with asyncio.timeout(5):
        await other  # the stream was given back, and its slot went to the waiter
    assert stream.closed
    assert "another stream waits for a slot: giving the stream back" in caplog.text
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
    rules = VerdictRules(DecisionCondition("ready", True), reviews=False, clock=time.time)
    watch = SourceWatch(rules, decision_mode="on_change", timeline=rules.timeline, question="ready")
    source, streams = ScriptedSource(), ScriptedStreams()
    driver = WatchDriver(watch, source, streams)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(driver.next_verdict())
    stream = await _held(streams)
    decision = stream.decision(True, 1)
    stream.usage = SimpleNamespace(reply_ids={decision.reply_id})  # billed when it arrived
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
    source, streams = ScriptedSource(), ScriptedStreams()
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
    return [handle for handle, callback in live_timers() if "airflow_provider_systemzero" in repr(callback)]


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
            {"type": "callable", "path": "tests.helpers.trigger_callables.read_value", "poll_interval": 0.01},
            "",
        )
    watcher = file_watch.current_watcher()
    subscriptions = 0 if watcher is None else watcher.stats()["subscriptions"]
    streams = ScriptedStreams()
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
        assert not source.calling
