"""A waiting decision trigger without a change holds no stream, task or timer, and a change wakes
it: the real trigger against the real emulator over loopback (serialize → rebuild → run())."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from airflow_provider_systemzero.decisions import watch as watch_module
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.watch import VerdictRules
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.stream import default_capacity
from airflow_provider_systemzero.stream.decision_stream import DecisionStream
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests import helpers
from tests.helpers import (
    alive,
    channel_trigger,
    channels,
    new_since,
    provider_timers,
    running_trigger,
    trigger_kwargs,
)


async def test_a_dormant_trigger_holds_no_stream_task_or_timer(emulator: Emulator) -> None:
    others = set(asyncio.all_tasks())
    # what earlier tests of this process may have left is not this trigger's
    earlier = alive(DecisionStream, ClientSession)
    capacity = default_capacity()
    in_use, offered = capacity.in_use, capacity.offered
    trigger = channel_trigger("dormant", "quiet")
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
        await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
        assert emulator.stats.decisions_delivered == 1 and not task.done()
        # the tasks are the trigger's own (the triggerer's) and the push source's read of its next
        # value (a task of the source's, so the author's generator is never cancelled); the stream's
        # runner and reader, and every piece of the watch's work, are gone
        reads = {
            t for t in asyncio.all_tasks() - {task} if type(t.get_coro()).__name__ == "async_generator_asend"
        }
        assert len(reads) == 1
        assert set(asyncio.all_tasks()) - others == {task, *reads}
        # no stream object, session or connection is left, and no slot is held or offered
        assert trigger.open_stream is None and trigger.progress.dormant
        assert new_since(earlier, alive(DecisionStream, ClientSession)) == []
        assert (capacity.in_use, capacity.offered) == (in_use, offered)
        # no timer of the trigger's (a lease, a heartbeat, a poll) will wake it without a change
        assert provider_timers() == []
        # what it waits on is the source: one reader of the channel
        assert channels.readers("quiet") == 1


async def test_a_change_wakes_the_trigger_which_rebuilds_its_stream_and_decides_the_newest_state(
    emulator: Emulator,
) -> None:
    trigger = channel_trigger("dormant", "wake")
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
        await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
        opened = emulator.stats.streams_total
        # several changes while dormant: the newest is the one that meets the condition
        channels.publish("wake", "waiting\nstep 1\n")
        channels.publish("wake", "waiting\nstep 1\nstep 2\n")
        channels.publish("wake", "waiting\nstep 1\nstep 2\nJob is ready.\n")
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and event.payload["decision"] is True
    assert emulator.stats.streams_total > opened  # woken: a new stream was built for the change


async def test_a_trigger_cancelled_while_dormant_ends_and_releases_the_source(emulator: Emulator) -> None:
    trigger = channel_trigger("dormant", "cancel")
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await trigger.cleanup()
    assert channels.readers("cancel") == 0 and not helpers.dormant(trigger)


async def test_a_condition_waiting_on_time_fires_while_dormant_without_a_change(emulator: Emulator) -> None:
    channels.publish("steady", "waiting\nJob is ready.\n")
    condition = DecisionCondition("ready", True, min_confidence=0.5, min_true_for=1.0).to_dict()
    trigger = channel_trigger("dormant", "steady", condition=condition)
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
        assert not task.done()  # qualifying, but not for long enough yet
        async with asyncio.timeout(20):
            event = await task
        # time alone ended the wait: no second stream, no second decision
        assert emulator.stats.streams_total == 1 and emulator.stats.decisions_delivered == 1
    assert event.payload["status"] == "success" and event.payload["streak"]["true_for"] >= 1.0


def _flaky(channel: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "callable",
        "path": "tests.helpers.channels.flaky",
        "kwargs": {"channel": channel},
        **extra,
    }


async def test_a_push_source_failing_while_dormant_is_called_again_and_the_trigger_fires(
    emulator: Emulator,
) -> None:
    trigger = channel_trigger("dormant", "flaky-dormant", source=_flaky("flaky-dormant", retry_delay=0.01))
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
        await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
        channels.publish("flaky-dormant", "FAIL\n")  # the generator raises in the dormant wait
        await emulator.wait_for(lambda _: channels.CALLS["flaky-dormant"] == 2, timeout=10)
        assert not task.done()  # retried: called again, it waits on
        channels.publish("flaky-dormant", "waiting\nJob is ready.\n")
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and event.payload["decision"] is True


async def test_a_push_source_that_fails_while_dormant_with_no_retry_left_ends_with_an_error_event(
    emulator: Emulator,
) -> None:
    trigger = channel_trigger("dormant", "flaky-dormant-out", source=_flaky("flaky-dormant-out", retries=0))
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
        channels.publish("flaky-dormant-out", "FAIL\n")
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "error"
    assert "ConnectionError: the feed dropped" in event.payload["message"]
    assert channels.readers("flaky-dormant-out") == 0  # cleaned up


async def test_a_push_sources_generator_outlives_the_streams_given_back(emulator: Emulator) -> None:
    """Giving a quiet stream back does not cancel the generator waiting for its next value: it is
    called once, keeps what it built up, and the trigger decides its newest state — not a restart's
    first value (a generator that accumulates a log would go backwards)."""
    channel = "leased-generator"
    trigger = channel_trigger("dormant", channel, source=_flaky(channel))
    async with running_trigger(trigger) as task:
        for step in range(3):  # held, given back, woken: three times over
            await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
            await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
            assert channels.CALLS[channel] == 1, "the generator was called again"
            channels.publish(channel, f"waiting\nstep {step}\n")
            await emulator.wait_for(lambda _: not helpers.dormant(trigger), timeout=20)
        channels.publish(channel, "waiting\nJob is ready.\n")
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and event.payload["decision"] is True
    assert channels.CALLS[channel] == 1


async def test_a_loopback_gateway_restarting_while_the_trigger_is_dormant_is_waited_for(
    rules_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream that never reached a loopback gateway gives up after a few seconds (nothing
    listens there); a trigger whose earlier stream reached it knows the gateway exists, so the
    stream it opens after a change keeps reconnecting while the gateway restarts."""
    from airflow_provider_systemzero.stream import diagnosis

    # the give-up point, shrunk from 10 s: reached well before the gateway comes back
    monkeypatch.setattr(diagnosis, "LOOPBACK_GIVE_UP_SECONDS", 0.5)
    monkeypatch.setattr(diagnosis, "LOOPBACK_GIVE_UP_ATTEMPTS", 2)
    channel = "restarting-gateway"
    trigger = channel_trigger("dormant", channel)
    first_run = helpers.loopback_emulator(rules_file, monkeypatch)
    first = await first_run.__aenter__()
    port = first.port
    async with running_trigger(trigger) as task:
        try:
            await first.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
            await first.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
        finally:
            await first_run.__aexit__(None, None, None)  # the gateway goes away
        channels.publish(channel, "waiting\nJob is ready.\n")  # the trigger wakes while nothing listens
        await helpers.until(lambda: not helpers.dormant(trigger), within=10, what="the trigger to wake")
        await asyncio.sleep(2)  # refused for four times the give-up point
        assert not task.done(), task.result().payload
        async with helpers.loopback_emulator(rules_file, monkeypatch, port=port):
            async with asyncio.timeout(30):
                event = await task
    assert event.payload["status"] == "success" and event.payload["decision"] is True


