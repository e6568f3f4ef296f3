"""Asset watches of one source share one stream on Airflow 3.3, through Airflow's own trigger runner
(``TriggerRunner.run_trigger`` and its ``SharedStreamManager``) against the real emulator over
loopback: ten watches of one file and one question open one stream and are billed one decision per
change; each fires once per transition of its own condition (a low bar and a high bar fire at
different changes); a watch cancelled mid-run leaves the others running; a watch that joins late
starts from the current decision, billed nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero import compat
from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.triggers import watching
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from benchmarks.runner import Triggerer
from tests import helpers
from tests.helpers import TRIGGER_CONN_ID, TRIGGER_REQUEST, until

pytestmark = pytest.mark.skipif(
    not compat.has_shared_streams(), reason="this Airflow has no shared streams (3.3+): each watch runs alone"
)

rules_file = helpers.rules_file  # the fixture

#: "all done" is ready for sure (0.95), "half done" maybe (0.6), anything else not.
LEVEL_RULES: dict[str, Any] = {
    "rules": [
        {
            "question": "ready",
            "pattern": "(?i)all done",
            "answer": True,
            "probability": 0.95,
            "confidence": 0.9,
        },
        {
            "question": "ready",
            "pattern": "(?i)half done",
            "answer": True,
            "probability": 0.6,
            "confidence": 0.9,
        },
    ],
    "default": {"answer": False, "probability": 0.2, "confidence": 0.8},
}
LOW, HIGH = 0.5, 0.9


def _watch(
    log: Path, name: str, bar: float, min_true_for: float = 0.0, conn_id: str = TRIGGER_CONN_ID
) -> SystemZeroDecisionEventTrigger:
    """An asset watch of ``log`` for ``ready`` with probability at least ``bar`` (for
    ``min_true_for`` seconds), rebuilt from its serialized kwargs as the triggerer does (the
    stream is kept a minute when quiet)."""
    trigger = SystemZeroDecisionEventTrigger(
        systemzero_conn_id=conn_id,
        request=TRIGGER_REQUEST,
        condition=DecisionCondition("ready", True, min_probability=bar, min_true_for=min_true_for).to_dict(),
        state="",
        watch_id=name,
        source={"type": "file", "path": str(log), "poll_interval": 0.05},
        lease_after=60.0,
    )
    return SystemZeroDecisionEventTrigger(**trigger.serialize()[1])


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """The watched job log, as the job starts."""
    path = tmp_path / "job.log"
    path.write_text("job started\n")
    return path


@asynccontextmanager
async def _triggerer(
    rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, Triggerer]]:
    """The emulator answering by :data:`LEVEL_RULES`, and Airflow's trigger runner; on exit every
    trigger still running is cancelled."""
    async with helpers.recording_emulator(rules_file, monkeypatch, LEVEL_RULES) as (emu, _):
        triggerer = Triggerer()
        try:
            yield emu, triggerer
        finally:
            await triggerer.finish()


async def _first_decided(emu: Any) -> None:
    await until(lambda: emu.stats.decisions_billed == 1, within=15, what="the first state decided")


def _fired(triggerer: Triggerer, trigger_id: int) -> list[dict[str, Any]]:
    return [entry.event.payload for entry in triggerer.events if entry.trigger_id == trigger_id]


async def test_ten_watches_of_one_file_share_one_stream_and_one_decision_per_change(
    log: Path, rules_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with _triggerer(rules_file, monkeypatch) as (emu, triggerer):
        low = [triggerer.start(_watch(log, f"low-{i}", LOW)) for i in range(5)]
        high = [triggerer.start(_watch(log, f"high-{i}", HIGH)) for i in range(5)]

        def counts() -> tuple[list[int], list[int]]:
            return [len(_fired(triggerer, t)) for t in low], [len(_fired(triggerer, t)) for t in high]

        async def change(text: str, billed: int, low_fired: list[int], high_fired: list[int]) -> None:
            await asyncio.to_thread(log.write_text, text)
            await until(
                lambda: emu.stats.decisions_billed == billed and counts() == (low_fired, high_fired),
                within=15,
                what=f"{billed} decisions billed and events {low_fired} {high_fired} after {text!r}",
            )

        await _first_decided(emu)
        await change("job half done\n", 2, [1] * 5, [0] * 5)  # only the low bar is met
        await change("job all done\n", 3, [1] * 5, [1] * 5)  # the high bar now; the low stays met
        await triggerer.cancel(low[0])  # leaves mid-run
        await change("job restarted\n", 4, [1] * 5, [1] * 5)  # neither met: no event
        # no event tells when the nine watches judged it: the next change waits until they did (a
        # change before would make this decision one about a state the source no longer holds,
        # which no watch counts, so "all done again" would continue the run that fired)
        await until(
            lambda: sum("decision at version 4:" in record.getMessage() for record in caplog.records) >= 9,
            within=15,
            what="the nine watches to judge the decision about 'job restarted'",
        )
        await change("job all done again\n", 5, [1] + [2] * 4, [2] * 5)  # both again, once each
        assert all(not triggerer.task(t).done() for t in [*low[1:], *high])
        stats = emu.stats
        assert stats.streams_total == 1 and stats.decisions_billed == 5
        assert {p["watch_id"] for t in high for p in _fired(triggerer, t)} == {f"high-{i}" for i in range(5)}
        assert all(p["probability"] == 0.95 for t in high for p in _fired(triggerer, t))
        assert _fired(triggerer, low[1])[0]["probability"] == 0.6
        await triggerer.finish()
        # the last watch leaving closed the stream
        await emu.wait_for(lambda e: e.stats.streams_open == 0, timeout=10)


async def test_a_watch_that_joins_late_starts_from_the_current_decision(
    log: Path, rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asyncio.to_thread(log.write_text, "job half done\n")
    async with _triggerer(rules_file, monkeypatch) as (emu, triggerer):
        first = triggerer.start(_watch(log, "first", HIGH))
        await _first_decided(emu)
        late = triggerer.start(_watch(log, "late", LOW))
        await until(lambda: len(_fired(triggerer, late)) == 1, within=10, what="the late watch's event")
        assert _fired(triggerer, first) == [] and emu.stats.decisions_billed == 1
        assert emu.stats.streams_total == 1


async def test_a_hold_ends_by_its_own_time_without_another_decision(
    log: Path, rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two watches of one stream, one of them holding a met decision for 0.4 s (``min_true_for``):
    the other fires with the decision, the holding one 0.4 s later, and nothing more is billed."""
    async with _triggerer(rules_file, monkeypatch) as (emu, triggerer):
        at_once = triggerer.start(_watch(log, "at-once", LOW))
        held = triggerer.start(_watch(log, "held", LOW, min_true_for=0.4))
        await _first_decided(emu)
        await asyncio.to_thread(log.write_text, "job half done\n")
        await until(lambda: len(_fired(triggerer, held)) == 1, within=15, what="the held watch's event")
        assert len(_fired(triggerer, at_once)) == 1
        assert triggerer.fired_at(held) - triggerer.fired_at(at_once) >= 0.35  # type: ignore[operator]
        assert _fired(triggerer, held)[0]["streak"]["true_for"] >= 0.4
        assert emu.stats.decisions_billed == 2


