"""A decision trigger's public ``progress``: where its wait stands, read from outside its run
(the seam the benchmarks read triggers through), for the real trigger against the real emulator."""

from __future__ import annotations

import asyncio
import math

from airflow_provider_systemzero.emulator.server import Emulator
from tests import helpers
from tests.helpers import channel_trigger, channels, running_trigger

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes


async def test_progress_tells_the_newest_decision_and_whether_a_stream_is_held(emulator: Emulator) -> None:
    trigger = channel_trigger("progress", "progress")
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
