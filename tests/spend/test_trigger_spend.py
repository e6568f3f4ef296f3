"""decide_when / debounce_ms on the real decision triggers against the real emulator over loopback:
what is billed (the emulator's own count) and which state is decided."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from tests.helpers import TRIGGER_CONDITION as CONDITION
from tests.helpers import TRIGGER_REQUEST as REQUEST
from tests.helpers import (
    dormant,
    emulator_cache_keys,
    first_event,
    loopback_emulator,
    rebuilt,
    sensor_trigger,
    until_read,
)
from tests.helpers.spend_sources import publish

LINES = [f"step {n} done\n" for n in range(1, 6)]


def pushed(name: str) -> dict[str, Any]:
    return {"type": "callable", "path": "tests.helpers.spend_sources.channel", "kwargs": {"name": name}}


async def accepted(emulator: Emulator, count: int) -> None:
    """Wait (bounded) until the gateway acknowledged ``count`` events in all (the start is one)."""
    await emulator.wait_for(lambda emu: emu.stats.events_accepted >= count, timeout=10)


async def test_irrelevant_appends_start_no_decision_and_the_decisive_line_is_decided_with_them(
    emulator: Emulator,
) -> None:
    publish("irrelevant", "starting\n")
    trigger = rebuilt(sensor_trigger(source=pushed("irrelevant"), decide_when=r"(?i)job is ready"))
    task = asyncio.ensure_future(first_event(trigger))
    await emulator.wait_for(lambda emu: emu.stats.decisions_billed >= 1, timeout=10)  # the initial state
    state = "starting\n"
    for line in LINES:
        state += line
        publish("irrelevant", state)
        await until_read(trigger, state)  # the trigger saw it, and started no decision for it
    assert emulator.stats.decisions_dispatched == 1
    state += "Job is ready.\n"
    publish("irrelevant", state)
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True
    # the initial state and the decisive line: nothing for the five lines in between
    stats = emulator.stats
    assert stats.decisions_billed == 2 and stats.decisions_dispatched == 2
    # the decision that fired covers the newest state, every line included
    (key,) = emulator_cache_keys(emulator)
    latest = emulator.latest_state(key)
    assert latest is not None and latest.state == state


async def test_a_burst_within_debounce_is_one_decision_about_its_last_state(emulator: Emulator) -> None:
    publish("burst", "starting\n")
    trigger = rebuilt(sensor_trigger(source=pushed("burst"), debounce_ms=3000))
    task = asyncio.ensure_future(first_event(trigger))
    await emulator.wait_for(lambda emu: emu.stats.decisions_billed >= 1, timeout=10)  # initial: at once
    state = "starting\n"
    for number, line in enumerate([*LINES, "Job is ready.\n"], start=2):
        state += line
        publish("burst", state)
        await accepted(emulator, number)
    # every line is at the gateway and none started a decision: the source is not quiet yet
    assert emulator.stats.decisions_dispatched == 1
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True
    stats = emulator.stats
    assert stats.decisions_billed == 2 and stats.events_accepted == 2 + len(LINES)
    # the burst's last state (only it holds the ready line) was the one decided


async def test_a_callable_decide_when_without_the_initial_decision_holds_no_stream(
    emulator: Emulator,
) -> None:
    """decide_initial=False: nothing is due until a change matches, so no stream is opened (and no
    slot held) for the initial state or for the lines before the decisive one."""
    publish("callable", "starting\n")
    trigger = rebuilt(
        sensor_trigger(
            source=pushed("callable"),
            decide_when={"callable": "tests.helpers.spend_sources.says_ready"},
            decide_initial=False,
            lease_after=5.0,
        )
    )
    task = asyncio.ensure_future(first_event(trigger))
    state = "starting\n"
    await until_read(trigger, state)
    for line in LINES:
        state += line
        publish("callable", state)
        await until_read(trigger, state)
    assert emulator.stats.streams_total == 0 and emulator.stats.decisions_dispatched == 0
    publish("callable", state + "Job is ready.\n")
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True
    assert emulator.stats.decisions_billed == 1 and emulator.stats.streams_total == 1


async def test_a_decide_when_callable_that_cannot_be_imported_ends_the_trigger(emulator: Emulator) -> None:
    trigger = rebuilt(
        sensor_trigger(state="starting\n", decide_when={"callable": "tests.spend.nowhere.func"})
    )
    payload = await first_event(trigger)
    assert payload["status"] == "error" and payload["error_type"] == "validation"
    assert payload["field"] == "decide_when.callable" and "tests.spend.nowhere.func" in payload["message"]
    assert "cannot be imported in the triggerer" in payload["message"]
    assert emulator.stats.streams_total == 0 and emulator.stats.decisions_billed == 0


async def test_the_event_trigger_shares_the_filter(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    publish("asset", "starting\n")
    trigger = rebuilt(
        SystemZeroDecisionEventTrigger(
            systemzero_conn_id="systemzero_test",
            request=REQUEST,
            condition=CONDITION,
            state="",
            watch_id="spend-watch",
            source=pushed("asset"),
            lease_after=0.0,
            decide_when=r"(?i)job is ready",
        )
    )
    assert trigger.serialize()[1]["decide_when"] == r"(?i)job is ready"
    events = trigger.run()
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.decisions.source_watch")
    first = asyncio.ensure_future(anext(events))
    try:
        await emulator.wait_for(lambda emu: emu.stats.decisions_billed >= 1, timeout=10)
        state = "starting\n"
        for line in LINES:
            state += line
            publish("asset", state)
            await until_read(trigger, state)
        assert not first.done()
        publish("asset", state + "Job is ready.\n")
        async with asyncio.timeout(20):
            event = await first
    finally:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await events.aclose()
    assert event.payload["status"] == "success" and event.payload["watch_id"] == "spend-watch"
    assert emulator.stats.decisions_billed == 2
    assert "waiting for a change that matches decide_when" in caplog.text  # the wait says why


def test_kwargs_without_the_knobs_are_unchanged() -> None:
    # a trigger serialized before these knobs existed rebuilds to the same identity
    _, kwargs = sensor_trigger().serialize()
    assert not {"decide_when", "debounce_ms", "decide_initial"} & set(kwargs)
    _, kwargs = sensor_trigger(
        decide_when={"callable": "a.b"}, debounce_ms=0, decide_initial=False
    ).serialize()
    assert json.loads(json.dumps(kwargs))["decide_when"] == {"callable": "a.b"}
    assert kwargs["debounce_ms"] == 0 and kwargs["decide_initial"] is False


@pytest.fixture
async def slow_emulator(rules_file: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The emulator with each fresh decision taking a second, so a change can arrive during one."""
    async with loopback_emulator(rules_file, monkeypatch, decide_latency_ms=1000) as emu:
        yield emu


