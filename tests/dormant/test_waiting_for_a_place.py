"""What a trigger holds while it waits for its place among the streams being opened (its slot is
not near yet: every place is taken): that place and nothing of a stream — no stream, session,
connection or socket, no task of its own but its run, and no more than a few objects beyond what a
trigger waiting for its source holds (the real triggers against the real emulator over loopback).
Once a place is free it builds its stream, decides, and gives the stream back; the log says why it
waited. The bytes a waiting trigger costs are a figure of the benchmark page, not a rule here."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.stream import StreamSettings, default_capacity
from airflow_provider_systemzero.stream.capacity import OpeningPlace
from tests import helpers

emulator = helpers.emulator  # the fixture
rules_file = helpers.rules_file  # … and the one it takes

#: What a trigger waiting for its place must not hold: anything of a stream.
OF_A_STREAM = helpers.stream_kinds()

#: Collector-tracked objects a trigger waiting for its place may hold beyond one that waits for its
#: source: the place, its future, and the future the run's driver wakes on.
PLACE_OBJECTS = 3


@contextlib.asynccontextmanager
async def _places_taken(emu: Emulator) -> AsyncIterator[list[OpeningPlace]]:
    """Every place among the streams being opened to the emulator taken (the process allowed one
    stream, so two places), until the block ends; the process's limit is restored after."""
    capacity = default_capacity()
    limit = capacity.limit
    capacity.set_limit(1)
    url = StreamSettings(emu.origin, "demo").url
    taken = [capacity.ask_opening(url) for _ in range(capacity.opening_room(url))]
    try:
        assert all(place.future.done() for place in taken)
        yield taken
    finally:
        for place in taken:
            capacity.leave_opening(place)
        capacity.set_limit(limit)


class _Said(logging.Handler):
    def __init__(self, said: list[str]) -> None:
        super().__init__(logging.INFO)
        self.said = said

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


@contextlib.contextmanager
def _said(said: list[str]) -> Iterator[None]:
    """What the process's stream capacity logs in the block, into ``said`` (the trigger runner's
    logging set up by an earlier lookup may have replaced the capture's handlers)."""
    logger = logging.getLogger("airflow_provider_systemzero.stream.capacity")
    handler, level = _Said(said), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _own_tasks(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - before


async def test_a_trigger_waiting_for_its_place_holds_the_place_and_nothing_of_a_stream(
    emulator: Emulator,
) -> None:
    capacity = default_capacity()
    # a first trigger loads what a trigger loads once per process (modules, caches)
    async with helpers.running_trigger(helpers.channel_trigger("place", "place-warm-up")):
        await helpers.until(lambda: capacity.building == 0 and capacity.in_use == 0, 20)
    said: list[str] = []
    with _said(said):
        async with _places_taken(emulator):
            gc.collect()
            before = gc.get_objects()  # kept alive, so that no new object reuses an id of theirs
            existing = {id(o) for o in before}
            try:
                # the measure: a trigger that waits for its source and wants no stream yet
                tasks = asyncio.all_tasks()
                idle = helpers.channel_trigger("place", "place-idle", decide_initial=False)
                async with helpers.running_trigger(idle) as idle_task:
                    await helpers.until(lambda: helpers.dormant(idle), 20, what="the idle trigger waiting")
                    idle_tasks = len(_own_tasks(tasks))
                    gc.collect()
                    idle_kept = len(helpers.kept_objects(idle_task, existing))
                tasks = asyncio.all_tasks()
                waiting = helpers.channel_trigger("place", "place-waiting")
                async with helpers.running_trigger(waiting) as task:
                    await helpers.until(lambda: capacity.waiting_to_build == 1, 20, what="the trigger queued")
                    gc.collect()
                    kept = helpers.kept_objects(task, existing)
                    assert [o for o in kept if isinstance(o, OF_A_STREAM)] == []
                    # no task waits for the place: the run, and what reads its source (as the idle one's)
                    assert len(_own_tasks(tasks)) == idle_tasks
                    assert len(kept) <= idle_kept + PLACE_OBJECTS, (len(kept), idle_kept)
                    assert any("waiting to build a stream" in line for line in said)  # the wait's reason
                    del kept
            finally:
                del before


async def test_a_trigger_waiting_for_its_place_builds_its_stream_once_the_place_is_free(
    emulator: Emulator,
) -> None:
    capacity = default_capacity()
    billed = emulator.stats.decisions_billed
    async with _places_taken(emulator) as taken:
        trigger = helpers.channel_trigger("place", "place-freed")
        async with helpers.running_trigger(trigger):
            await helpers.until(lambda: capacity.waiting_to_build == 1, 20, what="the trigger queued")
            assert emulator.stats.streams_total == 0 and not helpers.dormant(trigger)
            capacity.leave_opening(taken.pop())  # one place frees: the trigger's
            await helpers.until(lambda: helpers.dormant(trigger), 20, what="a decision, and the stream back")
            assert capacity.waiting_to_build == 0 and emulator.stats.decisions_billed == billed + 1
