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
import gc
from typing import Any

from benchmarks.runner import StallWatchdog

__all__ = ["phase_stalls", "waiting_stalls"]


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