async def test_a_connection_looked_up_again_forgets_the_gateway_it_reached(
    rules_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An asset watch that failed looks its connection up again: when it now names a loopback
    port where nothing listens, the stream gives up as for any gateway never reached (the watch
    then tries again), instead of reconnecting for ever on the strength of another gateway."""
    import socket

    from airflow_provider_systemzero.stream import diagnosis
    from airflow_provider_systemzero.stream.exceptions import GatewayUnreachable
    from airflow_provider_systemzero.triggers.streaming import TriggerStream

    monkeypatch.setattr(diagnosis, "LOOPBACK_GIVE_UP_SECONDS", 0.5)
    monkeypatch.setattr(diagnosis, "LOOPBACK_GIVE_UP_ATTEMPTS", 2)
    stream = TriggerStream(helpers.TRIGGER_CONN_ID, helpers.TRIGGER_REQUEST, key_namespace="sz-forgets")

    async def one_stream() -> None:
        built = stream.build("waiting\n", decision_mode="on_change")
        try:
            await stream.enter(built)
        finally:
            await stream.close(built)

    async with helpers.loopback_emulator(rules_file, monkeypatch):  # the gateway it reaches
        await stream.resolve_settings()
        await one_stream()
    assert stream.reached
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{helpers.TRIGGER_CONN_ID.upper()}",
        json.dumps({"conn_type": "systemzero", "host": f"ws://127.0.0.1:{closed}", "password": "demo"}),
    )
    stream.forget_settings()
    await stream.resolve_settings()
    try:
        with pytest.raises(GatewayUnreachable):
            async with asyncio.timeout(10):  # twenty times the give-up point
                await one_stream()
    finally:
        await stream.aclose()


async def test_the_trigger_judges_each_decision_in_its_own_task(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged_in: list[asyncio.Task[Any] | None] = []
    observe = watch_module.VerdictRules.observe

    def recording(self: VerdictRules, *args: Any, **kwargs: Any) -> Any:
        judged_in.append(asyncio.current_task())
        return observe(self, *args, **kwargs)

    monkeypatch.setattr(watch_module.VerdictRules, "observe", recording)
    kwargs = trigger_kwargs(
        key_namespace=task_namespace("d", "direct", "r", -1),
        source=channels.source("direct"),
        lease_after=30.0,  # a warm stream: held between the decisions
    )
    _, serialized = SystemZeroDecisionTrigger(**kwargs).serialize()
    trigger = SystemZeroDecisionTrigger(**json.loads(json.dumps(serialized)))
    async with running_trigger(trigger) as run:
        await helpers.until(lambda: bool(judged_in), 10)  # the opening state's decision (not met)
        channels.publish("direct", "waiting\nJob is ready.\n")
        async with asyncio.timeout(20):
            event = await run
    assert event.payload["status"] == "success"
    assert len(judged_in) >= 2 and set(judged_in) == {run}  # the trigger's task, no consumer task
