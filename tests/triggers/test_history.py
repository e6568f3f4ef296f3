"""A trigger keeps one history of its wait — across the streams it gives back and opens again — and
every event that ends the wait carries it, a timeout's included (the real trigger against the real
emulator over loopback)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests import helpers
from tests.helpers import channels, running_trigger

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes


def _trigger(channel: str, **overrides: Any) -> SystemZeroDecisionTrigger:
    kwargs = helpers.trigger_kwargs(
        key_namespace=task_namespace("d", "history", channel, -1),
        source=channels.source(channel),
        **overrides,
    )
    _, serialized = SystemZeroDecisionTrigger(**kwargs).serialize()
    return SystemZeroDecisionTrigger(**json.loads(json.dumps(serialized)))


def _kinds(rows: list[dict[str, Any]]) -> list[str]:
    return [row["kind"] for row in rows]


async def test_one_history_spans_the_streams_given_back_and_opened_again(emulator: Emulator) -> None:
    channel = "history-leased"
    channels.publish(channel, "waiting\n")
    trigger = _trigger(channel, lease_after=0.0)
    async with running_trigger(trigger) as task:
        for step, state in enumerate(["waiting\nstep 1\n", "waiting\nstep 1\nJob is ready.\n"], start=1):
            # the state before is decided, and its stream given back
            await emulator.wait_for(lambda e, n=step: e.stats.decisions_delivered >= n, timeout=20)
            await helpers.until(lambda: helpers.dormant(trigger), 20, what="the stream given back")
            channels.publish(channel, state)
        async with asyncio.timeout(20):
            event = (await task).payload
    rows = event["decisions"]
    decisions = [row for row in rows if row["kind"] == "decision"]
    assert [row["disposition"] for row in decisions] == ["waiting", "waiting", "fired"]
    assert all(row["current"] for row in decisions)
    kinds = _kinds(rows)
    assert kinds[0] == "condition"
    assert kinds.count("state_change") == 3 and kinds.count("stream_opened") == 3
    assert kinds.count("stream_released") == 2  # given back twice, between the three decisions
    # each of the three decisions was a new reply: its start is marked, before its decision
    starts = [row for row in rows if row["kind"] == "billed_start"]
    assert [row["state_version"] for row in starts] == [d["state_version"] for d in decisions]
    assert all(start["at"] <= decision["at"] for start, decision in zip(starts, decisions, strict=True))
    released = [row for row in rows if row["kind"] == "stream_released"]
    assert all(row["reason"].startswith("nothing new for") for row in released)
    times = [row["at"] for row in rows[1:]]
    assert times == sorted(times)  # in time order, UTC ISO 8601
    assert all(at.endswith("Z") for at in times)


async def test_a_wait_that_times_out_carries_its_history(emulator: Emulator) -> None:
    channel = "history-timeout"
    channels.publish(channel, "waiting\n")
    trigger = _trigger(channel, deadline=time.time() + 3.0)
    async with running_trigger(trigger) as task:
        async with asyncio.timeout(20):
            event = (await task).payload
    assert event["status"] == "timeout"
    decisions = [row for row in event["decisions"] if row["kind"] == "decision"]
    assert [row["disposition"] for row in decisions] == ["waiting"]
    assert isinstance(event["decision_seconds"], list) and len(event["decision_seconds"]) == 1
