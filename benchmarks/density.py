"""Scenario 2 — triggerer density: N decision triggers in one event loop.

Each N runs in a fresh process (``python -m benchmarks.density --n N``), the emulator in another,
so memory and CPU are this process's alone. In that process:

1. **warm-up** — a few triggers run to completion, so every lazy import and cache is in place;
   then the *baseline*: RSS and idle CPU of the process with no trigger;
2. **start** — N ``SystemZeroDecisionTrigger``, each rebuilt from ``serialize()`` and run by
   Airflow's ``TriggerRunner.run_trigger``, each with its own push source; every trigger opens a
   stream (at most ``max_streams_per_process`` at once), gets its first decision
   (``ready = false``) and gives the stream back after ``lease_after`` (0.02 s here);
3. **waiting** — RSS above the baseline per trigger, and CPU over a quiet window (no source
   changes) with Airflow's 0.1 s block watchdog running, as in a triggerer;
4. **changes** — every source changes twice at uniformly random moments in a window: a
   progress line, then (the second change) the ``READY`` line; change → event latency is
   measured for the decisive change. Before this phase the emulator process freezes what it
   holds (its full collections would otherwise set the worst figure: see
   :mod:`benchmarks.emulator_host`), and its collector's pauses in the window are reported.

In each phase a 10 ms watchdog (Airflow's ``block_watchdog`` at a finer step) records the longest
event-loop stall (:mod:`benchmarks.stalls`: the waiting phase's window includes one full
collection; ``--trace-stalls`` also samples what the loop ran in each iteration over 50 ms), and
a sampler counts the process's open sockets. The emulator reports the most
streams it ever had open. With ``--own-core`` (scenario 1's crowds) the emulator runs on a CPU
of its own and this process on the others (:mod:`benchmarks.emulator_host`). The account's
``max_concurrent`` is raised so that the per-process cap (``max_streams_per_process`` = 4) is the
binding limit, and its decision buckets are raised so that billing pacing does not queue the
decisions.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import math
import os
import random
import sys
import threading
import time
import uuid
from typing import Any

from benchmarks.allocations import charge
from benchmarks.common import Options, summary_ms
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.fixtures import FEEDS, READY, Feed, decision_trigger
from benchmarks.runner import (
    EndedTasks,
    SocketSampler,
    StallWatchdog,
    Triggerer,
    count_sockets,
    decided_at,
    dormant,
    rebuild,
    rss_kb,
)
from benchmarks.stalls import LoopSampler, phase_stalls, waiting_stalls

__all__ = ["run"]

LIMITS = {"account_decision_burst": 100_000, "account_decision_ceiling_per_minute": 10_000_000}
#: An account capacity far above the per-process cap: ``max(1, floor(2000 / 2))`` = 1000 streams.
MAX_CONCURRENT = 2000
LEASE_AFTER = 0.02
SIZES = (100, 500, 1000)
QUICK_SIZES = (100, 300)
#: Seconds over which every source changes twice (the same for every N: the load grows with N).
CHANGE_WINDOW = 30.0
#: The trigger's default ``lease_after``.
DEFAULT_LEASE_AFTER = 5.0


_PUSH = Feed("push")


def _new_trigger(
    tag: str, index: int, lease_after: float = LEASE_AFTER, feed: Feed = _PUSH
) -> tuple[str, Any]:
    from airflow_provider_systemzero.identity import task_namespace

    channel = f"density-{tag}-{index}"
    namespace = task_namespace("bench_density", "wait", tag, index)
    return channel, rebuild(decision_trigger(namespace, feed.start(channel), lease_after=lease_after))


def watching() -> dict[str, Any]:
    """What watches files in this process: inotify descriptors, threads, the shared watcher's counts."""
    inotify = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            inotify += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    try:
        from airflow_provider_systemzero.sources.file_watch import current_watcher
    except ImportError:  # a provider without file notifications
        watcher = None
    else:
        watcher = current_watcher()
    return {
        "inotify_descriptors": inotify,
        "threads": threading.active_count(),
        "watched_directories": watcher.stats()["directories"] if watcher is not None else 0,
    }


def _settled(trigger: Any) -> bool:
    # the trigger's public progress: the first decision arrived and it gave its stream back
    return dormant(trigger)


def _decided(trigger: Any) -> bool:
    # the trigger's public progress: its first decision arrived (it may still hold the stream)
    return math.isfinite(decided_at(trigger))


