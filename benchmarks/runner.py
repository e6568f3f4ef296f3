"""Running triggers the way Airflow's triggerer does, and watching the event loop meanwhile.

:class:`Triggerer` wraps Airflow's own ``TriggerRunner`` (``airflow.jobs.triggerer_job_runner``):
every trigger runs in ``TriggerRunner.run_trigger`` — the coroutine the triggerer runs for each
trigger (greenback portal, log context, tracing span, ``async for event in trigger.run()``,
``cleanup()`` on every exit) — as one task in the current loop. What is not used is the part
that needs a triggerer supervisor and a metadata database: ``arun()``'s loop that loads and
cancels triggers through the supervisor's comms. Triggers are handed over the way
``create_triggers`` does it: rebuilt from ``serialize()``, one ``asyncio.sleep(0)`` apart.

:class:`StallWatchdog` is Airflow's ``block_watchdog`` (sleep 0.1 s, compare with the clock)
with every overrun recorded instead of logged, and the garbage collector's share of it
measured apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import time
from collections import deque
from typing import Any

__all__ = [
    "EndedTasks",
    "StallWatchdog",
    "Triggerer",
    "count_sockets",
    "covered",
    "decided_at",
    "dormant",
    "rebuild",
    "rss_kb",
]


def rss_kb() -> int:
    """Resident set size of this process in KiB (``VmRSS`` from ``/proc/self/status``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def count_sockets() -> int:
    """Open socket file descriptors of this process (TCP and the loop's self-pipe)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
    return count


class SocketSampler:
    """Samples, every ``interval`` seconds on the running loop, this process's open sockets above
    ``baseline`` and the streams the process-wide capacity has in use, and keeps both maxima."""

    def __init__(self, baseline: int, interval: float = 0.02) -> None:
        self.baseline = baseline
        self.interval = interval
        self.max_open = 0
        self.max_capacity_in_use = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        from airflow_provider_systemzero.stream.capacity import default_capacity

        capacity = default_capacity()
        while True:
            self.max_open = max(self.max_open, count_sockets() - self.baseline)
            self.max_capacity_in_use = max(self.max_capacity_in_use, capacity.in_use)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def decided_at(trigger: Any) -> float:
    """The loop time of a decision trigger's newest current decision (``-inf`` before the first),
    from its public :attr:`~airflow_provider_systemzero.triggers.decision.SystemZeroDecisionTrigger.progress`."""
    return float(trigger.progress.decided_at)


def covered(trigger: Any) -> Any:
    """The state a decision trigger's newest current decision was about (``None`` before the first)."""
    return trigger.progress.decided_state


def dormant(trigger: Any) -> bool:
    """Whether a decision trigger's running wait holds no stream and waits for its source."""
    progress = trigger.progress
    return bool(progress.running and progress.dormant)


def rebuild(trigger: Any) -> Any:
    """What the triggerer does with a deferred trigger: build it again from ``serialize()``.

    The kwargs go through JSON, as they do through the metadata database, so each rebuilt
    trigger owns its kwargs (nothing is shared with the original or another trigger).
    """
    classpath, kwargs = trigger.serialize()
    kwargs = json.loads(json.dumps(kwargs))
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    return cls(**kwargs)


class _StampedEvents(deque):  # type: ignore[type-arg]
    """``TriggerRunner.events`` that remembers when each event was appended."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: dict[int, float] = {}

    def append(self, entry: Any) -> None:
        self.stamps.setdefault(entry.trigger_id, time.perf_counter())
        super().append(entry)


class Triggerer:
    """Runs triggers through Airflow's ``TriggerRunner.run_trigger`` in the running loop."""

    def __init__(self) -> None:
        from airflow.jobs.triggerer_job_runner import TriggerRunner

        self.runner = TriggerRunner()
        self.events = _StampedEvents()
        self.runner.events = self.events
        self._ids = itertools.count(1)

    def start(self, trigger: Any, name: str | None = None) -> int:
        """Start ``trigger`` (already rebuilt) as the triggerer would; returns its trigger ID."""
        trigger_id = next(self._ids)
        label = name or f"bench/{trigger_id}"
        self.runner.triggers[trigger_id] = {"task": None, "is_watcher": False, "name": label, "events": 0}
        task = asyncio.create_task(self.runner.run_trigger(trigger_id, trigger), name=label)
        self.runner.triggers[trigger_id]["task"] = task
        return trigger_id

    def task(self, trigger_id: int) -> asyncio.Task[Any]:
        """The task running a trigger."""
        return self.runner.triggers[trigger_id]["task"]

    def fired_at(self, trigger_id: int) -> float | None:
        """``perf_counter()`` when the trigger's first event reached the runner, or ``None``."""
        return self.events.stamps.get(trigger_id)

    def payload(self, trigger_id: int) -> dict[str, Any] | None:
        """The payload of the trigger's first event, or ``None``."""
        for entry in self.events:
            if entry.trigger_id == trigger_id:
                return entry.event.payload
        return None

    async def cancel(self, trigger_id: int) -> None:
        """Cancel a trigger the way a triggerer shutting down does (its ``cleanup()`` runs)."""
        task = self.task(trigger_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def finish(self) -> None:
        """Cancel every trigger still running and wait for them."""
        tasks = [
            t["task"] for t in self.runner.triggers.values() if t["task"] is not None and not t["task"].done()
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class EndedTasks:
    """Counts the triggers whose task ended, through done callbacks added before the changes begin.

    Waiting for the last of them with ``asyncio.wait()`` on all N tasks, as the density harness
    once did, added a done callback to each at the end of its change window: N handles at once,
    and a collector pass over them (11–14 ms for N = 1,000) that the window's last changes
    waited out.
    """

    def __init__(self, triggerer: Triggerer, ids: list[int]) -> None:
        self.count = 0
        self.expected = len(ids)
        self._all = asyncio.Event()
        for trigger_id in ids:
            triggerer.task(trigger_id).add_done_callback(self._one)

    def _one(self, _task: asyncio.Task[Any]) -> None:
        self.count += 1
        if self.count == self.expected:
            self._all.set()

    async def all(self, within: float) -> None:
        """Return when every trigger's task ended, or after ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all.wait(), within)


class LoopWatch:
    """A watch that runs one task on the event loop and hears every collection.

    Subclasses define :meth:`_watch` (the task) and :meth:`on_gc` (registered in
    ``gc.callbacks`` while the watch runs).
    """

    _task: asyncio.Task[None] | None = None

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _watch(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Start watching (the loop must be running)."""
        gc.callbacks.append(self.on_gc)
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        """Stop watching."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self.on_gc)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class StallWatchdog(LoopWatch):
    """Airflow's ``block_watchdog`` loop, recording how late each wake-up was.

    Airflow's sleeps 0.1 s and logs a round that overran; this one records every overrun and,
    through ``gc.callbacks``, how much of it the garbage collector took, so a stall can be told
    apart from a collection pass over the whole heap.

    :param interval: the sleep of each round (Airflow's is 0.1 s; 0.01 s resolves shorter stalls).
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.overruns: list[float] = []
        self.non_gc_overruns: list[float] = []
        self.gc_pauses: list[tuple[int, float]] = []
        self._gc_spans: list[tuple[float, float]] = []
        self._gc_started: float | None = None

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        elif self._gc_started is not None:
            self._gc_spans.append((self._gc_started, now))
            self.gc_pauses.append((info["generation"], now - self._gc_started))
            self._gc_started = None

    async def _watch(self) -> None:
        while True:
            last = time.perf_counter()
            await asyncio.sleep(self.interval)
            now = time.perf_counter()
            overrun = max(0.0, now - last - self.interval)
            in_gc = sum(min(end, now) - max(begin, last) for begin, end in self._gc_spans if end > last)
            self._gc_spans = [span for span in self._gc_spans if span[1] > now]
            self.overruns.append(overrun)
            self.non_gc_overruns.append(max(0.0, overrun - in_gc))

    def reset(self) -> None:
        """Forget what was recorded so far."""
        self.overruns, self.non_gc_overruns, self.gc_pauses = [], [], []

    @property
    def longest(self) -> float:
        """The longest stall seen, in seconds."""
        return max(self.overruns, default=0.0)

    @property
    def longest_without_gc(self) -> float:
        """The longest stall once the garbage collector's share of it is taken out, in seconds."""
        return max(self.non_gc_overruns, default=0.0)

    @property
    def longest_gc(self) -> tuple[int, float]:
        """The longest collection pass seen: ``(generation, seconds)``."""
        return max(self.gc_pauses, key=lambda p: p[1], default=(0, 0.0))

    def report(self) -> dict[str, Any]:
        """The longest stall, with and without collections, and the longest collection (ms)."""
        generation, pause = self.longest_gc
        return {
            "longest_ms": self.longest * 1000,
            "longest_without_gc_ms": self.longest_without_gc * 1000,
            "longest_gc_ms": pause * 1000,
            "longest_gc_generation": generation,
            "gc_passes": len(self.gc_pauses),
        }
