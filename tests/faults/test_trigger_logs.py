"""What the sensor's trigger tells a person reading the task log: a budget refusal once, and a
hysteresis line that says what is still needed."""

from __future__ import annotations

import logging
import re

import pytest

from airflow_provider_systemzero.decisions.budget import DecisionBudget
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from tests.helpers.faults import HarnessFactory, set_source


async def test_a_budget_refusal_is_logged_once(
    make_harness: HarnessFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    h = await make_harness()
    set_source("s", "build 7 started\n")
    budget = DecisionBudget(max_decisions=1, scope="the test task").to_kwargs()
    task = h.start(h.sensor("s", budget=budget))
    await h.until(lambda e: e.stats.decisions_delivered == 1)
    set_source("s", "build 7 started\nstill building\n")  # the next dispatch does not fit
    payload = await task
    assert payload["status"] == "error" and "max_decisions=1" in payload["message"], payload
    refusals = [r for r in caplog.records if "max_decisions=1" in r.getMessage()]
    assert len(refusals) == 1, [f"{r.name}: {r.getMessage()}" for r in refusals]
    assert refusals[0].levelno == logging.WARNING


async def test_the_hysteresis_line_says_what_is_still_needed(
    make_harness: HarnessFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """One qualifying decision is enough, but only after 1.5 s: the run grows past one meanwhile."""
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.triggers.decision")
    h = await make_harness()
    text = "build 7 started\nREADY\n"
    set_source("s", text)
    condition = DecisionCondition(
        "ready", True, min_confidence=0.5, consecutive=1, min_true_for=1.5
    ).to_dict()
    task = h.start(h.sensor("s", condition=condition))
    for n in range(3):  # three more ready states, each decided while the run is not old enough
        await h.until(lambda e, n=n: e.stats.decisions_delivered >= n + 1)
        text += f"still READY {n}\n"
        set_source("s", text)
    payload = await task
    assert payload["status"] == "success" and payload["streak"]["consecutive"] >= 2, payload
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hysteresis:")]
    assert lines
    overflow = [
        line
        for line in lines
        if (m := re.search(r"(\d+) of (\d+) decisions", line)) and int(m[1]) > int(m[2])
    ]
    assert not overflow, overflow
    assert all("needed" in line for line in lines), lines
