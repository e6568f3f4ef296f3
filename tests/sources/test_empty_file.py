"""A file without content is no evidence: nothing is sent, decided or billed until it has some.

A file that does not exist yet, an empty one, a truncation and the moment between a rotation and
the new file's first write all give the initial state with none of the file. The real triggers,
against the emulator, open no stream about such a state and send none to a stream they hold;
``"decide_empty": True`` decides it as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sources.spec import build_source
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from tests import helpers
from tests.helpers import (
    TRIGGER_CONDITION,
    TRIGGER_CONN_ID,
    TRIGGER_REQUEST,
    first_event,
    rebuilt,
    running_trigger,
    sensor_trigger,
    until,
    until_read,
)
from tests.helpers.sources import HOUR, spec, tailing

#: The file source's logger: it says when a file goes without content.
FILE_LOGGER = "airflow_provider_systemzero.sources.file"


def said_without_content(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the file source said that its file has no content, so nothing is sent or decided."""
    return any("until it has content" in record.getMessage() for record in caplog.records)


READY = "Job is ready.\n"


async def until_dormant(trigger: Any) -> None:
    """Wait until ``trigger`` waits for its source with no stream (bounded)."""
    await until(lambda: helpers.dormant(trigger), within=10, what="the trigger to wait with no stream")


# ------------------------------------------------------------------ the decision trigger


@pytest.mark.parametrize("empty", ["missing", "empty"])
async def test_a_file_without_content_opens_no_stream_until_it_has_some(
    emulator: Emulator, tmp_path: Path, empty: str
) -> None:
    log = tmp_path / "job.log"
    if empty == "empty":
        log.write_text("")
    trigger = rebuilt(sensor_trigger(source=spec(log)))
    async with running_trigger(trigger) as task:
        await until_dormant(trigger)
        stats = emulator.stats
        assert (stats.streams_total, stats.decisions_dispatched, stats.decisions_billed) == (0, 0, 0)
        log.write_text(READY)
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and event.payload["decision"] is True
    assert emulator.stats.decisions_billed == 1  # the content, and nothing before it


async def test_a_truncation_mid_wait_sends_and_decides_nothing_until_new_content(
    emulator: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=FILE_LOGGER)
    log = tmp_path / "job.log"
    log.write_text("starting\n")
    trigger = rebuilt(sensor_trigger(source=spec(log), lease_after=HOUR))  # it holds its stream
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda emu: emu.stats.decisions_delivered == 1)
        accepted = emulator.stats.events_accepted
        log.write_text("")  # truncated (a job re-run with shell `>`, copytruncate)
        await until(lambda: said_without_content(caplog), within=10, what="the source to read the truncation")
        assert emulator.stats.events_accepted == accepted and emulator.stats.decisions_dispatched == 1
        assert emulator.stats.streams_open == 1  # the stream is kept, with the last content
        log.write_text(READY)
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success"
    assert emulator.stats.decisions_billed == 2  # "starting", then the new content; never ""


async def test_a_file_deleted_while_dormant_reopens_nothing_until_it_returns(
    emulator: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=FILE_LOGGER)
    log = tmp_path / "job.log"
    log.write_text("starting\n")
    trigger = rebuilt(sensor_trigger(source=spec(log)))  # lease_after 0: dormant between changes
    async with running_trigger(trigger) as task:
        await emulator.wait_for(
            lambda emu: emu.stats.decisions_delivered == 1 and emu.stats.streams_open == 0
        )
        await until_dormant(trigger)
        log.unlink()  # rotated away; the new file comes later
        await until(lambda: said_without_content(caplog), within=10, what="the source to read the deletion")
        assert emulator.stats.streams_total == 1 and emulator.stats.decisions_dispatched == 1
        log.write_text(READY)
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and emulator.stats.decisions_billed == 2