async def wait_all(
    triggerer: Triggerer, ids: list[int], triggers: list[Any], within: float, settled: Any = _settled
) -> float:
    """Wait until every trigger has ``settled``, polling every 50 ms without scanning all N each time.

    Triggers settle roughly in the order they started, so a cursor moves past the settled ones
    (each poll costs what settled since the last, not N); a trigger that ends early is noticed
    through its task's done callback. A scan over every trigger at every poll was an O(N) step
    of the harness inside the loop the stall watch measures.
    """
    started = time.perf_counter()
    ended: list[int] = []
    for trigger_id in ids:
        triggerer.task(trigger_id).add_done_callback(lambda _task, i=trigger_id: ended.append(i))
    cursor = 0
    while True:
        while cursor < len(triggers) and settled(triggers[cursor]):
            cursor += 1
        if cursor == len(triggers):
            break
        if ended:
            raise RuntimeError(f"trigger {ended[0]} ended while waiting: {triggerer.payload(ended[0])}")
        if time.perf_counter() - started > within:
            stuck = [t for t in triggers if not settled(t)]
            raise TimeoutError(
                f"{len(triggers) - len(stuck)} of {len(triggers)} triggers settled; first stuck: "
                f"{_describe(stuck[0])}"
            )
        await asyncio.sleep(0.05)
    return time.perf_counter() - started


def _describe(trigger: Any) -> str:
    """What a stuck trigger's public progress says."""
    return repr(trigger.progress)


async def _idle_cpu(seconds: float) -> tuple[float, StallWatchdog]:
    """CPU share of one core over a quiet window, with Airflow's 0.1 s watchdog running."""
    watchdog = StallWatchdog(0.1)
    watchdog.start()
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await watchdog.stop()
    return cpu / wall, watchdog


def _full_collection_ms(repeats: int = 3) -> float:
    """CPU time of a full (generation 2) collection of this process's heap now, median of ``repeats``
    (CPU, not wall time: on a loaded machine the wall time of one collection varies several-fold)."""
    samples = []
    for _ in range(repeats):
        started = time.thread_time()
        gc.collect()
        samples.append((time.thread_time() - started) * 1000)
    return sorted(samples)[len(samples) // 2]


def _tracked() -> int:
    """Objects the collector tracks outside the permanent generation (what a full collection visits)."""
    return len(gc.get_objects())


def _census() -> collections.Counter[str]:
    """The objects the collector tracks, counted by type (``module.qualname``)."""
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _task_census() -> collections.Counter[str]:
    """The loop's tasks, counted by the qualified name of the coroutine each runs."""
    return collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in asyncio.all_tasks())


def _census_per_trigger(
    before: collections.Counter[str], after: collections.Counter[str], n: int, top: int = 20
) -> dict[str, float]:
    """The types that grew most between two censuses, per trigger."""
    grown = after - before
    return {name: count / n for name, count in grown.most_common(top)}


def freeze_after_start_up() -> None:
    """The production setting measured here (docs/production.md): once everything is imported,
    collect, then move every surviving object to the permanent generation (``gc.freeze()``)."""
    gc.collect()
    gc.freeze()


async def _start_all(
    triggerer: Triggerer, tag: str, n: int, lease_after: float, feed: Feed = _PUSH
) -> tuple[list[str], list[Any], list[int]]:
    """Hand N triggers over the way ``create_triggers()`` does: rebuilt, one loop iteration apart."""
    channels: list[str] = []
    triggers: list[Any] = []
    ids: list[int] = []
    for index in range(n):
        channel, trigger = _new_trigger(tag, index, lease_after, feed)
        await asyncio.sleep(0)
        ids.append(triggerer.start(trigger))
        channels.append(channel)
        triggers.append(trigger)
    return channels, triggers, ids


async def _warm_up(triggerer: Triggerer, feed: Feed = _PUSH) -> None:
    pairs = [_new_trigger("warmup", i, feed=feed) for i in range(4)]
    ids = [triggerer.start(t) for _, t in pairs]
    await wait_all(triggerer, ids, [t for _, t in pairs], 60)
    for channel, _ in pairs:
        feed.publish(channel, f"waiting\n{READY}\n")
    await asyncio.gather(*(triggerer.task(i) for i in ids))


