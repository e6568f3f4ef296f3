"""The simulated account of benchmarks/sharing.py: who is on it when, and the figures its table
shows (the pacing itself is tested in tests/ceiling/test_start_queue.py)."""

from __future__ import annotations

import math

from benchmarks.sharing import PHASE_S, TARGETS, members, scale, section


def test_a_run_of_sixteen_has_busy_and_light_processes_that_come_and_go() -> None:
    team, phases = members(16, seed=1)
    on_at = [
        sum(1 for m in team if m.joins <= at < m.leaves) for at in (60.0, PHASE_S + 60, 2 * PHASE_S + 60)
    ]
    assert on_at == [16, 14, 16]  # two leave after the first hour, two others join after the second
    assert sum(1 for m in team if m.light) == 4 and all(2 <= m.busy <= 6 for m in team if not m.light)
    assert phases == [(0.0, PHASE_S), (PHASE_S, 2 * PHASE_S), (2 * PHASE_S, 3 * PHASE_S)]


def test_one_process_alone_uses_the_ceiling_and_is_back_right_after_the_hiccup() -> None:
    run = scale(1, seed=0)
    assert run["ceiling_used"] >= TARGETS["ceiling_used"] and run["refused_per_accepted"] == 0
    assert run["back_to_90_s"] <= TARGETS["back_to_90_s"]
    assert run["slowest_process_back_to_90_s"] == run["back_to_90_s"]  # alone, the process is the account


def test_the_table_shows_before_and_after_beside_each_target() -> None:
    figures = {
        "ceiling_used": 1.0,
        "worst_fair_share": 0.9,
        "refused_per_accepted": 0.5,
        "back_to_90_s": 1.0,
        "slowest_process_back_to_90_s": None,
        "longest_wait_light_s": 3.0,
        "longest_wait_s": 30.0,
        "seeds": [0],
    }
    result = {
        "runs": {"pacing_16": figures, "local_bucket_16": {**figures, "back_to_90_s": math.inf}},
        "targets": TARGETS,
        "before": {"pacing_16": {**figures, "refused_per_accepted": 1.25, "back_to_90_s": 96.0}},
        "before_commit": "abc1234",
    }
    page = "\n".join(section(result))
    row = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines() if line.startswith("| ")}
    assert row["429s per accepted start: before"].endswith("| ≤ 0.1 | 1.25 |")
    assert row["429s per accepted start: after"].endswith("|  | 0.50 |")
    assert row["back to 90 % after the hiccup: before"].endswith("| 96 s |")
    assert row["back to 90 % after the hiccup: local bucket"].endswith("| never |")
    assert row["ceiling used: after"].endswith("| 100% |")
    assert "commit `abc1234`" in page
