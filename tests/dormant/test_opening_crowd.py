"""Triggers that start or wake together build their streams a few at a time: at most twice
``max_streams_per_process`` streams are being built and opened at once, and every trigger still
gets its decision and goes dormant (the real triggers against the real emulator over loopback).
The rest wait on one future each, not with a whole stream built."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.stream import default_capacity
from airflow_provider_systemzero.triggers.opening import OPENINGS, Opening
from airflow_provider_systemzero.triggers.streaming import TriggerStream
from tests.dormant.test_dormant_trigger import _trigger, emulator, rules_file  # noqa: F401 (fixtures)

CROWD = 14


async def test_a_crowd_of_triggers_builds_at_most_twice_the_cap_of_streams_at_once(
    emulator: Emulator,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    building = 0  # streams built and not entered yet
    most = 0
    open_stream, enter = TriggerStream.open, TriggerStream.enter

    def counting_open(self: TriggerStream, state: Any, **kwargs: Any) -> Any:
        nonlocal building, most
        building += 1
        most = max(most, building)
        return open_stream(self, state, **kwargs)

    async def counting_enter(self: TriggerStream, stream: Any, follow: Any) -> Any:
        nonlocal building
        try:
            return await enter(self, stream, follow)
        finally:
            building -= 1

    monkeypatch.setattr(TriggerStream, "open", counting_open)
    monkeypatch.setattr(TriggerStream, "enter", counting_enter)
    triggers = [_trigger(f"crowd-{i}") for i in range(CROWD)]
    gens = [t.run() for t in triggers]
    tasks = [asyncio.ensure_future(anext(g)) for g in gens]
    try:
        await emulator.wait_for(lambda _: all(t._stream.dormant for t in triggers), timeout=60)
        assert not any(task.done() for task in tasks)
        assert emulator.stats.decisions_delivered >= CROWD  # each got its first decision
        limit = default_capacity().limit
        assert 2 * limit < CROWD  # else the bound below says nothing
        assert 0 < most <= 2 * limit, f"{most} streams built at once (at most {2 * limit})"
        openings = OPENINGS[asyncio.get_running_loop()]
        assert all(o.active == 0 and not o.waiters for o in openings.values())  # every place given back
    finally:
        for task in tasks:
            task.cancel()
        for task, gen, trigger in zip(tasks, gens, triggers, strict=True):
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await task
            await gen.aclose()
            await trigger.cleanup()


async def test_a_waiter_cancelled_as_it_is_let_in_passes_its_place_on() -> None:
    opening = Opening()
    room = opening.room()
    for _ in range(room):
        await opening.let_in()
    first = asyncio.ensure_future(opening.let_in())
    second = asyncio.ensure_future(opening.let_in())
    await asyncio.sleep(0)
    assert len(opening.waiters) == 2 and opening.active == room
    opening.leave()  # the first waiter is let in ...
    first.cancel()  # ... and cancelled before it runs: its place goes to the second
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, timeout=5)
    assert opening.active == room and not opening.waiters
    for _ in range(room):
        opening.leave()
    assert opening.active == 0