async def measure(
    n: int,
    options: Options,
    feed_kind: str = "push",
    *,
    gc_freeze: bool = False,
    waiting_only: bool = False,
    sampler: LoopSampler | None = None,
    own_core: bool = False,
) -> dict[str, Any]:
    """Run the scenario for ``n`` triggers in this process.

    :param feed_kind: the triggers' sources (:data:`~benchmarks.fixtures.FEEDS`).
    :param gc_freeze: call :func:`freeze_after_start_up` after the warm-up (no trigger yet).
    :param waiting_only: stop after the waiting phase (the lighter harness for large N: no
        change phase, so no latency figures; the triggers are cancelled at the end).
    :param sampler: if given, sample what the loop runs during each long iteration, phase by
        phase, and add its report to the result as ``stall_trace``.
    :param own_core: give the emulator a CPU of its own, this process the others
        (:class:`~benchmarks.emulator_host.EmulatorProcess`); the result's ``cores`` says which.
    """
    feed = Feed(feed_kind)
    if sampler is not None:
        sampler.start()
    try:
        result = await _measure(n, options, feed, gc_freeze, waiting_only, sampler or LoopSampler(), own_core)
    finally:
        feed.close()
        if sampler is not None:
            await sampler.stop()
    if sampler is not None:
        result["stall_trace"] = {"longest": sampler.report(), "full_collections": sampler.full_collections()}
    return result


