"""A trigger builds its stream only once its slot is near: when many triggers start (or wake)
together, at most twice ``max_streams_per_process`` streams are built and not yet open at any
moment, the rest wait without one (the real triggers against the real emulator)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.stream import default_capacity
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from airflow_provider_systemzero.triggers.streaming import TriggerStream
from tests import helpers
from tests.helpers import running_trigger, trigger_kwargs

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes

TRIGGERS = 24


async def test_many_triggers_starting_together_build_their_streams_only_as_slots_near(
    emulator: Emulator, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    capacity = default_capacity()
    assert capacity.limit == 4
    built: set[int] = set()  # streams built and not open yet
    most = 0
    build, enter = TriggerStream.build, TriggerStream.enter

    def counting_build(self: TriggerStream, state: Any, **kwargs: Any) -> Any:
        nonlocal most
        stream = build(self, state, **kwargs)
        built.add(id(stream))
        most = max(most, len(built))
        return stream

    async def counting_enter(self: TriggerStream, stream: Any) -> None:
        try:
            await enter(self, stream)
        finally:
            built.discard(id(stream))

    monkeypatch.setattr(TriggerStream, "build", counting_build)
    monkeypatch.setattr(TriggerStream, "enter", counting_enter)
    caplog.set_level(logging.INFO, logger="airflow_provider_systemzero.stream.capacity")
    triggers = []
    for n in range(TRIGGERS):
        log = tmp_path / f"job-{n}.log"
        log.write_text("Job is ready.\n")
        triggers.append(
            SystemZeroDecisionTrigger(
                **trigger_kwargs(
                    key_namespace=task_namespace("d", "room", f"r{n}", -1),
                    source={"type": "file", "path": str(log), "poll_interval": 3600.0},
                )
            )
        )
    async with contextlib.AsyncExitStack() as stack:
        tasks = [await stack.enter_async_context(running_trigger(trigger)) for trigger in triggers]
        async with asyncio.timeout(60):
            events = await asyncio.gather(*tasks)
    assert [e.payload["status"] for e in events] == ["success"] * TRIGGERS
    # every trigger built a stream, but never more than twice the slots were built and not open
    assert 0 < most <= capacity.opening_room(), most
    assert capacity.building == 0 and capacity.in_use == 0
    waits = [r.getMessage() for r in caplog.records if "waiting to build a stream" in r.getMessage()]
    assert waits and "twice max_streams_per_process" in waits[0]  # the wait says why
