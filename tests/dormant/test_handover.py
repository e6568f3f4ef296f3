"""The stream slot is handed over on events, never by polling: a waiter asks an idle holder at
once, and gets the freed slot within a loop iteration of its release (the capacity alone, no
network); and a trigger that owes its stream nothing holds no slot a waiting trigger needs (the
real triggers against the real emulator)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import StreamCapacity, default_capacity
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests import helpers
from tests.helpers import live_timers, running_trigger, trigger_kwargs

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes


def _live_timers() -> list[asyncio.TimerHandle]:
    return [handle for handle, _ in live_timers()]


async def test_a_queued_waiter_asks_the_idle_holder_and_gets_the_slot_without_polling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    capacity = StreamCapacity(1)
    await capacity.acquire()
    asked = asyncio.Event()
    offer = capacity.offer(asked.set)
    assert capacity.offered == 1 and not asked.is_set()  # nobody waits: the holder keeps its slot
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.stream.capacity")
    waiter = asyncio.ensure_future(capacity.acquire())
    async with asyncio.timeout(5):
        await asked.wait()  # the holder was asked because a waiter queued
    assert _live_timers() == []  # nothing polls: no timer was ever scheduled
    capacity.release()  # the holder gives its slot back ...
    assert capacity.in_use == 1 and capacity.waiting == 0  # ... and the waiter has it at once
    capacity.withdraw(offer)
    await asyncio.sleep(0)  # the waiter's wake-up runs in the next iteration
    await asyncio.sleep(0)  # and its task resumes in the one after
    assert waiter.done() and waiter.exception() is None
    waits = [r for r in caplog.records if "waiting for a stream slot" in r.getMessage()]
    assert len(waits) == 1, waits  # said once, not every tick
    capacity.release()


async def test_one_idle_holder_is_asked_per_waiter() -> None:
    capacity = StreamCapacity(2)
    await capacity.acquire()
    await capacity.acquire()
    asked: list[str] = []
    offers = [capacity.offer(lambda n=n: asked.append(n)) for n in ("a", "b")]
    waiter = asyncio.ensure_future(capacity.acquire())
    for _ in range(3):
        await asyncio.sleep(0)
    assert asked == ["a"]  # the oldest idle holder, and only one of them
    capacity.withdraw(offers[0])  # "a" found work after all: the next idle holder is asked
    for _ in range(3):
        await asyncio.sleep(0)
    assert asked == ["a", "b"]
    capacity.release()
    capacity.withdraw(offers[1])
    await waiter
    capacity.release()
    capacity.release()
    assert capacity.in_use == 0 and capacity.offered == 0


def _file_trigger(log: Any, name: str, **overrides: Any) -> SystemZeroDecisionTrigger:
    kwargs = trigger_kwargs(
        key_namespace=task_namespace("d", "handover", name, -1),
        source={"type": "file", "path": str(log), "poll_interval": 3600.0},
        **overrides,
    )
    return SystemZeroDecisionTrigger(**kwargs)


async def test_triggers_that_decide_nothing_initially_hold_no_slot_a_waiting_trigger_needs(
    emulator: Emulator, tmp_path: Any
) -> None:
    """As many ``decide_initial=False`` triggers as the process has slots, on quiet files, hold
    none of them: a trigger whose file already says ready fires at once, not after the gateway's
    idle goodbye (120 s) ends one of their streams."""
    assert default_capacity().limit == 4
    quiet = []
    for n in range(4):
        log = tmp_path / f"quiet-{n}.log"
        log.write_text("job started\n")
        quiet.append(_file_trigger(log, f"quiet-{n}", decide_when=r"READY|FAILED", decide_initial=False))
    ready = tmp_path / "ready.log"
    ready.write_text("Job is ready.\n")
    async with contextlib.AsyncExitStack() as stack:
        tasks = [await stack.enter_async_context(running_trigger(trigger)) for trigger in quiet]
        await helpers.until(
            lambda: all(t.progress.read_state == "job started\n" for t in quiet),
            10,
            what="the quiet triggers to read their files",
        )
        assert emulator.stats.streams_total == 0  # nothing to decide: no stream, no slot
        async with running_trigger(_file_trigger(ready, "ready", lease_after=30.0)) as task:
            async with asyncio.timeout(15):
                event = await task
        assert event.payload["status"] == "success" and event.payload["decision"] is True
        assert not any(t.done() for t in tasks)
