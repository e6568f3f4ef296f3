"""The benchmark results page says what its runs of record measured: the figures of its first
screen are those of ``benchmarks/results/latest.json``, each with the commit of its run, and its
lines fit a screen. A ``make bench`` that writes new results makes these fail until the page says
what the new run measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

PAGE = REPO / "docs" / "benchmarks-results.md"
RESULTS = REPO / "benchmarks" / "results" / "latest.json"

pytestmark = pytest.mark.skipif(
    not PAGE.is_file() or not RESULTS.is_file(),
    reason="needs the checkout's docs/ (a matrix corner runs a copy of tests/ and benchmarks/ alone)",
)


def _first_screen() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text.split("## What the missed targets mean", 1)[0]


def _results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def _commit(document: dict[str, Any], scenario: str) -> str:
    kept = document.get("kept_from", {}).get(scenario)
    return str(kept["commit"] if kept else document["machine"]["commit"])


def _date(document: dict[str, Any], scenario: str) -> str:
    kept = document.get("kept_from", {}).get(scenario)
    return str((kept or document)["started_at"])[:10]


def _section(heading: str) -> tuple[dict[str, Any], str]:
    """The results, and the part of the first screen under ``heading``."""
    return _results(), _first_screen().split(heading, 1)[1].split("\n### ", 1)[0]


def test_the_page_is_the_one_written_for_readers() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert text.startswith("# Benchmark results\n"), (
        "docs/benchmarks-results.md is not the written page: restore it with 'git checkout "
        "docs/benchmarks-results.md' and update its figures from benchmarks/results/latest.json "
        "(latest.md holds them as a table)"
    )


def test_the_page_fits_a_screen() -> None:
    long = [
        (number, len(line))
        for number, line in enumerate(Path(PAGE).read_text(encoding="utf-8").splitlines(), start=1)
        if len(line) > 100
    ]
    assert long == [], f"lines over 100 characters (line, length): {long}"


def test_the_triggerer_figures_are_the_runs_of_record() -> None:
    document, section = _section("### How many waiting sensors one triggerer holds")
    (push_5000,) = [
        group
        for group in document["results"]["waiting"]["groups"]
        if group["source"] == "push" and group["n"] == 5000 and group["gc_freeze"]
    ]
    assert f"| {push_5000['rss_per_trigger_kb']:.1f} KB" in section
    assert f"| {push_5000['idle_cpu_pct']:.2f} % of one core" in section
    assert f"| {push_5000['waiting_stall_ms']:.0f} ms |" in section
    density = max(document["results"]["density"]["runs"], key=lambda run: run["n"])
    assert density["n"] == 1000
    assert f"| {density['max_sockets_open']}, the gateway's cap per process" in section
    assert f"| {density['startup_s']:.1f} s |" in section
    assert f"{_date(document, 'waiting')} at commit `{_commit(document, 'waiting')}`" in section
    assert f"`{_commit(document, 'density')}` (scenario 2)" in section


def test_the_latency_figures_are_the_runs_of_record() -> None:
    document, section = _section("### How soon a Dag sees a change")
    latency = document["results"]["latency"]
    crowd = latency["crowds"]["file"]["latency"]
    for figures in (latency["file_warm"], crowd, latency["file_cold"]):
        assert f"| {figures['p50_ms']:.1f} ms | {figures['p99_ms']:.1f} ms |" in section, figures
    polled = latency["file_poll"]
    assert f"| {polled['p50_ms']:.0f} ms | {polled['p99_ms']:.0f} ms |" in section
    assert f"at commit `{_commit(document, 'latency')}`" in section


def test_the_billing_figures_are_the_runs_of_record() -> None:
    document, section = _section("### Decisions billed, against polling")
    billing = document["results"]["billing"]
    target = billing["decide_when_target"]
    assert f"`decide_initial=False` | {target['billed']} |" in section
    assert f'`decide_when="^READY$"` | {target["billed_with_initial"]} |' in section
    unfiltered = next(f for f in billing["filters"] if not f["knobs"])
    assert f"a decision on every change | {unfiltered['billed']} |" in section
    pokes = {p["poke_interval_s"]: p["billed"] for p in billing["poke"] if p["log"] == "busy" and p["keyed"]}
    assert f"`poke_interval` 30 s | {pokes[30.0]} |" in section and pokes[30.0] == target["poke_30s_billed"]
    assert f"`poke_interval` 60 s | {pokes[60.0]} |" in section
    assert set(billing["restart_added"].values()) == {0} and "each added 0 billed decisions" in section
    assert f"at commit `{_commit(document, 'billing')}`" in section


def test_the_asset_watch_figures_are_the_runs_of_record() -> None:
    document, section = _section("### Many asset watches of one source")
    for run in document["results"]["watchers"]["runs"]:
        mode = "one stream shared (Airflow 3.3)" if run["shared"] else "one stream each (Airflow 3.1, 3.2)"
        latency = run["last_event_latency"]
        row = (
            f"| {run['n']}, {mode} | {run['streams_opened']:,} ({run['max_streams_open']}) | "
            f"{run['billed_per_change']:.1f} | {latency['p50_ms']:.1f} ms / {latency['max_ms']:.1f} ms |"
        )
        assert row in section, row
    assert f"{_date(document, 'watchers')} at\ncommit `{_commit(document, 'watchers')}`" in section
