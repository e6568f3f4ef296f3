"""What a dormant decision trigger holds: everything reachable from its task that its run created,
walked object by object, holds no stream, session, connection, socket, transport or timer (but the
deadline's), whatever the source (the real trigger against the real emulator over loopback, on a
push source and on a tailed file); and what a closed stream leaves is freed by reference counting.
How many objects a waiting trigger keeps is a figure of the benchmark page, not a rule here."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import socket
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.budget import DecisionBudget
from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.protocol.client import ClientSession
from airflow_provider_systemzero.sources import file_watch
from airflow_provider_systemzero.sources.callable import CallableSource
from airflow_provider_systemzero.sources.file import FileSource
from airflow_provider_systemzero.stream.decision_stream import DecisionStream
from tests import helpers
from tests.helpers import alive, channel_trigger, channels, live_timers, new_since, provider_timers

#: What a dormant trigger must not keep: the stream, its session and connection, and any timer.
FORBIDDEN = (*helpers.stream_kinds(), asyncio.TimerHandle)


async def _dormant(
    emulator: Emulator,
    channel: str,
    **overrides: Any,
) -> tuple[Any, asyncio.Future[Any], Any]:
    trigger = channel_trigger("dormant", channel, **overrides)
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
    await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
    return trigger, task, gen


async def _stop(trigger: Any, task: asyncio.Future[Any], gen: Any) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await task
    await gen.aclose()
    await trigger.cleanup()


async def test_a_dormant_trigger_keeps_nothing_of_its_stream(
    emulator: Emulator,
) -> None:
    # a first trigger loads everything a trigger loads once per process (modules, caches)
    await _stop(*await _dormant(emulator, "footprint-warm-up"))
    gc.collect()
    before = gc.get_objects()  # kept alive, so that no new object reuses an id of theirs
    existing = {id(o) for o in before}
    trigger, task, gen = await _dormant(emulator, "footprint")
    try:
        gc.collect()
        kept = helpers.kept_objects(task, existing)
        assert trigger in kept and gen in kept  # the walk reaches the trigger through its task
        forbidden = [o for o in kept if isinstance(o, FORBIDDEN)]
        assert forbidden == [], f"a dormant trigger keeps {forbidden}"
        assert channels.readers("footprint") == 1  # still waiting on its source
        # with no timer, the run awaits its source's own future: no wake-up future of the driver's.
        # What waits is the future the source's changed() gave (the same one until it completes)
        # and the channel's waiter the source's generator awaits; nothing else.
        [source] = [o for o in kept if isinstance(o, CallableSource)]
        change = source.changed()
        waiting = {id(o) for o in kept if isinstance(o, asyncio.Future) and not o.done()}
        tasks = {id(o) for o in kept if isinstance(o, asyncio.Task)}
        assert waiting - tasks == {id(change), *map(id, channels.waiters("footprint"))}
    finally:
        del before
        await _stop(trigger, task, gen)


async def test_a_dormant_trigger_keeps_no_tree_of_its_condition_or_request(emulator: Emulator) -> None:
    """The condition a waiting sensor's rules use is the one its trigger parsed from its kwargs,
    and its request is kept as compact JSON text until a stream needs it: no plain-JSON tree of
    either is kept (the trigger serializes both from what it keeps)."""
    await _stop(*await _dormant(emulator, "condition-warm-up"))
    trigger, task, gen = await _dormant(emulator, "condition")
    try:
        gc.collect()
        kept = helpers.kept_objects(task, set())
        condition = trigger.decision_condition
        copies = [o for o in kept if isinstance(o, dict) and o.get("question") == condition.question]
        assert copies == [], f"a dormant trigger keeps its condition again as {copies}"
        requests = [o for o in kept if isinstance(o, dict) and "questions" in o]
        assert requests == [], f"a dormant trigger keeps its request as {requests}"
        kwargs = trigger.serialize()[1]
        assert kwargs["condition"] == condition.to_dict()
        assert kwargs["request"] == channel_trigger("dormant", "condition").request
    finally:
        await _stop(trigger, task, gen)


async def test_a_deadline_is_the_one_timer_a_dormant_trigger_keeps(emulator: Emulator) -> None:
    """With a deadline (a sensor's ``timeout``), the wait's scope is the one timer a dormant trigger
    keeps."""
    await _stop(*await _dormant(emulator, "deadline-warm-up", deadline=time.time() + 3600))
    gc.collect()
    before = gc.get_objects()
    existing = {id(o) for o in before}
    trigger, task, gen = await _dormant(emulator, "deadline", deadline=time.time() + 3600)
    try:
        gc.collect()
        kept = helpers.kept_objects(task, existing)
        timers = [o for o in kept if isinstance(o, asyncio.TimerHandle)]
        assert len(timers) == 1 and timers[0].when() > asyncio.get_running_loop().time() + 3000
        assert [o for o in kept if isinstance(o, FORBIDDEN) and o not in timers] == []
    finally:
        del before
        await _stop(trigger, task, gen)


async def test_a_dormant_asset_watch_awaits_its_source_from_its_own_run(emulator: Emulator) -> None:
    """The asset watcher's trigger goes dormant the same way: nothing of its stream is left."""
    from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger

    trigger = SystemZeroDecisionEventTrigger(
        systemzero_conn_id=channel_trigger("dormant", "watch-footprint").systemzero_conn_id,
        request=channel_trigger("dormant", "watch-footprint").request,
        condition=channel_trigger("dormant", "watch-footprint").condition,
        state="",
        watch_id="watch-footprint",
        source=channels.source("watch-footprint"),
        lease_after=0.05,
    )
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    try:
        await emulator.wait_for(lambda _: helpers.dormant(trigger), timeout=20)
        await emulator.wait_for(lambda emu: emu.stats.streams_open == 0, timeout=10)
        gc.collect()
        kept = helpers.kept_objects(task, set())
        assert [o for o in kept if isinstance(o, FORBIDDEN)] == []
        assert trigger.progress.dormant and trigger.open_stream is None
    finally:
        await _stop(trigger, task, gen)


async def test_dormant_file_triggers_keep_no_timer_and_share_one_watcher_and_one_recheck(
    emulator: Emulator,
    tmp_path: Path,
) -> None:
    """N triggers tailing N files (each in a directory of its own) on notifications: none keeps a
    timer or anything of its stream; the process keeps one watcher and one safety re-check timer
    for all."""

    def file_source(name: str) -> dict[str, Any]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "job.log").write_text("waiting\n")
        return {"type": "file", "path": str(tmp_path / name / "job.log"), "poll_interval": 3600.0}

    await _stop(*await _dormant(emulator, "file-warm-up", source=file_source("warm-up"), state=""))
    gc.collect()
    before = gc.get_objects()
    existing = {id(o) for o in before}
    n = 5
    running = [
        await _dormant(emulator, f"file-{i}", source=file_source(f"job-{i}"), state="") for i in range(n)
    ]
    try:
        gc.collect()
        watcher = file_watch.current_watcher()
        assert watcher is not None
        for trigger, task, _ in running:
            kept = helpers.kept_objects(task, existing, shared=(file_watch.FileWatcher,))
            assert [o for o in kept if isinstance(o, FORBIDDEN)] == []
            [source] = [o for o in kept if isinstance(o, FileSource)]
            assert source.path == trigger.source["path"] and source.subscribed  # watched (one watcher)
        # one descriptor, one watch per directory, one re-check timer, and no timer of any source's
        assert watcher.stats()["descriptors"] == 1 and watcher.stats()["subscriptions"] == n
        timers = provider_timers()
        callbacks = [callback for handle, callback in live_timers() if handle in timers]
        owners = [getattr(callback, "__self__", None) for callback in callbacks]
        assert all(owner is watcher for owner in owners), timers  # none of a source or a trigger
        rechecks = [c for c in callbacks if c == watcher.recheck_now]
        assert len(rechecks) == 1 and watcher.stats()["recheck_timers"] == 1
    finally:
        del before
        for trigger, task, gen in running:
            await _stop(trigger, task, gen)


