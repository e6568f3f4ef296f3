"""The emulator host's collector commands, against a real host process (no timing asserted)."""

from __future__ import annotations

import time

from benchmarks.emulator_host import EmulatorProcess


async def test_the_host_freezes_what_it_holds_and_reports_its_collector_pauses_since_a_moment() -> None:
    async with EmulatorProcess() as emulator:
        before_freeze = time.perf_counter()
        frozen = await emulator.call("freeze")
        assert frozen["frozen"] > 10_000  # the emulator and its imports, moved out of the collector's view
        pauses = await emulator.call("collections", since=0.0)
        assert all(len(pause) == 3 and pause[1] >= 1.0 and pause[2] in (0, 1, 2) for pause in pauses)
        # "since" is the parent's perf_counter(): the same monotonic clock in both processes
        assert all(
            start >= before_freeze for start, _, _ in await emulator.call("collections", since=before_freeze)
        )
        assert await emulator.call("collections", since=time.perf_counter() + 3600) == []