async def _measure(
    n: int,
    options: Options,
    feed: Feed,
    gc_freeze: bool,
    waiting_only: bool,
    sampler: LoopSampler,
    own_core: bool = False,
) -> dict[str, Any]:
    rng = random.Random(options.seed + n)
    idle_window = 1.0 if options.quick else 5.0
    change_window = 5.0 if options.quick else CHANGE_WINDOW
    async with EmulatorProcess(limits=LIMITS, max_concurrent=MAX_CONCURRENT, own_core=own_core) as emulator:
        os.environ.update(emulator.connection_env())
        triggerer = Triggerer()
        await _warm_up(triggerer, feed)
        if gc_freeze:
            freeze_after_start_up()
        gc.collect()
        await asyncio.sleep(0.5)
        base_sockets = count_sockets()
        base_rss = rss_kb()
        base_tracked = _tracked()
        base_census, base_tasks = _census(), _task_census()
        base_gc_ms = _full_collection_ms()
        base_idle_cpu, _ = await _idle_cpu(idle_window)

        # start: N triggers, each to its first decision and back to waiting without a stream
        sampler.phase = "start"
        start_watch = StallWatchdog(0.01)
        start_watch.start()
        sockets = SocketSampler(base_sockets)
        sockets.start()
        started = time.perf_counter()
        channels, triggers, ids = await _start_all(triggerer, uuid.uuid4().hex[:8], n, LEASE_AFTER, feed)
        await wait_all(triggerer, ids, triggers, 600)
        startup_s = time.perf_counter() - started
        await start_watch.stop()
        await sockets.stop()
        sampler.phase = "measuring (the harness's own collections and censuses)"

        # waiting: memory, and CPU over a quiet window with only a triggerer's own 0.1 s watchdog
        gc.collect()
        await asyncio.sleep(0.5)
        rss_waiting = rss_kb()
        waiting_tracked = _tracked()
        tracked_types = _census_per_trigger(base_census, _census(), n)
        tasks = _census_per_trigger(base_tasks, _task_census(), n)
        waiting_gc_ms = _full_collection_ms()
        sampler.phase = "idle"
        idle_cpu, idle_watch = await _idle_cpu(idle_window)
        sampler.phase = "waiting"
        waiting_watch = await waiting_stalls(idle_window)
        sampler.phase = "after waiting"
        idle_sockets = count_sockets() - base_sockets
        watchers = watching()
        waiting = {
            "n": n,
            "source": feed.kind,
            "gc_freeze": gc_freeze,
            "cores": emulator.cores,
            "watching": watchers,
            "lease_after_s": LEASE_AFTER,
            "startup_s": startup_s,
            "first_decisions_per_s": n / startup_s,
            "rss_baseline_kb": base_rss,
            "rss_waiting_kb": rss_waiting,
            "rss_per_trigger_kb": (rss_waiting - base_rss) / n,
            "gc_tracked_baseline": base_tracked,
            "gc_tracked_waiting": waiting_tracked,
            "gc_tracked_per_trigger": (waiting_tracked - base_tracked) / n,
            "gc_tracked_types_per_trigger": tracked_types,
            "tasks_per_trigger": tasks,
            "idle_window_s": idle_window,
            "idle_cpu_baseline_pct": base_idle_cpu * 100,
            "idle_cpu_pct": idle_cpu * 100,
            "idle_cpu_per_1000_pct": max(0.0, idle_cpu - base_idle_cpu) * 100 * 1000 / n,
            "sockets_while_idle": idle_sockets,
            "full_gc_ms_baseline": base_gc_ms,
            "full_gc_ms_waiting": waiting_gc_ms,
            "full_gc_ms_added_per_1000": (waiting_gc_ms - base_gc_ms) * 1000 / n,
        }
        if waiting_only:
            sampler.phase = "cancel"
            cancel_watch = StallWatchdog(0.01)
            cancel_watch.start()
            await triggerer.finish()
            await asyncio.sleep(0.05)  # the watch records an iteration when it wakes, not when stopped
            await cancel_watch.stop()
            watches = {
                "start": start_watch,
                "idle": idle_watch,
                "waiting": waiting_watch,
                "cancel": cancel_watch,
            }
            return {**waiting, "waiting_only": True, **phase_stalls(watches)}

        # changes: two per source at random moments; the second is the decisive one
        plan: list[tuple[float, int, bool]] = []
        for index in range(n):
            first, second = sorted(rng.uniform(0, change_window) for _ in range(2))
            plan += [(first, index, False), (second, index, True)]
        plan.sort()
        produced: dict[int, float] = {}
        ended = EndedTasks(triggerer, ids)
        # the emulator stands in for a remote gateway: what it holds for the N streams is not
        # scanned again by its collector inside the window (see benchmarks.emulator_host)
        await emulator.call("freeze")
        change_watch = StallWatchdog(0.01)
        change_watch.start()
        sockets.start()
        sampler.phase = "changes"
        emulator_cpu = (await emulator.stats())["cpu_seconds"]
        cpu = time.process_time()
        phase_start = time.perf_counter()
        for at, index, decisive in plan:
            delay = phase_start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            text = f"waiting\nprogress\n{READY}\n" if decisive else "waiting\nprogress\n"
            stamp = feed.publish(channels[index], text)
            if decisive:
                produced[index] = stamp
        await ended.all(within=300)
        change_phase_s = time.perf_counter() - phase_start
        emulator_pauses = await emulator.call("collections", since=phase_start)
        change_cpu = (time.process_time() - cpu) / change_phase_s
        emulator_cpu = ((await emulator.stats())["cpu_seconds"] - emulator_cpu) / change_phase_s
        await change_watch.stop()
        await sockets.stop()

        latencies, failures = [], 0
        for index, trigger_id in enumerate(ids):
            fired = triggerer.fired_at(trigger_id)
            payload = triggerer.payload(trigger_id) or {}
            if fired is None or payload.get("status") != "success":
                failures += 1
                continue
            latencies.append(fired - produced[index])
        await triggerer.finish()
        stats = await emulator.stats()

    from airflow_provider_systemzero.stream.capacity import default_capacity

    watches = {"start": start_watch, "idle": idle_watch, "waiting": waiting_watch, "changes": change_watch}
    return {
        **waiting,
        "change_window_s": change_window,
        "changes_per_s": 2 * n / change_window,
        "change_phase_s": change_phase_s,
        "change_phase_cpu_pct": change_cpu * 100,
        "change_phase_emulator_cpu_pct": emulator_cpu * 100,
        "latency": summary_ms(latencies),
        "emulator_collections": {
            "longest_ms": max((ms for _, ms, _ in emulator_pauses), default=0.0),
            "over_1ms": len(emulator_pauses),
            "full": sum(1 for *_, generation in emulator_pauses if generation == 2),
        },
        "failures": failures,
        "max_sockets_open": sockets.max_open,
        "max_capacity_in_use": max(sockets.max_capacity_in_use, default_capacity().max_in_use),
        "max_streams_per_process": default_capacity().limit,
        "emulator_max_streams_open": stats["max_streams_open"],
        "upgrade_refusals": stats["upgrade_refusals"],
        "decisions_billed": stats["decisions_billed"],
        "streams_opened": stats["streams_total"],
        **phase_stalls(watches),
    }


