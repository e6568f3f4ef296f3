"""An asset watch has no task to fail: after a failure it says why and tries again, ever more
slowly, instead of ending (which the triggerer answers by starting it again within seconds, over
and over, each time with a traceback).

A real watcher trigger against the emulator; the connection it names does not exist when it
starts, and is created while it waits.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.triggers import watching
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from tests.helpers import TRIGGER_CONDITION, TRIGGER_CONN_ID, TRIGGER_REQUEST, rebuilt, until, watching_events

READY = "Job is ready.\n"


def failures_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == watching.__name__ and r.levelno == logging.ERROR
    ]


async def test_a_missing_connection_is_reported_at_once_and_picked_up_when_created(
    emulator: Emulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(watching, "WATCH_RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(watching, "WATCH_RETRY_MAX_S", 0.4)
    caplog.set_level(logging.INFO)
    log = tmp_path / "status.log"  # no content yet: nothing would be decided for a while
    trigger = rebuilt(
        SystemZeroDecisionEventTrigger(
            systemzero_conn_id="systemzero_created_later",
            request=TRIGGER_REQUEST,
            condition=TRIGGER_CONDITION,
            state="",
            watch_id="late-connection",
            source={"type": "file", "path": str(log)},
        )
    )
    async with watching_events(trigger) as (events, task):
        # reported before the source has anything to decide, and again, more slowly, while it lasts
        await until(lambda: len(failures_logged(caplog)) >= 3, within=60, what="three failures logged")
        first = failures_logged(caplog)[0]
        assert first.startswith("asset watch 'late-connection' failed: connection 'systemzero_created_later'")
        assert "It keeps watching: it tries again in" in first
        assert "(3 times in a row)" in failures_logged(caplog)[2]
        assert not task.done()  # it never ended: the triggerer has nothing to restart
        connection = os.environ[f"AIRFLOW_CONN_{TRIGGER_CONN_ID.upper()}"]
        monkeypatch.setenv("AIRFLOW_CONN_SYSTEMZERO_CREATED_LATER", connection)
        log.write_text(READY)
        await until(lambda: len(events) == 1, within=20, what="the event once the connection exists")
        assert emulator.stats.decisions_billed == 1


async def test_the_wait_between_tries_doubles_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(watching.asyncio, "sleep", sleep)
    for failures in range(1, 8):
        await watching.wait_to_watch_again("w", failures, RuntimeError("boom"))
    assert slept == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]


def test_a_healthy_try_starts_the_count_again() -> None:
    """A watch that ran for days without a transition starts its next outage at 5 s, not 60 s."""
    assert watching.failures_in_a_row(4, watching.WATCH_HEALTHY_S - 1) == 5
    assert watching.failures_in_a_row(4, watching.WATCH_HEALTHY_S) == 1
