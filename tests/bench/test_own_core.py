"""The emulator on a CPU of its own (``EmulatorProcess(own_core=True)``) and how the page shows it."""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks.emulator_host import EmulatorProcess, split_cores
from benchmarks.report import render
from benchmarks.report_format import DASH, fmt_ms

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "latest.json"


@pytest.mark.skipif(split_cores() is None, reason="this process may run on one CPU only")
async def test_the_emulator_runs_on_a_cpu_of_its_own_and_this_process_gets_its_cpus_back() -> None:
    before = os.sched_getaffinity(0)
    split = split_cores()
    assert split is not None
    measured, emulator_cpu = split
    async with EmulatorProcess(own_core=True) as emulator:
        assert emulator.cores == {"measured": measured, "emulator": [emulator_cpu]}
        assert os.sched_getaffinity(emulator.pid) == {emulator_cpu}
        assert os.sched_getaffinity(0) == set(measured)
        seen: list[set[int]] = []
        thread = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join(10)
        assert seen == [set(measured)]  # a thread started meanwhile stays off the emulator's CPU
        assert (await emulator.stats())["streams_total"] == 0  # and the emulator answers
    assert os.sched_getaffinity(0) == before


async def test_without_own_core_nothing_is_pinned() -> None:
    before = os.sched_getaffinity(0)
    async with EmulatorProcess() as emulator:
        assert emulator.cores is None
        assert os.sched_getaffinity(0) == before
        assert os.sched_getaffinity(emulator.pid) == before


def _latency_page(latency: dict[str, Any], baseline: dict[str, Any]) -> str:
    doc = json.loads(RESULTS.read_text())
    return render(
        {
            **doc,
            "results": {"latency": latency},
            "kept_from": {},
            "baseline": {**baseline, "commit": "abc1234", "started_at": "2026-11-01T00:00:00"},
        }
    )


def test_the_shared_cores_rows_are_compared_with_a_baseline_that_shared_them() -> None:
    then = json.loads(RESULTS.read_text())["results"]["latency"]
    then.pop("cores", None)
    then.pop("shared_cores", None)
    now = copy.deepcopy(then)
    now["cores"] = {"measured": [0], "emulator": [1]}
    shared_warm = {**now["warm"], "p50_ms": 9.87654}
    now["shared_cores"] = {
        "warm": shared_warm,
        "loopback_floor": now["loopback_floor"],
        "push_crowd": now["crowds"]["push"],
    }
    page = _latency_page(now, {"latency": then})
    warm_row = next(line for line in page.splitlines() if "sharing the client's cores | warm stream" in line)
    # the baseline measured with shared cores: its plain warm figure is this row's 'before'
    assert f"| {fmt_ms(then['warm']['p50_ms'])} → {fmt_ms(9.87654)} |" in warm_row
    assert "gave the emulator CPU 1 and the client the others (0)" in page
    assert "push source, the emulator sharing the client's cores |" in page  # the shared crowd's row

    # a baseline that had its own cores too is compared row for row
    page = _latency_page(now, {"latency": now})
    assert "gave the emulator CPU" not in page


def test_the_back_to_back_rows_stand_beside_the_warm_figure() -> None:
    then = json.loads(RESULTS.read_text())["results"]["latency"]
    then.pop("warm_back_to_back", None)
    then.pop("loopback_floor_back_to_back", None)
    then["loopback_floor"].pop("python_after_wake", None)  # measured by the same later code
    now = copy.deepcopy(then)
    now["warm_back_to_back"] = {**now["warm"], "p50_ms": 0.61234}
    now["loopback_floor_back_to_back"] = {**now["loopback_floor"], "p50_ms": 0.21234}
    page = _latency_page(now, {"latency": then})
    warm = next(line for line in page.splitlines() if line.startswith("| push source, back to back |"))
    floor = next(line for line in page.splitlines() if "loopback floor, back to back |" in line)
    # measured only now: nothing before the arrow
    assert f"| {DASH} → {fmt_ms(0.61234)} |" in warm and f"| {DASH} → {fmt_ms(0.21234)} |" in floor
    # a run without them (older code) has no such rows
    assert "back to back" not in _latency_page(then, {"latency": then})


async def test_the_floor_back_to_back_leaves_no_gap() -> None:
    import random

    from benchmarks import latency

    class Gaps(random.Random):
        """Keeps the bounds each idle gap was drawn from."""

        def __init__(self) -> None:
            super().__init__(1)
            self.bounds: list[tuple[float, float]] = []

        def uniform(self, a: float, b: float) -> float:
            self.bounds.append((a, b))
            return super().uniform(a, b)

    gaps = Gaps()
    floor = await latency.loopback_floor(5, gaps, gap=0.0)
    assert floor["n"] == 5 and gaps.bounds == [(0.0, 0.0)] * 5
    gaps.bounds.clear()
    await latency.loopback_floor(5, gaps)
    assert gaps.bounds == [(0.0, latency.IDLE_GAP_S)] * 5
