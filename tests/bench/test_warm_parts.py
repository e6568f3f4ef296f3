"""What the latency scenario tells beside its warm figures: how far the p50 moves within a run
(``blocks``), the emulator's own share of each change (``gateway``), how much slower a fixed piece
of Python runs just after a wake (``python_after_wake``), and how the page shows them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks import latency
from benchmarks.report import render
from benchmarks.report_format import DASH, TIMES, fmt_ms

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "latest.json"


def test_each_samples_frames_are_the_ones_inside_its_window() -> None:
    windows = [(10.0, 10.002), (20.0, 20.003), (30.0, 30.001)]
    frames = [
        (9.9995, 0.4, 0.4),  # before the first change (its first decision): no sample's
        (20.0005, 0.5, 0.45),  # the second change: two frames, summed
        (10.0004, 0.7, 0.6),  # the first change, listed out of order
        (20.001, 0.25, 0.2),
        (30.5, 9.0, 9.0),  # after the last event
    ]
    share = latency.gateway_share(windows, frames)
    assert share["n"] == 2 and share["frames_per_sample"] == [0, 1, 2]
    assert share["p50_ms"] == pytest.approx((0.7 + 0.75) / 2)
    assert share["max_ms"] == pytest.approx(0.75)
    assert share["cpu_p50_ms"] == pytest.approx((0.6 + 0.65) / 2)


def test_the_blocks_p50_are_of_whole_blocks_only() -> None:
    samples = [0.001] * 100 + [0.002] * 100 + [0.009] * 99
    assert latency.blocks_p50_ms(samples) == pytest.approx([1.0, 2.0])  # the 99 left are no block
    assert latency.blocks_p50_ms([*samples, 0.009]) == pytest.approx([1.0, 2.0, 9.0])
    assert latency.blocks_p50_ms([0.003] * 20, size=10) == pytest.approx([3.0, 3.0])
    assert latency.blocks_p50_ms([0.003] * 60) == []


def _quiet(doc: dict) -> dict:
    """The latest results on a quiet machine: the page's lines, not the load of whichever run wrote
    the file last (a loaded one adds a sentence to every missed figure)."""
    return {**doc, "machine": {**doc["machine"], "load_average_before": [0.0], "load_average_after": [0.0]}}


def _page(lat: dict) -> str:
    doc = _quiet(json.loads(RESULTS.read_text()))
    return render({**doc, "results": {"latency": lat}, "kept_from": {}, "baseline": None})


#: A wake probe's figures (``loopback_floor.python_after_wake``).
WAKE = {"n": 500, "woken_p50_us": 9.43, "hot_p50_us": 4.21, "ratio": 2.24}


def _measured(
    figure: str, *, warm: float, floor: float, gateway: float, back_to_back: float, wake: dict | None = None
) -> dict:
    """The latest run's latency results with the warm push ``figure`` (``p50_ms``, ``p99_ms``)
    and what stands beside it set, two blocks of 100, and the wake probe only when given."""
    lat = json.loads(RESULTS.read_text())["results"]["latency"]
    share = {"n": 500, "p50_ms": 0.551, "p99_ms": 1.2, "cpu_p50_ms": 0.54, figure: gateway}
    blocks = {"samples": 100, "p50_ms": [1.36, 1.97]}
    lat["warm"] = {**lat["warm"], figure: warm, "blocks": blocks, "gateway": share}
    lat["loopback_floor"] = {**lat["loopback_floor"], figure: floor}
    lat["loopback_floor"].pop("python_after_wake", None)
    if wake is not None:
        lat["loopback_floor"]["python_after_wake"] = wake
    lat["warm_back_to_back"] = {**lat["warm"], figure: back_to_back}
    return lat


def _missed_line(lat: dict, percentile: str) -> str:
    """The page's one line on the warm push ``percentile`` (``p50``, ``p99``), marked missed."""
    lat["figures_met"] = {**lat["figures_met"], f"push_{percentile}_ms": False}
    prefix = f"- Change → event, push source, warm stream: {percentile}"
    [line] = [line for line in _page(lat).splitlines() if line.startswith(prefix)]
    return line


def test_the_page_shows_the_spread_and_the_gateways_share_when_the_run_has_them() -> None:
    then = json.loads(RESULTS.read_text())["results"]["latency"]
    for key in ("warm", "warm_back_to_back"):
        then.get(key, {}).pop("blocks", None)
        then.get(key, {}).pop("gateway", None)
    now = copy.deepcopy(then)
    now["warm"]["blocks"] = {"samples": 100, "p50_ms": [1.31, 1.72, 1.44]}
    now["warm"]["gateway"] = {"n": 300, "p50_ms": 0.612, "p99_ms": 1.9, "cpu_p50_ms": 0.598}
    now["warm_back_to_back"] = {
        **now["warm"],
        "blocks": {"samples": 100, "p50_ms": [0.55]},
        "gateway": {"n": 100, "p50_ms": 0.21, "p99_ms": 0.4, "cpu_p50_ms": 0.2},
    }
    page = _page(now)
    assert f"with the idle gap {fmt_ms(1.31)}{DASH}{fmt_ms(1.72)} (3 blocks of 100)" in page
    assert f"back to back {fmt_ms(0.55)} (1 block of 100)" in page
    assert f"with the idle gap p50 {fmt_ms(0.612)} (CPU {fmt_ms(0.598)}), p99 {fmt_ms(1.9)}" in page
    assert f"back to back p50 {fmt_ms(0.21)} (CPU {fmt_ms(0.2)})" in page
    # a run that measured neither (older code) says nothing of them
    page = _page(then)
    assert "each block of samples" not in page and "emulator's own handling" not in page