async def _fired_once_each(log: Path, emu: Any) -> set[str]:
    """Three watches of ``log`` in a new trigger runner, until each fired; the reply ids they fired
    with (the runner stopped and the stream closed on return)."""
    triggerer = Triggerer()
    ids = [triggerer.start(_watch(log, f"w-{i}", bar)) for i, bar in enumerate((LOW, HIGH, HIGH))]
    try:
        await until(lambda: all(_fired(triggerer, t) for t in ids), within=15, what="every watch's event")
        return {_fired(triggerer, t)[0]["reply_id"] for t in ids}
    finally:
        await triggerer.finish()
        await emu.wait_for(lambda e: e.stats.streams_open == 0, timeout=10)


async def test_a_restarted_triggerer_replays_the_group_decision_unbilled(
    log: Path, rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's keys derive from what its watches share: a triggerer restarted (every watch
    started again, in a new runner) replays the decision about the same state, billed once."""
    await asyncio.to_thread(log.write_text, "job all done\n")
    async with helpers.recording_emulator(rules_file, monkeypatch, LEVEL_RULES) as (emu, _):
        replies = [await _fired_once_each(log, emu) for _ in range(2)]
        assert replies[0] == replies[1] and len(replies[0]) == 1
        assert emu.stats.decisions_billed == 1 and emu.stats.streams_total == 2


async def test_a_failing_shared_stream_fails_no_watch_and_recovers(
    log: Path, rules_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The group's connection does not exist when the watches start: the shared stream says why and
    tries again (a raise would fail every watch of the group), and once the connection is created
    both watches fire."""
    monkeypatch.setattr(watching, "WATCH_RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(watching, "WATCH_RETRY_MAX_S", 0.4)
    caplog.set_level(logging.ERROR, logger=watching.__name__)
    await asyncio.to_thread(log.write_text, "job all done\n")
    async with _triggerer(rules_file, monkeypatch) as (emu, triggerer):
        ids = [
            triggerer.start(_watch(log, f"w-{bar}", bar, conn_id="systemzero_later")) for bar in (LOW, HIGH)
        ]
        await until(lambda: len(caplog.records) >= 2, within=20, what="two failures of the shared stream")
        assert "connection 'systemzero_later'" in caplog.records[0].getMessage()
        assert not any(triggerer.task(t).done() for t in ids)
        monkeypatch.setenv(
            "AIRFLOW_CONN_SYSTEMZERO_LATER", os.environ[f"AIRFLOW_CONN_{TRIGGER_CONN_ID.upper()}"]
        )
        await until(lambda: all(_fired(triggerer, t) for t in ids), within=20, what="both watches' events")
        assert emu.stats.decisions_billed == 1 and emu.stats.streams_total == 1
