"""The event-loop stalls of the waiting scenarios, phase by phase.

A run of :mod:`benchmarks.density` watches the loop with :class:`~benchmarks.runner.StallWatchdog`
in each phase apart: ``start`` (N triggers handed over, each to its first decision and back to
waiting without a stream), ``idle`` (the idle-CPU window, at Airflow's own 0.1 s step),
``waiting`` (:func:`waiting_stalls`: the waiting phase at a 10 ms step, with one full
collection), ``changes`` or ``cancel``. The start-up and waiting figures are reported apart: a
triggerer hands over many triggers at once only when it starts or takes over another's, while
it spends its life with them waiting.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
import threading
import time
import traceback
from typing import Any

from benchmarks.runner import LoopWatch, StallWatchdog

__all__ = ["LoopSampler", "phase_stalls", "waiting_stalls"]


async def waiting_stalls(seconds: float) -> StallWatchdog:
    """The waiting phase's loop, watched at a 10 ms step over a quiet window of ``seconds``.

    Halfway through, the loop runs one full collection (``gc.collect()`` in a callback), as the
    collector does whenever its generation-2 threshold trips: in a triggerer that happens as
    triggers come and go, while here nothing allocates once the triggers wait, so a quiet window
    alone would never show the pause a collection over the waiting triggers' objects costs. The
    watch's figure without the collector's share is the quiet window's own longest stall.
    """
    watch = StallWatchdog(0.01)
    watch.start()
    asyncio.get_running_loop().call_later(seconds / 2, gc.collect)
    await asyncio.sleep(seconds)
    await watch.stop()
    return watch


def phase_stalls(watches: dict[str, StallWatchdog]) -> dict[str, Any]:
    """Each watched phase's stalls, the start-up and waiting phases' figures, and the longest of all."""
    reports = {phase: watch.report() for phase, watch in watches.items()}
    return {
        "stalls": reports,
        "startup_stall_ms": reports["start"]["longest_ms"],
        "startup_stall_without_gc_ms": reports["start"]["longest_without_gc_ms"],
        "waiting_stall_ms": reports["waiting"]["longest_ms"],
        "waiting_stall_without_gc_ms": reports["waiting"]["longest_without_gc_ms"],
        "longest_stall_ms": max(r["longest_ms"] for r in reports.values()),
        "longest_stall_without_gc_ms": max(r["longest_without_gc_ms"] for r in reports.values()),
    }


class LoopSampler(LoopWatch):
    """What ran during each long loop iteration: a thread samples the loop thread's stack.

    A task in the loop stamps the clock every ``step``; a thread checks the stamp every ``step``
    and, while it is older than ``threshold``, records the loop thread's innermost frames
    (``sys._current_frames()``). ``gc.callbacks`` record every collection with its generation,
    wall and CPU time and the objects it freed. A collection holds the interpreter lock, so the
    thread cannot sample during one; a stall the collector took shows as a collection inside it.
    Each record carries the phase set in :attr:`phase` when it began.

    :param threshold: a loop iteration longer than this is recorded (seconds).
    :param step: the stamp and sampling step (seconds).
    """

    def __init__(self, threshold: float = 0.05, step: float = 0.005) -> None:
        self.threshold = threshold
        self.step = step
        self.phase = "setup"
        self.stalls: list[dict[str, Any]] = []
        self.collections: list[dict[str, Any]] = []
        self._stamp = time.perf_counter()
        self._gc_started = (0.0, 0.0)
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sampling the running loop's thread."""
        self._loop_thread = threading.get_ident()
        super().start()
        self._thread = threading.Thread(target=self._sample, name="loop-sampler", daemon=True)
        self._thread.start()

    async def _watch(self) -> None:
        while True:
            self._stamp = time.perf_counter()
            await asyncio.sleep(self.step)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = (time.perf_counter(), time.thread_time())
            return
        started, cpu = self._gc_started
        self.collections.append(
            {
                "phase": self.phase,
                "generation": info["generation"],
                "at": started,
                "wall_ms": (time.perf_counter() - started) * 1000,
                "cpu_ms": (time.thread_time() - cpu) * 1000,
                "collected": info["collected"],
            }
        )

    def _sample(self) -> None:
        current: dict[str, Any] | None = None
        while not self._stop.wait(self.step):
            stamp = self._stamp
            late = time.perf_counter() - stamp
            if late < self.threshold:
                continue
            if current is None or current["at"] != stamp:
                current = {"phase": self.phase, "at": stamp, "samples": collections.Counter()}
                self.stalls.append(current)
            current["late_ms"] = late * 1000
            frame = sys._current_frames().get(self._loop_thread)
            if frame is not None:
                frames = traceback.extract_stack(frame)[-6:]
                current["samples"][
                    "  <  ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in frames[::-1])
                ] += 1

    async def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        await super().stop()

    def report(self, top: int = 8) -> list[dict[str, Any]]:
        """The ``top`` longest stalls: phase, length, the collections inside, the commonest stacks."""
        out = []
        for stall in sorted(self.stalls, key=lambda s: -s["late_ms"])[:top]:
            end = stall["at"] + stall["late_ms"] / 1000
            inside = [c for c in self.collections if stall["at"] <= c["at"] <= end and c["wall_ms"] >= 1]
            out.append(
                {
                    "phase": stall["phase"],
                    "ms": stall["late_ms"],
                    "collections": [
                        {k: c[k] for k in ("generation", "wall_ms", "cpu_ms", "collected")} for c in inside
                    ],
                    "stacks": dict(stall["samples"].most_common(3)),
                }
            )
        return out

    def full_collections(self) -> dict[str, list[dict[str, Any]]]:
        """Every generation-2 collection, by phase (the harness's own ``gc.collect()`` calls included)."""
        by_phase: dict[str, list[dict[str, Any]]] = {}
        for c in self.collections:
            if c["generation"] == 2:
                by_phase.setdefault(c["phase"], []).append(
                    {k: round(c[k], 1) for k in ("wall_ms", "cpu_ms")} | {"collected": c["collected"]}
                )
        return by_phase


def _short(filename: str) -> str:
    """A frame's file name from the package on (``site-packages/`` and the checkout cut off)."""
    for marker in ("site-packages/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename.rsplit("/", 2)[-2] + "/" + filename.rsplit("/", 1)[-1] if "/" in filename else filename
