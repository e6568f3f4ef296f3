"""A decision trigger's public ``progress``: where its wait stands, read from outside its run
(the seam the benchmarks read triggers through), for the real trigger against the real emulator."""

from __future__ import annotations

import asyncio
import json
import math

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests import helpers
from tests.dormant import channels
from tests.helpers import running_trigger, trigger_kwargs

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes


def _trigger(channel: str) -> SystemZeroDecisionTrigger:
    kwargs = trigger_kwargs(
        key_namespace=task_namespace("d", "progress", channel, -1),
        source=channels.source(channel),
        lease_after=0.05,
    )
    _, serialized = SystemZeroDecisionTrigger(**kwargs).serialize()
    return SystemZeroDecisionTrigger(**json.loads(json.dumps(serialized)))


async def test_progress_tells_the_newest_decision_and_whether_a_stream_is_held(emulator: Emulator) -> None:
    trigger = _trigger("progress")
    before = trigger.progress
    assert (before.running, before.dormant, before.decided_at, before.decided_state) == (
        False,
        False,
        -math.inf,
        None,
    )
    async with running_trigger(trigger) as task:
        # the first decision, about the state the source started with; then the stream goes back
        await emulator.wait_for(lambda _: trigger.progress.dormant, timeout=20)
        first = trigger.progress
        assert first.running and first.decided_state == "waiting\n"
        assert first.decided_at <= asyncio.get_running_loop().time()
        # a change wakes it: it holds a stream again until the newer state is decided
        channels.publish("progress", "waiting\nstep 1\n")
        await emulator.wait_for(lambda _: trigger.progress.decided_state == "waiting\nstep 1\n", timeout=20)
        assert trigger.progress.decided_at > first.decided_at and not task.done()
    assert not trigger.progress.running  # the run ended: nothing is held any more
