"""The waiting scenario's stall figures: what each phase's watch covers (no timing asserted)."""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks.density import wait_all
from benchmarks.runner import StallWatchdog
from benchmarks.stalls import LoopSampler, phase_stalls, waiting_stalls


async def test_the_waiting_window_includes_one_full_collection() -> None:
    # nothing allocates while triggers wait: without the window's own gc.collect() the watch
    # would never see the pause a full pass over the waiting triggers costs
    report = (await waiting_stalls(0.1)).report()
    assert report["gc_passes"] >= 1
    assert report["longest_gc_generation"] == 2


def test_start_up_and_waiting_are_reported_apart() -> None:
    watches = {phase: StallWatchdog(0.01) for phase in ("start", "idle", "waiting", "cancel")}
    watches["start"].overruns, watches["start"].non_gc_overruns = [0.8], [0.05]
    watches["waiting"].overruns, watches["waiting"].non_gc_overruns = [0.3], [0.004]
    stalls = phase_stalls(watches)
    assert stalls["startup_stall_ms"] == 800.0
    assert stalls["startup_stall_without_gc_ms"] == 50.0
    assert stalls["waiting_stall_ms"] == 300.0
    assert stalls["waiting_stall_without_gc_ms"] == 4.0
    assert stalls["longest_stall_ms"] == 800.0
    assert set(stalls["stalls"]) == set(watches)


class _Trigger:
    def __init__(self) -> None:
        self.settled = False


class _Triggerer:
    """The part of :class:`benchmarks.runner.Triggerer` ``wait_all`` uses, counting task look-ups."""

    def __init__(self, tasks: dict[int, asyncio.Future[None]]) -> None:
        self.tasks = tasks
        self.lookups = 0

    def task(self, trigger_id: int) -> asyncio.Future[None]:
        self.lookups += 1
        return self.tasks[trigger_id]

    def payload(self, trigger_id: int) -> Any:
        return None


async def test_waiting_for_n_triggers_does_not_look_at_all_n_at_every_poll() -> None:
    # the harness runs in the loop it measures: looking at every trigger's task at every 50 ms
    # poll was an O(N) step inside the measured start-up phase
    loop = asyncio.get_running_loop()
    n = 1000
    triggers = [_Trigger() for _ in range(n)]
    triggerer = _Triggerer({i: loop.create_future() for i in range(n)})

    async def settle() -> None:
        for batch in range(8):  # an eighth at a time, in order, a poll or more apart
            await asyncio.sleep(0.06)
            for trigger in triggers[batch * n // 8 : (batch + 1) * n // 8]:
                trigger.settled = True

    settling = asyncio.ensure_future(settle())
    await wait_all(triggerer, list(range(n)), triggers, within=30, settled=lambda t: t.settled)
    await settling
    assert triggerer.lookups <= n  # once each, to be told when one ends
    for future in triggerer.tasks.values():
        future.cancel()


async def test_a_trigger_that_ends_while_the_others_settle_is_reported() -> None:
    loop = asyncio.get_running_loop()
    triggers = [_Trigger() for _ in range(3)]
    triggerer = _Triggerer({i: loop.create_future() for i in range(3)})
    loop.call_later(0.06, triggerer.tasks[1].set_result, None)
    try:
        await wait_all(triggerer, [0, 1, 2], triggers, within=30, settled=lambda t: t.settled)
    except RuntimeError as exc:
        assert "trigger 1 ended while waiting" in str(exc)
    else:
        raise AssertionError("an ended trigger went unnoticed")
    for future in triggerer.tasks.values():
        future.cancel()


def test_the_sampler_tags_each_collection_with_the_phase() -> None:
    sampler = LoopSampler()
    sampler.phase = "waiting"
    sampler.on_gc("start", {"generation": 2})
    sampler.on_gc("stop", {"generation": 2, "collected": 7})
    sampler.phase = "start"
    sampler.on_gc("start", {"generation": 0})
    sampler.on_gc("stop", {"generation": 0, "collected": 0})
    passes = sampler.full_collections()
    assert list(passes) == ["waiting"]
    assert passes["waiting"][0]["collected"] == 7
