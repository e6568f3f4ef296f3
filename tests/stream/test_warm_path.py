"""The warm path does no needless work: hops and wake-ups counted, not timed.

A change on a held stream is one frame out and an ack plus a decision back. The change is
written by the caller's task (no writer's turn is scheduled to write it); neither frame back
gives the writer anything to send, so neither costs a writer's turn; an ack does not wake the
consumer of ``decisions()``; and the sensor's trigger hands its event over before the close
handshake.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.emulator import Emulator
from airflow_provider_systemzero.stream import Backoff, DecisionStream
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests import helpers
from tests.helpers import trigger_kwargs
from tests.helpers.stream import QUESTIONS, TEST_LIMITS, EmulatorFactory, settings_for

#: The trigger test's fixtures (an emulator serving the trigger's connection, and its rules).
rules_file = helpers.rules_file
emulator = helpers.emulator

CHANGES = 5
#: No heartbeat or watchdog timer fires while the test runs: every wake-up counted is a frame's.
QUIET_LIMITS = dataclasses.replace(TEST_LIMITS, heartbeat_interval_ms=60_000, pong_timeout_ms=30_000)


async def decision_for(decisions: AsyncIterator[Any], stream: DecisionStream) -> Any:
    """The decision covering the stream's current state (bounded)."""
    async with asyncio.timeout(10):
        async for decision in decisions:
            if decision.state_version == stream.state_version and stream.in_sync:
                return decision
    raise AssertionError("the stream ended")


@pytest.fixture
async def held(make_emulator: EmulatorFactory, fast_backoff: Backoff) -> AsyncIterator[DecisionStream]:
    emu = await make_emulator(limits=QUIET_LIMITS)
    stream = DecisionStream(
        settings_for(emu),
        {"model": "MODEL_ID", "questions": QUESTIONS},
        state="waiting\n",
        decision_mode="on_change",
        identity="warm-path",
        open_deadline=15,
        backoff=fast_backoff,
    )
    async with stream:
        yield stream


async def test_frames_that_leave_nothing_to_send_do_not_wake_the_writer(held: DecisionStream) -> None:
    stream = held
    decisions = stream.decisions()
    await decision_for(decisions, stream)
    sent = {"frames": 0, "wake_ups": 0}
    connection = stream.connection
    assert connection is not None and connection.socket is not None
    socket = connection.socket
    flush, send_texts = connection.flush, socket.send_texts

    def counting_turn() -> None:  # the writer's turn: a wake-up of the writer
        sent["wake_ups"] += 1
        flush()

    def counting_frames(texts: list[str]) -> None:
        sent["frames"] += len(texts)
        send_texts(texts)

    connection.flush = counting_turn  # type: ignore[method-assign]
    socket.send_texts = counting_frames  # type: ignore[method-assign]
    for index in range(CHANGES):
        await stream.append_text(f"line {index}\n")
        await decision_for(decisions, stream)
    # one wake-up per change, the one that writes it: the ack and the decision wake nobody
    assert sent == {"frames": CHANGES, "wake_ups": CHANGES}
    await decisions.aclose()


async def test_a_change_goes_out_from_the_callers_task_without_a_scheduled_turn(
    held: DecisionStream,
) -> None:
    stream = held
    decisions = stream.decisions()
    await decision_for(decisions, stream)
    connection = stream.connection
    assert connection is not None and connection.socket is not None
    socket = connection.socket
    written: list[str] = []
    send_texts = socket.send_texts

    def counting(texts: list[str]) -> None:
        written.extend(asyncio.current_task().get_name() for _ in texts)  # type: ignore[union-attr]
        send_texts(texts)

    socket.send_texts = counting  # type: ignore[method-assign]
    turns = {"scheduled": 0}
    flush_now = connection.flush

    def counting_turn() -> None:
        if asyncio.current_task() is None:  # run by the loop (a callback or a timer), not a task
            turns["scheduled"] += 1
        flush_now()

    connection.flush = counting_turn  # type: ignore[method-assign]
    caller = asyncio.current_task()
    assert caller is not None
    for index in range(CHANGES):
        await stream.append_text(f"line {index}\n")
        assert written[-1] == caller.get_name()  # written before append_text returned, by the caller
        await decision_for(decisions, stream)
    assert len(written) == CHANGES
    assert turns["scheduled"] == 0  # no writer's turn was scheduled for a change or a frame back
    await decisions.aclose()


async def test_an_acknowledgement_does_not_wake_the_decisions_consumer(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator(limits=QUIET_LIMITS)
    stream = DecisionStream(
        settings_for(emu),
        {"model": "MODEL_ID", "questions": QUESTIONS},
        state="waiting\n",
        decision_mode="on_request",  # a change is acknowledged and not decided
        identity="warm-path-acks",
        open_deadline=15,
        backoff=fast_backoff,
    )
    async with stream:
        waits: list[asyncio.Future[Any]] = []  # each wait of the consumer is one wake-up after
        wake_on_decision = stream.wake_on_decision  # where decisions() waits

        def counting(waiter: asyncio.Future[Any]) -> None:
            waits.append(waiter)
            wake_on_decision(waiter)

        stream.wake_on_decision = counting  # type: ignore[method-assign]
        decisions = stream.decisions()
        consumer = asyncio.ensure_future(anext(decisions))
        await stream.wait_in_sync(timeout=10)  # the consumer is waiting by now
        for index in range(CHANGES):
            await stream.append_text(f"line {index}\n")
            await stream.wait_in_sync(timeout=10)
        assert len(waits) == 1 and not consumer.done()  # five acks woke nobody
        decision = await stream.decide(timeout=10)
        assert (await asyncio.wait_for(consumer, 10)).reply_id == decision.reply_id
        assert len(waits) == 1  # the decision ended the one wait
        await decisions.aclose()


async def test_the_sensor_trigger_hands_over_its_event_before_closing_the_stream(
    emulator: Emulator,
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text("Job is ready.\n")
    source = {"type": "file", "path": str(log), "poll_interval": 3600.0}
    made = SystemZeroDecisionTrigger(**trigger_kwargs(source=source, lease_after=30.0))  # a warm stream: held
    trigger = SystemZeroDecisionTrigger(**made.serialize()[1])  # as the triggerer rebuilds it
    run = trigger.run()
    try:
        async with asyncio.timeout(20):
            event = await anext(run)
        assert event.payload["status"] == "success"
        # the event is out while the connection is still open: it did not wait for the close
        assert emulator.stats.streams_open == 1
        with pytest.raises(StopAsyncIteration):
            await anext(run)  # after the event, the trigger closes its stream and returns
        await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
    finally:
        await run.aclose()
