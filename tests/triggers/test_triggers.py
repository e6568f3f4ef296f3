"""The decision triggers against the real emulator over loopback, through serialize → rebuild → run()."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.triggers.decision import (
    SystemZeroDecideTrigger,
    SystemZeroDecisionEventTrigger,
)
from tests.helpers import (
    TRIGGER_CONDITION,
    TRIGGER_LIMITS,
    TRIGGER_REQUEST,
    channels,
    emulator_cache_keys,
    first_event,
    rebuilt,
    sensor_trigger,
)
from tests.helpers import flag_sources as sources_for_tests

REQUEST = TRIGGER_REQUEST
CONDITION = TRIGGER_CONDITION
LIMITS = TRIGGER_LIMITS


async def test_serialized_kwargs_carry_no_secret(emulator: Emulator) -> None:
    classpath, kwargs = sensor_trigger().serialize()
    assert "demo" not in json.dumps(kwargs) and "password" not in json.dumps(kwargs)
    assert classpath == "airflow_provider_systemzero.triggers.decision.SystemZeroDecisionTrigger"
    assert "demo" not in repr(sensor_trigger())


async def test_file_source_grows_until_the_decision_flips(emulator: Emulator, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("starting\n")
    trigger = rebuilt(sensor_trigger(source={"type": "file", "path": str(log), "poll_interval": 0.02}))
    task = asyncio.ensure_future(first_event(trigger))
    await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched >= 1, timeout=10)
    assert not task.done()
    with log.open("a") as handle:
        handle.write("step 1 done\n")
    await emulator.wait_for(lambda emu: emu.stats.events_accepted >= 2, timeout=10)
    with log.open("a") as handle:
        handle.write("Job is ready.\n")
    payload = await task
    assert payload["status"] == "success" and payload["decision"] is True
    assert payload["probability"] == pytest.approx(0.93) and payload["confidence"] == pytest.approx(0.9)
    assert payload["reply_id"].startswith("szd_") and payload["key_namespace"] == trigger.key_namespace
    latest = emulator.latest_state(next(iter(emulator_cache_keys(emulator))))
    assert latest is not None and latest.state == "starting\nstep 1 done\nJob is ready.\n"
    await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)


async def test_static_state_already_true_fires_at_once(emulator: Emulator) -> None:
    payload = await first_event(rebuilt(sensor_trigger(state="Job is ready.\n")))
    assert payload["status"] == "success" and payload["state_version"] == 1
    assert payload["covered_event_ids"] == ["evt_1"]


async def test_deadline_gives_a_timeout_event(emulator: Emulator) -> None:
    import time

    payload = await first_event(rebuilt(sensor_trigger(state="nothing yet\n", deadline=time.time() + 0.5)))
    assert payload["status"] == "timeout" and "deadline" in payload["message"]


async def test_wrong_key_gives_an_authentication_error_event(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SYSTEMZERO_TEST",
        json.dumps({"conn_type": "systemzero", "host": emulator.origin, "password": "wrong-key-123"}),
    )
    payload = await first_event(rebuilt(sensor_trigger()))
    assert payload["status"] == "error" and payload["error_type"] == "authentication"
    assert "wrong-key-123" not in json.dumps(payload)


async def test_cancellation_propagates_and_closes_the_socket(emulator: Emulator) -> None:
    trigger = rebuilt(sensor_trigger(state="never ready\n"))
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    await emulator.wait_for(lambda emu: emu.stats.decisions_billed >= 1, timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await trigger.cleanup()
    await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)


async def test_rebuilt_trigger_replays_byte_identically_without_billing(emulator: Emulator) -> None:
    """A triggerer restart: the same kwargs in a new trigger replay the same state and key."""
    original = sensor_trigger(state="still working\n", lease=False)
    gen = original.run()
    task = asyncio.ensure_future(anext(gen))
    await emulator.wait_for(lambda emu: emu.stats.decisions_billed == 1, timeout=10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await original.cleanup()
    billed_before = emulator.billed_bodies()

    restarted = rebuilt(original)
    gen2 = restarted.run()
    task2 = asyncio.ensure_future(anext(gen2))
    await emulator.wait_for(lambda emu: emu.stats.decisions_replayed >= 1, timeout=10)
    assert emulator.billed_bodies() == billed_before and emulator.stats.decisions_billed == 1
    task2.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task2
    await restarted.cleanup()


async def test_two_copies_at_once_bill_once(emulator: Emulator) -> None:
    """HA: two triggerers run the same trigger; the per-state keys make the gateway bill once."""
    one, two = (
        rebuilt(sensor_trigger(state="Job is ready.\n")),
        rebuilt(sensor_trigger(state="Job is ready.\n")),
    )
    first, second = await asyncio.gather(first_event(one), first_event(two))
    assert first["status"] == second["status"] == "success"
    assert first["reply_id"] == second["reply_id"]
    assert emulator.stats.decisions_billed == 1


async def test_many_waiting_triggers_share_the_stream_cap(emulator: Emulator) -> None:
    count = 200
    names = [f"job{n}" for n in range(count)]
    triggers = [
        rebuilt(
            sensor_trigger(
                key_namespace=task_namespace("d", "t", name, -1),
                source={
                    "type": "callable",
                    "path": "tests.helpers.flag_sources.flag_state",
                    "kwargs": {"name": name},
                    "poll_interval": 0.05,
                },
            )
        )
        for name in names
    ]
    tasks = [asyncio.ensure_future(first_event(t, within=120)) for t in triggers]
    # every trigger gets its first (false) decision, leasing its stream back in between
    await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched >= count, timeout=90)
    assert not any(t.done() for t in tasks)
    for name in names:
        sources_for_tests.STATES[name] = "waiting\nJob is ready.\n"
    payloads = await asyncio.gather(*tasks)
    assert all(p["status"] == "success" for p in payloads)
    assert emulator.stats.max_streams_open <= 4
    assert emulator.stats.upgrade_refusals.get(429, 0) == 0


async def test_async_generator_source_pushes_states(emulator: Emulator) -> None:
    trigger = rebuilt(
        sensor_trigger(
            source={
                "type": "callable",
                "path": "tests.helpers.flag_sources.pushed_states",
                "kwargs": {"steps": ["a\n", "a\nb\n", "a\nb\nJob is ready.\n"]},
            }
        )
    )
    payload = await first_event(trigger)
    assert payload["status"] == "success"


async def test_decide_trigger_returns_every_answer(emulator: Emulator) -> None:
    trigger = rebuilt(
        SystemZeroDecideTrigger(
            systemzero_conn_id="systemzero_test",
            request=REQUEST,
            state=[{"task_id": "a", "output": "Job is ready."}],
            key_namespace=task_namespace("d", "op", "r", -1),
        )
    )
    payload = await first_event(trigger)
    assert payload["status"] == "success" and payload["answers"]["ready"]["decision"] is True
    assert payload["reply"]["id"] == payload["reply_id"] and payload["state_version"] == 1


async def test_event_trigger_fires_on_each_transition_to_true(emulator: Emulator) -> None:
    sources_for_tests.STATES["watch"] = "waiting\n"
    trigger = rebuilt(
        SystemZeroDecisionEventTrigger(
            systemzero_conn_id="systemzero_test",
            request=REQUEST,
            condition=CONDITION,
            state="",
            watch_id="nightly",
            source={
                "type": "callable",
                "path": "tests.helpers.flag_sources.flag_state",
                "kwargs": {"name": "watch"},
                "poll_interval": 0.02,
            },
        )
    )
    gen = trigger.run()
    try:
        first = asyncio.ensure_future(anext(gen))
        await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched >= 1, timeout=10)
        assert not first.done()
        sources_for_tests.STATES["watch"] = "waiting\nJob is ready.\n"
        async with asyncio.timeout(20):
            event = await first
        assert event.payload["status"] == "success" and event.payload["watch_id"] == "nightly"
    finally:
        await gen.aclose()
        await trigger.cleanup()
    await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)


async def test_stream_is_held_while_recent_and_leased_back_when_quiet(emulator: Emulator) -> None:
    trigger = rebuilt(sensor_trigger(state="still working\n", lease_after=2.0))
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    try:
        await emulator.wait_for(lambda emu: emu.stats.decisions_delivered >= 1, timeout=10)
        assert emulator.stats.streams_open == 1  # a decision just settled: the stream is kept a while
        await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
        assert emulator.stats.closes_by_code.get(1000) == 1 and not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await trigger.cleanup()


async def test_a_held_stream_is_given_back_at_once_when_others_wait(emulator: Emulator) -> None:
    """Quiet triggers keep their stream for lease_after seconds, but never while another trigger
    of the process waits for a slot: twelve triggers on four slots all get a first decision long
    before a single lease_after (60 s) has passed."""
    triggers = [
        rebuilt(
            sensor_trigger(
                state="still working\n",
                lease_after=60.0,
                key_namespace=task_namespace("d", "t", f"held{n}", -1),
            )
        )
        for n in range(12)
    ]
    tasks = [asyncio.ensure_future(first_event(t, within=120)) for t in triggers]
    try:
        await emulator.wait_for(lambda emu: emu.stats.decisions_delivered >= 12, timeout=30)
        assert emulator.stats.max_streams_open <= 4 and not any(t.done() for t in tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for trigger in triggers:
            await trigger.cleanup()


async def test_min_interval_spaces_decisions_on_a_busy_source(emulator: Emulator) -> None:
    trigger = rebuilt(
        sensor_trigger(
            min_interval_ms=60_000,
            lease_after=60.0,
            source=channels.source("min-interval"),
        )
    )
    assert trigger.serialize()[1]["min_interval_ms"] == 60_000
    channels.publish("min-interval", "a\n")
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    try:
        await emulator.wait_for(lambda emu: emu.stats.decisions_dispatched == 1, timeout=10)
        # changes after the first decision (a stream opens with the newest state: these come later)
        channels.publish("min-interval", "a\nb\n")
        channels.publish("min-interval", "a\nb\nc\n")
        await emulator.wait_for(lambda emu: emu.stats.events_accepted >= 2, timeout=10)
        assert emulator.stats.decisions_dispatched == 1  # the next may start only 60 s after the first
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await trigger.cleanup()


@pytest.mark.parametrize("kind", ["decide", "sensor"])
async def test_a_dispatch_in_flight_at_the_deadline_is_said_and_reported_as_unconfirmed(
    emulator: Emulator, kind: str
) -> None:
    """The deadline passes while the gateway still decides: the timeout says so, with the fix; the
    event goes out before the close, and the decision the gateway may still bill is in its usage
    as unconfirmed, so the task's max_decisions counts it across tries (it was counted only at the
    close, after the event)."""
    from airflow_provider_systemzero.decisions.budget import EVENT_USAGE_KEY

    emulator.faults.delay_decisions_ms = 3_000
    budget = {"max_decisions": 5}
    deadline = time.time() + 1.0
    if kind == "decide":
        trigger: Any = SystemZeroDecideTrigger(
            systemzero_conn_id="systemzero_test",
            request=REQUEST,
            state="The site is down",
            key_namespace=task_namespace("d", "in-flight", "r", -1),
            deadline=deadline,
            budget=budget,
        )
    else:
        trigger = sensor_trigger(state="Job is ready.\n", deadline=deadline, budget=budget)
    payload = await first_event(rebuilt(trigger))
    assert payload["status"] == "timeout"
    # the message says what the wait was stuck on, and which argument gives it more time
    assert "the gateway was still deciding (for " in payload["message"]
    assert ("decision_timeout" if kind == "decide" else "the sensor's timeout") in payload["message"]
    usage = payload[EVENT_USAGE_KEY]["run"]
    assert (usage["dispatched"], usage["billed"], usage["unconfirmed"]) == (0, 0, 1)
    await emulator.wait_for(lambda emu: emu.stats.decisions_billed == 1, timeout=10)  # billed all the same
