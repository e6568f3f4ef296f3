"""Unit tests of how the deployment test tells, from the trigger logs, whether a trigger ran in
two triggerers at once (no Airflow components needed: runs under plain ``make test``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.helpers.deployment.reporting import double_runs, trigger_spans


def _log(home: Path, task: str, job: int, seconds: list[int]) -> None:
    directory = home / "logs" / "dag_id=d" / "run_id=r" / f"task_id={task}"
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"timestamp": f"2026-01-01T00:00:{s:02d}.000000Z", "event": "x"}) for s in seconds]
    (directory / f"attempt=1.log.trigger.{job}.log").write_text("\n".join([*lines, "not json"]) + "\n")


def test_spans_per_triggerer_job_and_overlaps(tmp_path: Path) -> None:
    home: Any = SimpleNamespace(home=tmp_path)
    _log(tmp_path, "handed_over", 1, [0, 5, 10])
    _log(tmp_path, "handed_over", 2, [30, 40])  # adopted after the first triggerer stopped
    _log(tmp_path, "ran_twice", 1, [0, 20])
    _log(tmp_path, "ran_twice", 2, [15, 25])  # both wrote lines from 15 to 20 s
    _log(tmp_path, "stayed", 2, [3])

    spans = trigger_spans(home, "d", "r")

    assert sorted(spans) == ["handed_over", "ran_twice", "stayed"]
    assert sorted(spans["handed_over"]) == [1, 2]
    first, last = spans["handed_over"][1]
    assert last - first == 10
    assert double_runs(spans) == {"ran_twice": 5.0}
