"""Two races the session itself must close, through the stream against the emulator:

* a state mutated in place after it was handed over is still a change (the session snapshots
  what it accepts);
* after an on_change dispatch failed for good, another ``decide()`` on the unchanged state
  answers at once (the stored failure, or a replay) instead of waiting for the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from airflow_provider_systemzero.stream import Backoff, DecisionFailed
from tests.stream.support import EmulatorFactory, loopback_stream


@pytest.mark.parametrize("mode", ["on_request", "on_change"])
async def test_a_state_mutated_in_place_after_it_was_handed_over_is_sent(
    make_emulator: EmulatorFactory, fast_backoff: Backoff, mode: str
) -> None:
    emu = await make_emulator()
    items = ["build 7 started"]
    async with loopback_stream(emu, fast_backoff, f"mutated-{mode}", state=items, mode=mode) as stream:
        await stream.decide(timeout=5)
        items.append("Job is ready.")  # the caller's own list, changed after the stream took it
        await stream.set_state(items)
        await stream.wait_in_sync(timeout=5)
        latest = emu.latest_state(stream.request.prompt_cache_key or "")
        assert latest is not None and latest.state == ["build 7 started", "Job is ready."], latest
        decision = await stream.decide(timeout=5)
        assert decision.answer("ready").decision is True  # about the new content, not the old


async def test_decide_after_an_on_change_dispatch_failed_for_good_answers_at_once(
    make_emulator: EmulatorFactory, fast_backoff: Backoff
) -> None:
    emu = await make_emulator()
    emu.faults.delay_decisions_ms = 200  # the first decide() waits when the failure arrives
    emu.faults.fail_decides(1, status=400, code="invalid_request", retryable=False)
    async with loopback_stream(
        emu, fast_backoff, "failed-for-good", state="Job is ready.\n", mode="on_change"
    ) as stream:
        with pytest.raises(DecisionFailed):
            await stream.decide(timeout=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(DecisionFailed):
            await stream.decide(timeout=3)  # the same state: the stored failure, or a replay
        assert loop.time() - started < 1.0