@pytest.mark.parametrize("kind", FORBIDDEN[:3])
def test_the_walk_finds_a_stream_object_a_trigger_would_keep(kind: type) -> None:
    """The walk above can fail: an object of a forbidden kind hung on a record is found."""
    before = gc.get_objects()
    existing = {id(o) for o in before}
    holder: dict[str, Any] = {"kept": kind.__new__(kind)}  # no __init__: no socket is opened
    try:
        assert any(isinstance(o, kind) for o in helpers.kept_objects(holder, existing))
    finally:
        del before
        if isinstance(holder["kept"], socket.socket):
            holder["kept"].detach()


async def test_a_stream_given_back_is_freed_without_the_collector(emulator: Emulator) -> None:
    """A closed stream leaves no cycle of ours behind: reference counting frees the stream, its
    session and its budget when the trigger goes dormant, so the collector's full passes (which
    visit every waiting trigger) have none of it to find."""
    ours = (DecisionStream, ClientSession, DecisionBudget)
    earlier = alive(*ours)  # what earlier tests of this process left is not this test's
    await _stop(*await _dormant(emulator, "freed-warm-up"))
    assert new_since(earlier, alive(*ours)) == []
    gc.disable()
    try:
        trigger, task, gen = await _dormant(emulator, "freed")
        left = collections.Counter(
            type(o).__qualname__ for o in new_since(earlier, alive(*ours, collect=False))
        )
    finally:
        gc.enable()
    try:
        assert left == collections.Counter(), f"a closed stream waits for the collector: {left}"
    finally:
        await _stop(trigger, task, gen)


async def test_a_closed_connection_leaves_no_transport_for_the_collector(
    emulator: Emulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asyncio's socket transport keeps bound methods of itself (a reference cycle CPython breaks
    only in ``close()``, and 3.11 never): the client's socket releases them when its connection is
    lost, so every connection a trigger opens and closes is freed by reference counting."""
    from airflow_provider_systemzero.stream.gateway_socket import GatewaySocket

    transports: list[weakref.ref[asyncio.BaseTransport]] = []
    made = GatewaySocket.connection_made

    def connection_made(self: GatewaySocket, transport: asyncio.BaseTransport) -> None:
        transports.append(weakref.ref(transport))
        made(self, transport)

    monkeypatch.setattr(GatewaySocket, "connection_made", connection_made)
    await _stop(*await _dormant(emulator, "transport-warm-up"))
    gc.disable()
    try:
        trigger, task, gen = await _dormant(emulator, "transport")
        await asyncio.sleep(0)  # the transport's own end of the connection runs in a callback
        left = [ref() for ref in transports if ref() is not None]
    finally:
        gc.enable()
    try:
        assert len(transports) == 2  # the warm-up's connection and this trigger's
        assert left == [], f"a closed connection's transport waits for the collector: {left}"
    finally:
        await _stop(trigger, task, gen)
