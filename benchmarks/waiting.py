"""Scenario 6 — waiting triggers at scale: memory, collector, stalls and idle CPU of N dormant triggers.

The lighter harness of scenario 2 (:mod:`benchmarks.density` with ``--waiting-only``): each run
starts N decision triggers in a fresh process, lets each get its first decision and give its
stream back, then measures the waiting phase (RSS, objects tracked by the collector, the CPU
time of a full collection, idle CPU, the longest event-loop stall) and cancels them; there is no
change phase, so N = 5,000 fits in a few minutes. The longest stall is reported per phase
(:mod:`benchmarks.stalls`): while the N triggers wait (a quiet window at a 10 ms step in which
the collector makes one full pass, as it does whenever its threshold trips) and, apart, while
they start (handed over, each to its first decision and back to waiting without a stream). Each N runs with the collector as Airflow leaves
it and with the production setting of ``docs/production.md`` (``gc.freeze()`` once start-up
is over, :func:`benchmarks.density.freeze_after_start_up`); every figure is the median of the
repeats.

Each run is for one source (:data:`SOURCES`): the smallest correct push source, a tailed file on
notifications (what the documentation leads with), and — at N = 1,000 only, as it measures a
fixture rather than scale — the push source written with an ``asyncio.Queue``, so the page shows
what the source's own objects cost a waiting trigger.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import Options
from benchmarks.density import child

__all__ = ["run", "summarise"]

SIZES = (1000, 5000)
QUICK_SIZES = (100,)
#: The sources measured, in the order they are shown, and the sizes of those not measured at every N.
SOURCES = ("push", "file", "push-queue")
SOURCE_SIZES = {"push-queue": (1000,)}
#: What the groups of results from before the sources were reported apart measured: the push
#: source of the benchmarks was then the queue-backed one.
UNNAMED_SOURCE = "push-queue"
#: Repeats per (N, collector setting); the largest N once (a run takes minutes on two cores).
REPEATS = {100: 1, 1000: 3, 5000: 1}
#: The figures a group's median is taken of.
FIGURES = (
    "rss_per_trigger_kb",
    "gc_tracked_per_trigger",
    "full_gc_ms_baseline",
    "full_gc_ms_waiting",
    "full_gc_ms_added_per_1000",
    "longest_stall_ms",
    "longest_stall_without_gc_ms",
    "waiting_stall_ms",
    "waiting_stall_without_gc_ms",
    "startup_stall_ms",
    "startup_stall_without_gc_ms",
    "idle_cpu_pct",
    "idle_cpu_baseline_pct",
    "startup_s",
)
TARGETS = {
    "rss_per_trigger_kb": 20.0,
    "gc_tracked_per_trigger": 60.0,
    "full_gc_ms_added_per_1000": 20.0,
    "longest_stall_ms": 50.0,
    "idle_cpu_pct": 2.0,
    "append_body_key_us_4mb": 300.0,
    "append_ratio_4mb_to_1kb": 2.0,
}


def source_of(entry: dict[str, Any]) -> str:
    """The source a run or group measured (:data:`UNNAMED_SOURCE` for results that do not say)."""
    return str(entry.get("source", UNNAMED_SOURCE))


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Group child results by source, N and collector setting; the median of each figure per group.

    :param runs: results of ``python -m benchmarks.density --waiting-only`` (with or without
        ``--gc-freeze``, for any ``--source``).
    """
    groups: dict[tuple[int, str, int, bool], list[dict[str, Any]]] = {}
    order = {source: index for index, source in enumerate(SOURCES)}
    for result in runs:
        source = source_of(result)
        key = (order.get(source, len(order)), source, result["n"], bool(result.get("gc_freeze")))
        groups.setdefault(key, []).append(result)
    summary = []
    for (_, source, n, frozen), members in sorted(groups.items()):
        medians = {name: statistics.median(r[name] for r in members) for name in FIGURES}
        summary.append({"source": source, "n": n, "gc_freeze": frozen, "repeats": len(members), **medians})
    return {"groups": summary, "runs": runs, "targets": TARGETS}


def group(result: dict[str, Any], n: int, gc_freeze: bool, source: str = "push") -> dict[str, Any] | None:
    """The summary of one (source, N, collector setting) group, if it was measured."""
    return next(
        (
            g
            for g in result.get("groups", [])
            if g["n"] == n and g["gc_freeze"] == gc_freeze and source_of(g) == source
        ),
        None,
    )


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 6: every source and N with and without ``gc.freeze()``, each run in a fresh process."""
    runs = []
    for source in SOURCES:
        for n in QUICK_SIZES if options.quick else SOURCE_SIZES.get(source, SIZES):
            for frozen in (False, True):
                flags = ["--gc-freeze"] if frozen else []
                for _ in range(REPEATS.get(n, 1)):
                    runs.append(
                        await child(
                            "--n",
                            str(n),
                            "--waiting-only",
                            "--source",
                            source,
                            "--seed",
                            str(options.seed),
                            *flags,
                        )
                    )
    return summarise(runs)