def test_a_missed_warm_p50_quotes_what_the_same_run_measured_around_it() -> None:
    lat = _measured("p50_ms", warm=1.71, floor=0.675, gateway=0.551, back_to_back=0.832)
    line = _missed_line(lat, "p50")
    assert line == (
        f"- Change → event, push source, warm stream: p50 ≤ 1.5 ms, measured {fmt_ms(1.71)}. In the same "
        f"run, at the median: the loopback floor {fmt_ms(0.675)}; the emulator's own handling of the "
        f"change {fmt_ms(0.551)}; the same path back to back (no idle gap before the change) "
        f"{fmt_ms(0.832)}; the warm p50 of each 100 samples in turn {fmt_ms(1.36)}{DASH}{fmt_ms(1.97)}."
    )


async def test_the_fixed_work_is_timed_after_each_wake_and_then_back_to_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import random

    calls: list[int] = []

    def fixed_work() -> float:  # the first 5 calls come after each reply, the next 5 back to back
        calls.append(len(calls))
        return 0.000009 if len(calls) <= 5 else 0.000003

    monkeypatch.setattr(latency, "fixed_work", fixed_work)
    floor = await latency.loopback_floor(5, random.Random(1), gap=0.0)
    assert "python_after_wake" not in floor and calls == []
    floor = await latency.loopback_floor(5, random.Random(1), gap=0.0, probe=True)
    wake = floor["python_after_wake"]
    assert floor["n"] == 5 and wake["n"] == 5 and len(calls) == 10
    assert wake["woken_p50_us"] == pytest.approx(9.0)
    assert wake["hot_p50_us"] == pytest.approx(3.0)
    assert wake["ratio"] == pytest.approx(3.0)


def test_the_fixed_work_takes_time_and_returns_it() -> None:
    assert 0 < latency.fixed_work() < 1.0


def test_the_page_and_a_missed_warm_p50_quote_the_slowdown_after_a_wake() -> None:
    lat = json.loads(RESULTS.read_text())["results"]["latency"]
    lat["loopback_floor"] = {**lat["loopback_floor"], "python_after_wake": WAKE}
    phrase = (
        "a fixed piece of Python (one frame decoded, 100 small calls) took 9.4 µs just after a reply "
        f"woke the process, against 4.2 µs back to back (2.2{TIMES})"
    )
    assert f"Beside the loopback floor, {phrase}. The client handles" in _page(lat)
    assert _missed_line(lat, "p50").endswith(f"; {phrase}.")
    # a run that did not measure it says nothing of it
    lat["loopback_floor"].pop("python_after_wake")
    assert "fixed piece of Python" not in _page(lat)


def test_a_missed_warm_p99_quotes_the_same_runs_p99_figures() -> None:
    lat = _measured("p99_ms", warm=5.61, floor=5.83, gateway=2.14, back_to_back=8.62, wake=WAKE)
    line = _missed_line(lat, "p99")
    # the same percentile throughout; the blocks and the wake probe are medians, so not quoted
    assert line == (
        f"- Change → event, push source, warm stream: p99 ≤ 5 ms, measured {fmt_ms(5.61)}. In the same "
        f"run, at the p99: the loopback floor {fmt_ms(5.83)}; the emulator's own handling of the change "
        f"{fmt_ms(2.14)}; the same path back to back (no idle gap before the change) {fmt_ms(8.62)}."
    )


def test_a_missed_crowd_figure_quotes_the_cpu_of_both_processes_beside_the_baseline() -> None:
    """The emulator's share is the gateway's stand-in: when it rises with the triggers' for the
    same changes, the host ran slower, and the line says so with the numbers."""
    doc = _quiet(json.loads(RESULTS.read_text()))
    lat = copy.deepcopy(doc["results"]["latency"])
    crowd = lat["crowds"]["push"]
    crowd.update(change_phase_cpu_pct=40.3, change_phase_emulator_cpu_pct=20.6)
    crowd["emulator_collections"] = {"longest_ms": 24.8, "over_1ms": 38, "full": 1}
    crowd["latency"] = {**crowd["latency"], "p99_ms": 28.9}
    lat["figures_met"] = {**lat["figures_met"], "push_crowd_p99_ms": False}
    then = copy.deepcopy(lat)
    then["crowds"]["push"].update(change_phase_cpu_pct=28.1, change_phase_emulator_cpu_pct=13.4)
    page = render({**doc, "results": {"latency": lat}, "kept_from": {}, "baseline": {"latency": then}})
    [line] = [x for x in page.splitlines() if x.startswith("- 1,000 triggers on push sources") and "p99" in x]
    assert line.endswith(
        "In the same run, over the changes: 40.3 % of a core (triggers) and 20.6 % (emulator), against "
        "28.1 % of a core (triggers) and 13.4 % (emulator) for the same changes in the baseline run; "
        f"the emulator's longest collector pause {fmt_ms(24.8)}."
    )
