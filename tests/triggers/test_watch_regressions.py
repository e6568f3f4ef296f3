"""What a careful DAG author ran into with the trigger layer before it became one watch, each
through the public trigger classes against the real emulator over loopback:

1. a ``min_true_for`` run fired on a state the source had already replaced;
2. with ``decide_when``, a stream reopened after a wait decided the line it woke on, not the newest;
4. a FIFO as a file source blocked the whole event loop;
5. hung ``decide_when`` callables starved the loop's shared executor;
6. a cancelled asset watcher left a pending task behind;
8. a callable source returning the same list, appended in place, was never seen to change.

(3, ``decide_initial=False`` holding slots, is in ``tests/dormant/test_handover.py``.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.triggers.decision import (
    SystemZeroDecisionEventTrigger,
    SystemZeroDecisionTrigger,
)
from tests import helpers
from tests.helpers import TRIGGER_CONN_ID, TRIGGER_REQUEST, channels, running_trigger, watching_events
from tests.helpers import trigger_callables as callables

rules_file = helpers.rules_file  # the fixture

#: Rules in order: a failed job is not ready (first), a ready one is.
RULES = {
    **helpers.TRIGGER_RULES,
    "rules": [
        {
            "question": "ready",
            "pattern": "(?i)failed",
            "answer": False,
            "probability": 0.1,
            "confidence": 0.9,
        },
        *helpers.TRIGGER_RULES["rules"],
    ],
}
STARTED = "job started\n"
READY = STARTED + "Job is ready.\n"
FAILED = READY + "job failed\n"


def _emulator(monkeypatch: pytest.MonkeyPatch, rules_file: str, **kwargs: Any) -> Any:
    return helpers.recording_emulator(rules_file, monkeypatch, RULES, **kwargs)


def _sensor(name: str, source: Any, **overrides: Any) -> SystemZeroDecisionTrigger:
    kwargs = helpers.trigger_kwargs(key_namespace=task_namespace("d", "regressions", name, -1), source=source)
    kwargs.update(overrides)
    _, serialized = SystemZeroDecisionTrigger(**kwargs).serialize()
    return SystemZeroDecisionTrigger(**json.loads(json.dumps(serialized)))  # as the triggerer rebuilds it


def _watcher(name: str, source: Any, **overrides: Any) -> SystemZeroDecisionEventTrigger:
    return SystemZeroDecisionEventTrigger(
        systemzero_conn_id=TRIGGER_CONN_ID,
        request=TRIGGER_REQUEST,
        condition=overrides.pop("condition", helpers.TRIGGER_CONDITION),
        state="",
        watch_id=name,
        source=source,
        **overrides,
    )


# ------------------------------------------------------------------ 1. min_true_for


@pytest.mark.parametrize(
    ("kind", "mode", "lease_after"),
    [
        ("sensor", "on_change", 30.0),
        ("sensor", "on_request", 30.0),
        ("sensor", "on_change", 0.0),  # the stream is given back while the run waits on time
        ("asset watch", "on_change", 30.0),
    ],
)
async def test_min_true_for_never_fires_on_a_state_the_source_already_replaced(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, kind: str, mode: str, lease_after: float
) -> None:
    """Decisions take 2 s, ``min_true_for`` is 1.5 s: "Job is ready." is decided (the run starts),
    then the log says the job failed; the run's time passes while that state is being decided.
    The old decision must not fire: the source no longer holds its state."""
    channel = f"min-true-for-{kind}-{mode}-{lease_after}".replace(" ", "-")
    channels.publish(channel, STARTED)
    condition = DecisionCondition("ready", True, min_confidence=0.5, min_true_for=1.5).to_dict()
    build = _sensor if kind == "sensor" else _watcher
    trigger = build(
        channel, channels.source(channel), condition=condition, decision_mode=mode, lease_after=lease_after
    )
    async with _emulator(monkeypatch, rules_file, decide_latency_ms=2000) as (emu, decider):
        runner = running_trigger(trigger) if kind == "sensor" else watching_events(trigger)
        async with runner as running:
            await emu.wait_for(lambda e: e.stats.decisions_delivered >= 1, timeout=20)  # the start: not ready
            channels.publish(channel, READY)
            await emu.wait_for(
                lambda e: e.stats.decisions_delivered >= 2, timeout=20
            )  # ready: the run starts
            await asyncio.sleep(0.3)
            channels.publish(channel, FAILED)  # replaced long before the run is 1.5 s old
            await emu.wait_for(lambda e: e.stats.decisions_delivered >= 3, timeout=20)  # failed: not ready
            await helpers.until(lambda: decider.states[-1] == FAILED, 5, what="the failed state decided")
            for _ in range(20):
                await asyncio.sleep(0.01)
            if kind == "sensor":
                assert not running.done(), running.result().payload
            else:
                events, _task = running
                assert events == [], [event.payload for event in events]


# ------------------------------------------------------------------ 2. decide_when, reopened


def _file_source(path: Path) -> dict[str, Any]:
    return {"type": "file", "path": str(path), "notifications": "poll", "poll_interval": 0.05}


def _callable_source() -> dict[str, Any]:
    return {"type": "callable", "path": "tests.helpers.trigger_callables.read_value", "poll_interval": 0.05}


@pytest.mark.parametrize("source_kind", ["polled file", "sync callable"])
async def test_a_stream_reopened_with_decide_when_decides_the_newest_line(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source_kind: str
) -> None:
    """A dormant trigger wakes on a line matching ``decide_when`` and waits out
    ``min_interval_ms``; meanwhile the source gains a newer line. The stream that opens decides
    the newest state, and the line it woke on never fires the sensor."""
    log = tmp_path / "job.log"

    def write(state: str) -> None:
        if source_kind == "polled file":
            log.write_text(state)
        else:
            callables.VALUE["state"] = state

    write(STARTED)
    source = _file_source(log) if source_kind == "polled file" else _callable_source()
    trigger = _sensor(
        f"reopened-{source_kind}",
        source,
        decide_when=r"(?i)ready|failed",
        min_interval_ms=2000,
        lease_after=0.0,
    )
    async with _emulator(monkeypatch, rules_file) as (emu, decider), running_trigger(trigger) as task:
        # the initial state is decided, and the stream given back
        await emu.wait_for(
            lambda e: e.stats.decisions_delivered >= 1 and e.stats.streams_open == 0, timeout=20
        )
        after = len(decider.states)
        write(READY)  # matches: a decision is due, once min_interval_ms has passed
        await asyncio.sleep(0.5)
        write(FAILED)  # the newer line, while the trigger waits
        await emu.wait_for(lambda e: len(decider.states) > after, timeout=20)
        await asyncio.sleep(0.3)
        assert decider.states[after] == FAILED, f"decided {decider.states[after]!r}, not the newest state"
        assert READY not in decider.states[after:]
        assert not task.done(), task.result().payload


# ------------------------------------------------------------------ 4. a FIFO


def test_a_fifo_as_a_file_source_ends_the_wait_naming_the_path_and_never_blocks_the_loop(
    rules_file: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fifo = tmp_path / "job.log"
    os.mkfifo(fifo)
    result: dict[str, Any] = {}

    async def run() -> None:
        async with helpers.loopback_emulator(rules_file, monkeypatch):
            trigger = _sensor("fifo", {"type": "file", "path": str(fifo)})
            async with running_trigger(trigger) as task, asyncio.timeout(10):
                result["event"] = (await task).payload

    # the trigger runs on a loop of its own thread: a loop blocked opening the FIFO fails the
    # test instead of hanging it
    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # the loop is stuck opening the FIFO: a writer lets it go
        with open(fifo, "w"):
            pass
        thread.join(10)
        pytest.fail("the event loop blocked opening a FIFO")
    event = result["event"]
    assert event["status"] == "error" and event["error_type"] == "validation"
    assert str(fifo) in event["message"] and "FIFO" in event["message"]


# ------------------------------------------------------------------ 5. hung decide_when callables


async def test_hung_decide_when_callables_do_not_starve_the_loops_executor(
    rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two triggers whose decide_when callable hangs, on a loop whose shared executor has two
    threads: every other ``to_thread`` of the process (other triggers' file reads) still runs, and
    a callable that does not return within its timeout ends its trigger with an error naming it."""
    from airflow_provider_systemzero.triggers import driver

    monkeypatch.setattr(driver, "DECIDE_WHEN_TIMEOUT", 2.0)
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    loop.set_default_executor(executor)
    callables.RELEASE.clear()
    names = ["hung-gate-1", "hung-gate-2"]
    for name in names:
        channels.publish(name, STARTED)
    triggers = [
        _sensor(name, channels.source(name), decide_when={"callable": "tests.helpers.trigger_callables.hang"})
        for name in names
    ]
    try:
        async with _emulator(monkeypatch, rules_file) as (emu, _), contextlib.AsyncExitStack() as stack:
            tasks = [await stack.enter_async_context(running_trigger(t)) for t in triggers]
            await emu.wait_for(lambda e: e.stats.decisions_delivered >= 2, timeout=20)
            for name in names:
                channels.publish(name, READY)  # each trigger asks its gate about the change
            await helpers.until(lambda: callables.HANGING == 2, 10, what="both gates hanging")
            assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5) == 42
            async with asyncio.timeout(15):
                events = [(await task).payload for task in tasks]
        for event in events:
            assert event["status"] == "error"
            assert (
                "tests.helpers.trigger_callables.hang" in event["message"]
                and "did not return within" in event["message"]
            )
    finally:
        callables.RELEASE.set()
        executor.shutdown(wait=False)