async def test_a_change_during_a_decision_is_held_so_that_decision_counts(
    slow_emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    emulator = slow_emulator
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.decisions.source_watch")
    publish("held", "starting\n")
    trigger = rebuilt(sensor_trigger(source=pushed("held"), decide_when=r"(?i)job is ready"))
    task = asyncio.ensure_future(first_event(trigger))
    await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched >= 1, timeout=10)
    publish("held", "starting\nstep 1 done\n")  # arrives while the initial decision runs
    await emulator.wait_for(lambda emu: emu.stats.events_accepted >= 2, timeout=10)
    assert "holding the source's newer state while the decision in flight comes back" in caplog.text
    # the initial decision was about the newest state when it returned: not decided again
    assert emulator.stats.decisions_billed == 1 and emulator.stats.decisions_dispatched == 1
    publish("held", "starting\nstep 1 done\nJob is ready.\n")
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True
    assert emulator.stats.decisions_billed == 2 and emulator.stats.decisions_dispatched == 2


async def test_a_dormant_trigger_opens_no_stream_for_a_change_that_cannot_matter(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """A dormant trigger (no stream) that sees a change not matching decide_when stays dormant: no
    connection, no decision; the next matching change opens one stream and is decided."""
    caplog.set_level(logging.DEBUG, logger="airflow_provider_systemzero.decisions.source_watch")
    publish("dormant", "starting\n")
    trigger = rebuilt(
        sensor_trigger(source=pushed("dormant"), decide_when=r"(?i)job is ready", lease_after=0.05)
    )
    task = asyncio.ensure_future(first_event(trigger))
    await emulator.wait_for(lambda emu: emu.stats.decisions_billed >= 1, timeout=10)  # the initial state
    await emulator.wait_for(lambda _: dormant(trigger), timeout=20)
    streams = emulator.stats.streams_total
    state = "starting\n" + LINES[0]
    publish("dormant", state)

    def ignored() -> bool:
        return any("does not match decide_when" in r.getMessage() for r in caplog.records)

    await emulator.wait_for(lambda _: ignored() and dormant(trigger), timeout=10)
    assert emulator.stats.streams_total == streams and emulator.stats.decisions_billed == 1
    state += "Job is ready.\n"
    publish("dormant", state)
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True
    stats = emulator.stats
    assert stats.streams_total == streams + 1 and stats.decisions_billed == 2
