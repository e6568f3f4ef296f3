"""What a dormant decision trigger keeps, object by object: everything reachable from its task that
its run created, with no stream, session, connection, socket or timer among it, and few enough
objects for the collector (the real trigger against the real emulator over loopback)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import socket
import types
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.budget import DecisionBudget
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.stream.decision_stream import DecisionStream
from tests.dormant import channels
from tests.dormant.test_dormant_trigger import _trigger, emulator, rules_file  # noqa: F401 (fixtures)

#: Objects tracked by the collector that one dormant trigger's task keeps beyond what existed before
#: it started: its task, the future it awaits, its callback and context (7), the trigger and its records (trigger, stream, lease,
#: source, the request's two dicts and the source's description: 7), the coroutine frames of the one
#: await on the source (``run()`` and its step, the deadline scope, the wait, the dormant wait, the
#: source's ``changes()`` and its step: 7), and this test's push source (an async generator with an
#: ``asyncio.Queue``: 12). Measured: 33 (39 before the dormant wait, the callable source's await,
#: the shared decision filter and connection settings, and the tuple of skipped states).
MAX_TRACKED = 36

#: What a dormant trigger must not keep: the stream, its session and connection, and any timer.
FORBIDDEN = (
    DecisionStream,
    ClientSession,
    socket.socket,
    asyncio.BaseTransport,
    asyncio.StreamReader,
    asyncio.StreamWriter,
    asyncio.TimerHandle,
)

#: Shared objects a walk never enters: what they reach existed before the trigger and is not its own.
_SHARED = (type, types.ModuleType, types.FunctionType, types.CodeType, asyncio.AbstractEventLoop)


def _kept(root: Any, existing: set[int]) -> list[Any]:
    """The collector-tracked objects reachable from ``root`` that did not exist in ``existing``."""
    found: list[Any] = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in existing or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        if gc.is_tracked(obj):
            found.append(obj)
        todo.extend(gc.get_referents(obj))
    return found


async def _dormant(emulator: Emulator, channel: str) -> tuple[Any, asyncio.Future[Any], Any]:  # noqa: F811
    trigger = _trigger(channel)
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    await emulator.wait_for(lambda _: trigger._stream.dormant, timeout=20)
    await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
    return trigger, task, gen


async def _stop(trigger: Any, task: asyncio.Future[Any], gen: Any) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await task
    await gen.aclose()
    await trigger.cleanup()


async def test_a_dormant_trigger_keeps_a_few_objects_and_nothing_of_its_stream(
    emulator: Emulator,  # noqa: F811
) -> None:
    # a first trigger loads everything a trigger loads once per process (modules, caches)
    await _stop(*await _dormant(emulator, "footprint-warm-up"))
    gc.collect()
    before = gc.get_objects()  # kept alive, so that no new object reuses an id of theirs
    existing = {id(o) for o in before}
    trigger, task, gen = await _dormant(emulator, "footprint")
    try:
        gc.collect()
        kept = _kept(task, existing)
        assert trigger in kept and gen in kept  # the walk reaches the trigger through its task
        census = collections.Counter(type(o).__qualname__ for o in kept)
        forbidden = [o for o in kept if isinstance(o, FORBIDDEN)]
        assert forbidden == [], f"a dormant trigger keeps {forbidden}"
        assert len(kept) <= MAX_TRACKED, f"{len(kept)} tracked objects: {census.most_common()}"
        assert channels.readers("footprint") == 1  # still waiting on its source
    finally:
        del before
        await _stop(trigger, task, gen)


@pytest.mark.parametrize("kind", FORBIDDEN[:3])
def test_the_walk_finds_a_stream_object_a_trigger_would_keep(kind: type) -> None:
    """The walk above can fail: an object of a forbidden kind hung on a record is found."""
    before = gc.get_objects()
    existing = {id(o) for o in before}
    holder: dict[str, Any] = {"kept": kind.__new__(kind)}  # no __init__: no socket is opened
    try:
        assert any(isinstance(o, kind) for o in _kept(holder, existing))
    finally:
        del before
        if isinstance(holder["kept"], socket.socket):
            holder["kept"].detach()


async def test_a_stream_given_back_is_freed_without_the_collector(emulator: Emulator) -> None:  # noqa: F811
    """A closed stream leaves no cycle of ours behind: reference counting frees the stream, its
    session and its budget when the trigger goes dormant, so the collector's full passes (which
    visit every waiting trigger) have none of it to find."""
    await _stop(*await _dormant(emulator, "freed-warm-up"))
    gc.collect()
    ours = (DecisionStream, ClientSession, DecisionBudget)
    assert [o for o in gc.get_objects() if type(o) in ours] == []  # type(): a weak proxy is among them
    gc.disable()
    try:
        trigger, task, gen = await _dormant(emulator, "freed")
        left = collections.Counter(type(o).__qualname__ for o in gc.get_objects() if type(o) in ours)
    finally:
        gc.enable()
    try:
        assert left == collections.Counter(), f"a closed stream waits for the collector: {left}"
    finally:
        await _stop(trigger, task, gen)