# ------------------------------------------------------------------ 6. a cancelled asset watcher


async def test_a_cancelled_asset_watcher_leaves_no_pending_task(
    rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triggerer cancels a watch that fired and holds its stream, waiting for the next
    transition: nothing of it is left pending (a task left so is later destroyed, with asyncio's
    "Task was destroyed but it is pending!")."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    channel = "cancelled-watch"
    channels.publish(channel, READY)
    trigger = _watcher(channel, channels.source(channel), lease_after=30.0)
    try:
        async with _emulator(monkeypatch, rules_file) as (emu, _):
            before = asyncio.all_tasks()  # the emulator's own tasks are not the watch's
            async with watching_events(trigger) as (events, _task):
                await helpers.until(lambda: len(events) == 1, 20, what="the first event")
                assert emu.stats.streams_open == 1  # held: the watch waits for the next transition
            left = {task for task in asyncio.all_tasks() - before if "emulator" not in repr(task.get_coro())}
            assert left == set(), left
        gc.collect()
        await asyncio.sleep(0)
        assert not [message for message in reported if "destroyed but it is pending" in message], reported
    finally:
        loop.set_exception_handler(handler)


# ------------------------------------------------------------------ 8. a list appended in place


async def test_a_callable_source_returning_one_list_appended_in_place_is_seen_to_change(
    rules_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    callables.GROWING.clear()
    callables.GROWING.append({"status": "started"})
    request = {
        "model": "sz-test",
        "questions": {"ready": {"type": "boolean", "instructions": "Is the job ready?"}},
    }
    trigger = _sensor(
        "growing-list",
        {"type": "callable", "path": "tests.helpers.trigger_callables.growing_list", "poll_interval": 0.05},
        request=request,
        state=[],
        lease=False,  # the stream is held: the change must be seen while it is open
    )
    async with helpers.loopback_emulator(rules_file, monkeypatch) as emu, running_trigger(trigger) as task:
        await emu.wait_for(lambda e: e.stats.decisions_delivered >= 1, timeout=20)
        callables.GROWING.append({"status": "Job is ready."})  # the same list, one item more
        async with asyncio.timeout(10):
            event = (await task).payload
    assert event["status"] == "success" and event["decision"] is True