async def breakdown(n: int) -> dict[str, Any]:
    """Python memory per waiting trigger by owner (``tracemalloc``; slower, so a run of its own).

    Two batches of N/2 triggers are started and settled under tracing; the difference between
    the two snapshots, divided by N/2, is what one more waiting trigger holds (one-time costs
    cancel out). Each allocation is charged to the innermost frame of its call stack that
    belongs to the provider, the benchmark's source, or Airflow's trigger runner.
    """
    import tracemalloc

    half = max(1, n // 2)
    async with EmulatorProcess(limits=LIMITS, max_concurrent=MAX_CONCURRENT) as emulator:
        os.environ.update(emulator.connection_env())
        triggerer = Triggerer()
        await _warm_up(triggerer)
        tracemalloc.start(25)
        snapshots = []
        objects = []
        for batch in ("a", "b"):
            _, triggers, ids = await _start_all(
                triggerer, f"{uuid.uuid4().hex[:8]}{batch}", half, LEASE_AFTER
            )
            await wait_all(triggerer, ids, triggers, 600)
            gc.collect()
            objects.append(len(gc.get_objects()))
            snapshots.append(charge(tracemalloc.take_snapshot()))
        tracemalloc.stop()
        await triggerer.finish()
    (owners_a, sites_a), (owners_b, sites_b) = snapshots
    per_trigger = {
        owner: (owners_b.get(owner, 0) - owners_a.get(owner, 0)) / half / 1024
        for owner in sorted(owners_b, key=lambda o: -owners_b[o])
    }
    site_growth = {site: (size - sites_a.get(site, 0)) / half for site, size in sites_b.items()}
    top_sites = [
        {"site": site, "bytes_per_trigger": size}
        for site, size in sorted(site_growth.items(), key=lambda kv: -kv[1])[:10]
    ]
    return {
        "n": 2 * half,
        "kb_per_trigger": per_trigger,
        "total_kb_per_trigger": sum(per_trigger.values()),
        "gc_objects_per_trigger": (objects[1] - objects[0]) / half,
        "top_provider_sites": top_sites,
    }


async def lease_probe(n: int, lease_after: float) -> dict[str, Any]:
    """How fast N triggers get their first decision through the stream cap, for a ``lease_after``."""
    async with EmulatorProcess(limits=LIMITS, max_concurrent=MAX_CONCURRENT) as emulator:
        os.environ.update(emulator.connection_env())
        triggerer = Triggerer()
        await _warm_up(triggerer)
        started = time.perf_counter()
        _, triggers, ids = await _start_all(triggerer, uuid.uuid4().hex[:8], n, lease_after)
        await wait_all(triggerer, ids, triggers, 600, settled=_decided)
        elapsed = time.perf_counter() - started
        await triggerer.finish()
    return {"n": n, "lease_after_s": lease_after, "seconds": elapsed, "first_decisions_per_s": n / elapsed}


async def child(*args: str) -> dict[str, Any]:
    """Run ``python -m benchmarks.density`` with ``args`` in a fresh process; its JSON result."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.density", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"density child {' '.join(args)} failed with exit status {proc.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 2: each N, the memory breakdown and the lease probe, each in a fresh process."""
    quick = ["--quick"] if options.quick else []
    runs = [
        await child("--n", str(n), "--seed", str(options.seed), *quick)
        for n in (QUICK_SIZES if options.quick else SIZES)
    ]
    memory = await child("--breakdown", "--n", str(40 if options.quick else 100))
    # the default lease_after holds a slot 5 s after each decision: three rounds of four (the smoke run skips it)
    default_lease = (
        None
        if options.quick
        else await child("--lease-probe", "--n", "12", "--lease-after", str(DEFAULT_LEASE_AFTER))
    )
    targets = {"rss_per_trigger_kb": 20.0, "idle_cpu_per_1000_pct": 2.0, "longest_stall_ms": 50.0}
    return {
        "runs": runs,
        "memory_breakdown": memory,
        "default_lease_probe": default_lease,
        "targets": targets,
    }


def main() -> None:
    """Child entry point: measure one N and print the result as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.density")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="the tracemalloc memory breakdown")
    parser.add_argument(
        "--lease-probe", action="store_true", help="first-decision throughput for --lease-after"
    )
    parser.add_argument("--lease-after", type=float, default=LEASE_AFTER)
    parser.add_argument("--source", choices=FEEDS, default="push", help="the triggers' sources")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after the warm-up, as in production"
    )
    parser.add_argument("--waiting-only", action="store_true", help="stop after the waiting phase (large N)")
    parser.add_argument(
        "--own-core", action="store_true", help="the emulator on a CPU of its own, this process on the others"
    )
    parser.add_argument(
        "--trace-stalls",
        action="store_true",
        help="sample the loop's stack in each iteration over 50 ms (adds stall_trace to the result)",
    )
    args = parser.parse_args()
    if args.breakdown:
        result = asyncio.run(breakdown(args.n))
    elif args.lease_probe:
        result = asyncio.run(lease_probe(args.n, args.lease_after))
    else:
        result = asyncio.run(
            measure(
                args.n,
                Options(quick=args.quick, seed=args.seed),
                args.source,
                gc_freeze=args.gc_freeze,
                waiting_only=args.waiting_only,
                sampler=LoopSampler() if args.trace_stalls else None,
                own_core=args.own_core,
            )
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
