"""A decision reaches the waiting trigger straight from the stream's reader.

On the warm path the reader resolves the one future the trigger's own task waits on
(:meth:`SourceFeeder.first_verdict`): no queue, pump, verdict loop, race or lease-watching task
in between. What must still hold: a decision about a superseded state is dropped, the condition is
evaluated on the newest state, a quiet lease ends the wait, and a cancellation propagates and
leaves no task behind. Counted in tasks and loop turns, never timed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from airflow_provider_systemzero.decisions import watch as watch_module
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.watch import DecisionWatch
from airflow_provider_systemzero.identity import state_hash, task_namespace
from airflow_provider_systemzero.protocol.reply import DecisionResult
from airflow_provider_systemzero.stream import Backoff, DecisionStream
from airflow_provider_systemzero.stream.capacity import StreamCapacity
from airflow_provider_systemzero.stream.exceptions import StreamClosed
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from airflow_provider_systemzero.triggers.feeder import SourceFeeder
from airflow_provider_systemzero.triggers.lease import StreamLease
from airflow_provider_systemzero.triggers.reading import SourceReading
from tests import helpers
from tests.dormant import channels
from tests.helpers import running_trigger, trigger_kwargs
from tests.policy.test_watch import _decision
from tests.stream.support import QUESTIONS, EmulatorFactory, settings_for

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes


class _Source:
    """A source with one state that never changes (its read waits until cancelled)."""

    async def changes(self) -> AsyncIterator[Any]:
        yield "waiting\n"
        await asyncio.Event().wait()


class _Stream:
    """The part of a DecisionStream a feeder uses, with decisions delivered by the test (as the
    stream's reader would: into the queue, then the one waiter resolved)."""

    capacity = None
    connected = True
    dormant = False
    in_sync = True
    stream_id = "s"

    def __init__(self, version: int) -> None:
        self.state = "waiting\n"
        self.state_version = version
        self.queued: deque[DecisionResult] = deque()
        self.waiter: asyncio.Future[Any] | None = None
        self.closing = False

    def close_soon(self) -> None:
        self.closing = True

    def take_decision(self) -> DecisionResult | None:
        return self.queued.popleft() if self.queued else None

    def wake_on_decision(self, waiter: asyncio.Future[Any]) -> None:
        self.waiter = waiter

    def deliver(self, decision: DecisionResult) -> None:
        self.queued.append(decision)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def set_state(self, state: Any) -> None:
        self.state = state

    @property
    def state_hash(self) -> str:
        return state_hash(self.state)

    def has_work(self) -> bool:
        return False


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Let the loop run until ``condition`` holds (bounded)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the condition did not hold within {within} s")
        await asyncio.sleep(0)


def _feeder(stream: _Stream, lease: StreamLease | None = None) -> SourceFeeder:
    return SourceFeeder(
        stream,
        _Source(),  # type: ignore[arg-type]
        decision_mode="on_change",
        lease=lease or StreamLease(False, 30.0),
    )


def _watch() -> DecisionWatch:
    return DecisionWatch(DecisionCondition("ready", True), reviews=False)


async def test_the_reader_wakes_the_waiting_task_itself() -> None:
    stream = _Stream(version=1)
    feeder = _feeder(stream)
    assert feeder.direct
    waiting = asyncio.ensure_future(feeder.first_verdict(_watch()))
    await _until(lambda: stream.waiter is not None)
    # the task awaits the very future the reader resolves: nothing stands in between
    assert waiting._fut_waiter is stream.waiter  # type: ignore[attr-defined]
    stream.deliver(_decision(True, version=1))
    await asyncio.sleep(0)  # one loop turn: the waiting task runs, evaluates and returns
    assert waiting.done()
    verdict = waiting.result()
    assert verdict.status == "success" and verdict.decision.state_version == 1


async def test_a_superseded_decision_is_dropped_and_the_newest_state_decides() -> None:
    stream = _Stream(version=2)  # the state moved on to version 2
    feeder = _feeder(stream)
    waiting = asyncio.ensure_future(feeder.first_verdict(_watch()))
    await _until(lambda: stream.waiter is not None)
    stream.deliver(_decision(True, version=1))  # met, but about a superseded state
    await _until(lambda: stream.waiter is not None)  # dropped: waiting again
    assert not waiting.done()
    stream.deliver(_decision(False, version=2))  # current, not met: the wait goes on
    await _until(lambda: stream.waiter is not None)
    assert not waiting.done()
    stream.state_version = 3
    stream.deliver(_decision(True, version=3))
    async with asyncio.timeout(5):
        verdict = await waiting
    assert verdict.decision.state_version == 3


async def test_several_decisions_in_one_wake_up_are_all_judged_in_order() -> None:
    stream = _Stream(version=2)
    feeder = _feeder(stream)
    waiting = asyncio.ensure_future(feeder.first_verdict(_watch()))
    await _until(lambda: stream.waiter is not None)
    stream.queued.extend(
        [_decision(True, version=1), _decision(True, version=2)]
    )  # both read before the task ran
    stream.deliver(_decision(False, version=2))  # … and a later one that did not meet it
    async with asyncio.timeout(5):
        verdict = await waiting
    assert verdict.decision.state_version == 2 and verdict.decision.reply_id == "szd_2"


async def test_cancelling_mid_wait_propagates_and_leaves_no_task_behind() -> None:
    stream = _Stream(version=1)
    feeder = _feeder(stream)
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(feeder.first_verdict(_watch()))
    await _until(lambda: stream.waiter is not None)
    assert len(asyncio.all_tasks() - before) == 2  # the waiting task and the source's feeder
    waiter = stream.waiter
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiter is not None and waiter.cancelled()
    assert asyncio.all_tasks() == before


async def test_a_quiet_lease_ends_the_wait_without_a_verdict(caplog: pytest.LogCaptureFixture) -> None:
    stream = _Stream(version=1)
    feeder = _feeder(stream, StreamLease(True, 0.01))
    before = asyncio.all_tasks()
    waiting = asyncio.ensure_future(feeder.first_verdict(_watch()))
    await _until(lambda: stream.waiter is not None)
    caplog.set_level("INFO", logger="airflow_provider_systemzero.triggers.streaming")
    stream.deliver(_decision(False, version=1))  # evaluated, not met: the lease counts from here
    async with asyncio.timeout(5):
        assert await waiting is None
    assert "giving the stream back" in caplog.text  # the wait for a change says why
    assert stream.closing  # its close began before the feeder stopped
    assert asyncio.all_tasks() == before


async def test_the_trigger_judges_each_decision_in_its_own_task(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged_in: list[asyncio.Task[Any] | None] = []
    observe = watch_module.DecisionWatch.observe

    def recording(self: DecisionWatch, *args: Any, **kwargs: Any) -> Any:
        judged_in.append(asyncio.current_task())
        return observe(self, *args, **kwargs)

    monkeypatch.setattr(watch_module.DecisionWatch, "observe", recording)
    kwargs = trigger_kwargs(
        key_namespace=task_namespace("d", "direct", "r", -1),
        source=channels.source("direct"),
        lease_after=30.0,  # a warm stream: held between the decisions
    )
    _, serialized = SystemZeroDecisionTrigger(**kwargs).serialize()
    trigger = SystemZeroDecisionTrigger(**json.loads(json.dumps(serialized)))
    async with running_trigger(trigger) as run:
        await _until(lambda: bool(judged_in))  # the opening state's decision (not met)
        channels.publish("direct", "waiting\nJob is ready.\n")
        async with asyncio.timeout(20):
            event = await run
    assert event.payload["status"] == "success"
    assert len(judged_in) >= 2 and set(judged_in) == {run}  # the trigger's task, no consumer task


class _Held(_Stream):
    """A fake stream holding a slot of ``capacity``."""

    def __init__(self, capacity: StreamCapacity) -> None:
        super().__init__(version=1)
        self.capacity = capacity  # type: ignore[assignment]


async def test_a_decision_gives_the_slot_back_at_once_when_a_waiter_queues() -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()  # the stream's slot
    waiting = asyncio.ensure_future(capacity.acquire())  # another stream wants one
    await _until(lambda: capacity.waiting == 1)
    stream = _Held(capacity)
    lease = StreamLease(True, 30.0)
    feeder = _feeder(stream, lease)  # type: ignore[arg-type]
    quiet = lease.watch(feeder.currency)
    lease.arm(stream)  # a decision about the current state…
    feeder.currency.evaluated()  # … that did not end the wait
    assert quiet.done() and quiet.result() == "another stream waits for a slot"  # no loop turn between
    lease.disarm()
    capacity.release()
    async with asyncio.timeout(5):
        await waiting
    assert capacity.in_use == 1


async def test_close_soon_closes_the_connection_before_aclose_is_awaited(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    capacity = StreamCapacity(4)
    stream = DecisionStream(
        settings_for(emu),
        {"model": "MODEL_ID", "questions": QUESTIONS},
        state="waiting\n",
        identity="close-soon",
        open_deadline=15,
        backoff=fast_backoff,
        capacity=capacity,
    )
    await stream.__aenter__()
    assert stream.connected and capacity.in_use == 1
    stream.close_soon()
    await _until(lambda: capacity.in_use == 0)  # closed, and the slot given back, by the stream itself
    assert not stream.connected
    async with asyncio.timeout(10):
        await stream.aclose()
    with pytest.raises(StreamClosed):
        await stream.append_text("more\n")


async def test_a_wait_that_ends_at_once_closes_the_source_read_it_took_over() -> None:
    closed = asyncio.Event()

    async def changes() -> AsyncIterator[Any]:
        try:
            await asyncio.Event().wait()  # the first value never comes
            yield "never"
        finally:
            closed.set()

    before = asyncio.all_tasks()
    reading = SourceReading(changes())  # the read the stream's opening began…
    await asyncio.sleep(0)  # … is under way
    stream = _Stream(version=1)
    stream.queued.append(_decision(True, version=1))  # the answer is there before the feeder ever ran
    feeder = SourceFeeder(
        stream,
        _Source(),  # type: ignore[arg-type]
        decision_mode="on_change",
        lease=StreamLease(False, 30.0),
        reading=reading,
    )
    async with asyncio.timeout(5):
        verdict = await feeder.first_verdict(_watch())
    assert verdict.status == "success"
    # the answer went out first; the reading stops meanwhile, and the source is closed
    await _until(lambda: closed.is_set() and reading.task.done())
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before  # no read of the source outlives the wait
