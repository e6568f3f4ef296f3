"""A trigger woken by a change that waits for a stream slot opens with the source's newest state:
its first decision is never about the state it woke on once a newer one came (the real trigger
against the real emulator over loopback, the process's ``max_streams_per_process`` at 1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import DecisionStream, StreamSettings, default_capacity
from airflow_provider_systemzero.triggers.decision import (
    SystemZeroDecisionEventTrigger,
    SystemZeroDecisionTrigger,
)
from tests.helpers import (
    TRIGGER_CONDITION,
    TRIGGER_CONN_ID,
    TRIGGER_LIMITS,
    TRIGGER_REQUEST,
    RecordingDecider,
    channels,
    running_trigger,
)

WOKE_ON = "waiting\nstep A\n"
NEWEST = "waiting\nstep A\nJob is ready.\n"


@pytest.fixture
async def recorded(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Emulator, RecordingDecider]]:
    """The emulator (its buckets out of the way), its recording decider, the trigger tests'
    connection to it, and a process allowed one stream at a time."""
    decider = RecordingDecider()
    capacity = default_capacity()
    limit = capacity.limit
    async with Emulator(api_keys={"demo": 8}, decider=decider, limits=TRIGGER_LIMITS) as emu:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{TRIGGER_CONN_ID.upper()}",
            json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": "demo"}),
        )
        capacity.set_limit(1)
        try:
            yield emu, decider
        finally:
            capacity.set_limit(limit)


async def _until(condition: Callable[[], object], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _slot_held(emu: Emulator) -> AsyncIterator[None]:
    """Another stream of the process holds its one slot (on_request, nothing to decide: it never
    offers the slot) until the block ends."""
    holder = DecisionStream(
        StreamSettings(emu.origin, "demo", default_model="sz-test"),
        TRIGGER_REQUEST,
        state="another task\n",
        decision_mode="on_request",
        identity="tests.dormant.holder",
    )
    async with holder:
        yield


async def _woken_while_the_slot_is_held(
    emu: Emulator, decider: RecordingDecider, channel: str, trigger: Any, stream_of: Callable[[], Any]
) -> tuple[Any, int]:
    """Run ``trigger`` until dormant, hold the slot, publish line A (the trigger wakes and waits
    for the slot), then B; release the slot; its first event and where its decisions after A begin."""
    async with running_trigger(trigger) as task:
        await emu.wait_for(lambda e: e.stats.decisions_billed >= 1 and e.stats.streams_open == 0, timeout=20)
        capacity = default_capacity()
        async with _slot_held(emu):
            after = len(decider.states)
            channels.publish(channel, WOKE_ON)
            await _until(lambda: capacity.waiting == 1, 20, "the woken trigger waiting for the slot")
            channels.publish(channel, NEWEST)
            # the fixed stream takes B before it opens; without the fix nothing reads it, and the
            # decisions below say so
            with contextlib.suppress(AssertionError):
                await _until(lambda: getattr(stream_of(), "state", None) == NEWEST, 5, "line B taken")
        async with asyncio.timeout(20):
            event = await task
        return event, after


def _assert_first_decision_about_newest(decider: RecordingDecider, after: int) -> None:
    started = decider.states[after:]
    assert started, "no decision started after the wake"
    assert started[0] == NEWEST, f"the first decision after the wake was about {started[0]!r}"
    assert WOKE_ON not in started, "a decision started about the superseded state"


async def test_a_woken_trigger_waiting_for_a_slot_first_decides_the_newest_state(
    recorded: tuple[Emulator, RecordingDecider], caplog: pytest.LogCaptureFixture
) -> None:
    emu, decider = recorded
    caplog.set_level("INFO", logger="airflow_provider_systemzero")
    channel = "opening-sensor"
    channels.publish(channel, "waiting\n")
    trigger = SystemZeroDecisionTrigger(
        systemzero_conn_id=TRIGGER_CONN_ID,
        request=TRIGGER_REQUEST,
        condition=TRIGGER_CONDITION,
        state="",
        key_namespace=task_namespace("d", "opening", channel, -1),
        source=channels.source(channel),
        lease_after=0.05,
    )
    event, after = await _woken_while_the_slot_is_held(
        emu, decider, channel, trigger, lambda: trigger.open_stream
    )
    assert event.payload["status"] == "success" and event.payload["decision"] is True
    _assert_first_decision_about_newest(decider, after)
    # the log says the trigger woke and opened a new stream, not that it connected for the first time
    woke = caplog.text.index("the source changed: opening a new stream to decide the new state")
    assert "(a new stream)" in caplog.text[woke:] and "first connection" not in caplog.text


async def test_an_asset_watch_woken_while_waiting_for_a_slot_first_decides_the_newest_state(
    recorded: tuple[Emulator, RecordingDecider],
) -> None:
    emu, decider = recorded
    channel = "opening-watch"
    channels.publish(channel, "waiting\n")
    trigger = SystemZeroDecisionEventTrigger(
        systemzero_conn_id=TRIGGER_CONN_ID,
        request=TRIGGER_REQUEST,
        condition=TRIGGER_CONDITION,
        state="",
        watch_id=channel,
        source=channels.source(channel),
        lease_after=0.05,
    )
    event, after = await _woken_while_the_slot_is_held(
        emu, decider, channel, trigger, lambda: trigger.open_stream
    )
    assert event.payload["decision"] is True
    _assert_first_decision_about_newest(decider, after)


def test_the_recording_decider_answers_as_the_rules() -> None:
    decider = RecordingDecider()
    answers = decider.decide({"state": NEWEST, "questions": TRIGGER_REQUEST["questions"]}, now=0.0)
    assert answers["ready"]["decision"] is True and decider.states == [NEWEST]