async def test_decide_when_on_a_missing_file_decides_its_first_content(
    emulator: Emulator, tmp_path: Path
) -> None:
    """The first content is a change from the initial state: ``decide_initial=False`` does not skip it."""
    log = tmp_path / "job.log"
    trigger = rebuilt(sensor_trigger(source=spec(log), decide_when="(?i)ready", decide_initial=False))
    async with running_trigger(trigger) as task:
        await until_dormant(trigger)
        log.write_text("still working\n")  # content, but no decision is due for it
        await until_read(trigger, "still working\n")
        await until_dormant(trigger)
        assert emulator.stats.decisions_dispatched == 0
        with log.open("a") as handle:
            handle.write(READY)
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and emulator.stats.decisions_billed == 1


async def test_decide_empty_decides_a_missing_file(emulator: Emulator, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    trigger = rebuilt(sensor_trigger(source=spec(log, decide_empty=True)))
    async with running_trigger(trigger) as task:
        await emulator.wait_for(lambda emu: emu.stats.decisions_delivered == 1)
        assert not task.done()  # "" is not ready
        log.write_text(READY)
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and emulator.stats.decisions_billed == 2


@pytest.mark.parametrize(("empty", "cause"), [("missing", "does not exist"), ("empty", "is empty")])
async def test_the_deadline_names_the_file_without_content(
    emulator: Emulator, tmp_path: Path, empty: str, cause: str
) -> None:
    log = tmp_path / "job.log"
    if empty == "empty":
        log.write_text("")
    trigger = rebuilt(sensor_trigger(source=spec(log), deadline=time.time() + 0.5))
    payload = await first_event(trigger)
    assert payload["status"] == "timeout", payload
    assert f"{cause} (nothing is decided until it has content)" in payload["message"]
    assert emulator.stats.streams_total == 0


# ------------------------------------------------------------------ the asset watcher's trigger


async def test_the_event_trigger_waits_for_content_too(emulator: Emulator, tmp_path: Path) -> None:
    log = tmp_path / "status.txt"
    trigger = rebuilt(
        SystemZeroDecisionEventTrigger(
            systemzero_conn_id=TRIGGER_CONN_ID,
            request=TRIGGER_REQUEST,
            condition=TRIGGER_CONDITION,
            state="",
            watch_id="empty-file",
            source=spec(log),
        )
    )
    async with running_trigger(trigger) as task:
        await until_dormant(trigger)
        assert emulator.stats.streams_total == 0
        log.write_text(READY)
        async with asyncio.timeout(20):
            event = await task
    assert event.payload["status"] == "success" and emulator.stats.decisions_billed == 1


# ------------------------------------------------------------------ the source, and a poke's read


async def test_a_state_without_the_file_is_withheld_and_decide_empty_keeps_it(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("first\n")
    async with tailing(spec(log)) as (source, successive):
        assert await anext(successive) == "first\n"
        log.unlink()
        await asyncio.wait_for(source.changed(), 10)
        assert source.withheld(await source.read())  # the gap: nothing to decide
        log.write_text("second\n")
        async with asyncio.timeout(10):
            assert await anext(successive) == "second\n"  # the gap between them is not a state
    log.unlink()
    async with tailing(spec(log, decide_empty=True), initial="log:\n") as (source, successive):
        async with asyncio.timeout(10):
            assert await anext(successive) == "log:\n"
        assert not source.withheld("log:\n")


def test_a_poke_reads_a_file_without_content_as_nothing_to_decide(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    source = build_source(spec(log), "log:\n")
    assert source.withheld(source.read_now())
    assert "does not exist" in str(source.waiting_on()) and "must_exist" in str(source.waiting_on())
    log.write_text("")
    assert source.withheld(source.read_now())
    assert "is empty" in str(source.waiting_on()) and "decide_empty" in str(source.waiting_on())
    empty_decided = build_source(spec(log, decide_empty=True), "log:\n")
    assert not empty_decided.withheld(state := empty_decided.read_now()) and state == "log:\n"
    log.write_text(READY)
    assert not source.withheld(state := source.read_now()) and state == "log:\n" + READY


def test_decide_empty_must_be_a_bool() -> None:
    with pytest.raises(
        SystemZeroArgumentError, match=r"source.decide_empty must be true or false, got 'no'"
    ) as err:
        build_source(spec(Path("/tmp/job.log"), decide_empty="no"), "")
    assert err.value.field == "source.decide_empty"
