"""Scenario — a fleet of sensors on one account at its decision ceiling.

N decision triggers (``SystemZeroDecisionTrigger``, ``decision_mode="on_request"``, each rebuilt
from ``serialize()`` and run by Airflow's ``TriggerRunner.run_trigger``) run in two triggerer
processes — separate OS processes, as Airflow runs them — on one API key, against the emulator in
a third process at the public account limits: ``account_decision_burst`` 5 and
``account_decision_ceiling`` 60 per minute. Each trigger watches its own push source, which
gains an irrelevant line at random (a Poisson stream of about one a minute) and its decisive
``READY`` line at a uniformly random moment of the window; the window is long enough that the
decisive lines arrive below the ceiling on average (40 a minute for 1,000 sensors).

Time runs :data:`FACTOR` times faster, and every limit that binds is scaled by it: the account's
ceiling (60 × FACTOR a minute), the per-connection event and message rates, the sources' line
rates and the triggers' ``lease_after`` and ``max_staleness``. The burst (a count) is not scaled, nor are the liveness
timers (they do not bind here). Every figure is reported in real-limit units: measured durations
are multiplied by FACTOR.

Figures: decisive line → ``TriggerEvent`` p50/p99; decisions billed in the window ÷ decisive
lines; decisions started on a superseded state (the source had published a newer line at least
:data:`GRACE_S` of wall time before the decision started); the 429s the processes heard and the
gateway refused; the longest any trigger waited for a decision start (a line that wants one —
every line without a filter, the lines ``decide_when`` matches with it — published → the first
decision start covering it); and the fair-share bound, which each such wait must stay under
twice. A trigger's fair share of the ceiling is what it would get if its process's share (1/2 of
the account's: the processes know nothing of each other but the 429s) were dealt evenly, at every
moment, over the triggers of the process that *compete* for a start then — those with a line no
start has covered yet (a trigger with nothing new to decide asks for nothing): its fair wait is
the time its share takes to add up to one start (:func:`fair_waits`), and the figure is the
largest wait ÷ fair wait. The same ratio against the whole fleet (the account's starts dealt over
the competing triggers of both processes) is reported beside it, and so is the earlier, looser
reading (the fair share at the moment of the line over every trigger of the process not yet
fired, whether it had anything to decide or not).

The decisions' starts are seen by the emulator's decider (:func:`decide`), which records the
source line each started on; the sources' publish times are recorded by the triggerer processes.

``python -m benchmarks.fleet [--quick] [--decide-when REGEX]`` runs it alone and prints the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import random
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks.common import Options, json_line, play, spawn_child, summary_ms
from benchmarks.fixtures import READY, decision_trigger, publish, source_spec

__all__ = ["decide", "run"]

#: Sensors and triggerer processes.
N, QUICK_N, PROCESSES = 1000, 200, 2
#: Real seconds per benchmark second.
FACTOR = 20.0
#: The public account limits.
BURST, CEILING_PER_MINUTE = 5, 60
#: Irrelevant lines per source and real second (about one a minute).
IRRELEVANT_PER_S = 1 / 60
#: Decisive lines per real minute over the fleet (below the ceiling on average).
DECISIVE_PER_MINUTE = 40
#: The trigger's default ``lease_after`` (real seconds).
LEASE_AFTER_S = 5.0
#: Wall seconds a newer line may take to reach the stream before a decision on the older one
#: counts as a decision on a superseded state.
GRACE_S = 0.2
#: Where the decider records the starts it sees (set for the emulator process).
RECORDS_ENV = "SZ_FLEET_RECORDS"
DECIDER = "python:benchmarks.fleet:decide"


def decide(request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The fleet's decider: ``ready`` when the state's last line is the decisive one; records
    ``(channel, line number, wall time)`` of every start it sees.

    :param request: the decide body.
    :param now: the backend's clock (unused).
    """
    state = request.get("state")
    last = str(state).rstrip("\n").rsplit("\n", 1)[-1]
    channel, kind, number = [*last.split(" "), "", "", "0"][:3]
    path = os.environ.get(RECORDS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps([channel, int(number), time.time()]) + "\n")
    return {"ready": {"decision": kind == READY, "probability": 0.97, "confidence": 0.94}}


def limits(factor: float) -> dict[str, int]:
    """The public account limits with every binding rate scaled by ``factor``."""
    return {
        "account_decision_burst": BURST,
        "account_decision_ceiling_per_minute": int(CEILING_PER_MINUTE * factor),
        "max_events_per_second": int(5 * factor),
        "max_messages_per_second": int(40 * factor),
    }


def _plan(n: int, first: int, count: int, seed: int, factor: float) -> list[tuple[float, int, int, bool]]:
    """``(benchmark second, channel index, line number, decisive)`` of channels ``first …``, in time order."""
    window = n / DECISIVE_PER_MINUTE * 60 / factor
    rate = IRRELEVANT_PER_S * factor
    plan = []
    for index in range(first, first + count):
        rng = random.Random(seed * 100_003 + index)
        decisive = rng.uniform(0, window)
        at, number = rng.expovariate(rate), 1
        while at < decisive:
            plan.append((at, index, number, False))
            at, number = at + rng.expovariate(rate), number + 1
        plan.append((decisive, index, number, True))
    return sorted(plan)


# ------------------------------------------------------------------------------------ a triggerer


async def _triggerer(config: dict[str, Any]) -> dict[str, Any]:
    """One triggerer process: start its triggers, wait for their first decisions, then play the plan."""
    from airflow_provider_systemzero.decisions.source_watch import DEFAULT_MAX_STALENESS
    from airflow_provider_systemzero.identity import task_namespace
    from airflow_provider_systemzero.stream.starts import running_starts
    from benchmarks.runner import Triggerer, decided_at, rebuild

    os.environ.update(config["env"])
    factor, first, count = config["factor"], config["first"], config["count"]
    triggerer = Triggerer()
    extra = {"decide_when": config["decide_when"]} if config["decide_when"] else {}
    ids, triggers = {}, {}
    for index in range(first, first + count):
        channel = f"c{index}"
        publish(channel, f"{channel} line 0\n")
        trigger = rebuild(
            decision_trigger(
                task_namespace("bench_fleet", "wait", config["tag"], index),
                source_spec(channel),
                state=f"{channel} line 0\n",
                decision_mode="on_request",
                lease_after=LEASE_AFTER_S / factor,
                max_staleness=DEFAULT_MAX_STALENESS / factor,
                **extra,
            )
        )
        await asyncio.sleep(0)
        ids[index], triggers[index] = triggerer.start(trigger), trigger

    def decided(trigger: Any) -> bool:
        # the trigger's public progress: its first decision arrived (its stream may be gone: dormant)
        return math.isfinite(decided_at(trigger))

    started = time.perf_counter()
    while not all(decided(t) for t in triggers.values()):
        ended = [i for i, t in ids.items() if triggerer.task(t).done()]
        if ended:
            raise RuntimeError(
                f"trigger {ended[0]} ended before the window: {triggerer.payload(ids[ended[0]])}"
            )
        await asyncio.sleep(0.05)
    startup = time.perf_counter() - started
    print(json.dumps({"ready": startup}), flush=True)
    go = json.loads(await asyncio.to_thread(sys.stdin.readline))["go"]
    heard_before = sum(starts.queue.rate_limited for starts in running_starts())

    offset = time.time() - time.perf_counter()
    texts = {index: f"c{index} line 0\n" for index in ids}
    published: list[tuple[int, int, float, bool]] = []
    for at, index, number, decisive in _plan(config["n"], first, count, config["seed"], factor):
        delay = go + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        texts[index] += f"c{index} {READY if decisive else 'line'} {number}\n"
        published.append((index, number, publish(f"c{index}", texts[index]) + offset, decisive))
    await asyncio.wait([triggerer.task(i) for i in ids.values()], timeout=config["tail_s"])
    fired = {}
    for index, trigger_id in ids.items():
        at = triggerer.fired_at(trigger_id)
        payload = triggerer.payload(trigger_id) or {}
        fired[index] = (at + offset) if at is not None and payload.get("status") == "success" else None
    queues = [starts.queue for starts in running_starts()]
    await triggerer.finish()
    return {
        "startup_s": startup,
        "published": published,
        "fired": fired,
        "rate_limited_heard": sum(q.rate_limited for q in queues) - heard_before,
        "starts": sum(q.starts for q in queues),
        "longest_queue_wait_s": max((q.longest_wait for q in queues), default=0.0),
    }


# ------------------------------------------------------------------------------------ the run


async def measure(
    n: int, seed: int, *, decide_when: str | None = None, factor: float = FACTOR
) -> dict[str, Any]:
    """Run the fleet once: ``n`` triggers in :data:`PROCESSES` triggerer processes."""
    from benchmarks.emulator_host import EmulatorProcess

    handle, records = tempfile.mkstemp(prefix="sz-fleet-", suffix=".jsonl")
    os.close(handle)
    os.environ[RECORDS_ENV] = records
    ceiling_per_s = CEILING_PER_MINUTE * factor / 60
    tail_s = max(30.0, 4.0 * n / ceiling_per_s)
    try:
        async with EmulatorProcess(
            limits=limits(factor), max_concurrent=4 * PROCESSES * 2, decider=DECIDER
        ) as emulator:
            env = emulator.connection_env()
            tag = uuid.uuid4().hex[:8]
            share = n // PROCESSES
            procs = [
                await spawn_child(
                    "benchmarks.fleet",
                    {
                        "env": env,
                        "factor": factor,
                        "n": n,
                        "first": k * share,
                        "count": share if k < PROCESSES - 1 else n - k * share,
                        "seed": seed,
                        "tag": tag,
                        "tail_s": tail_s,
                        "decide_when": decide_when,
                    },
                )
                for k in range(PROCESSES)
            ]
            startups = [(await json_line(p))["ready"] for p in procs]
            played = await play(procs, emulator, records)  # the first decisions: before the window
    finally:
        os.unlink(records)
    return _figures(
        n, factor, decide_when, startups, played.before, played.after, played.results, played.records
    )


def _figures(
    n: int,
    factor: float,
    decide_when: str | None,
    startups: list[float],
    before: dict[str, Any],
    after: dict[str, Any],
    results: list[dict[str, Any]],
    starts: list[list[Any]],
) -> dict[str, Any]:
    seconds_per_start = 60 / (CEILING_PER_MINUTE * factor)
    published: dict[str, list[tuple[int, float]]] = {}
    asking: dict[str, list[tuple[int, float]]] = {}  # the lines that want a decision start
    wants = re.compile(decide_when).search if decide_when else None
    decisive: dict[str, float] = {}
    fired: dict[str, float | None] = {}
    for result in results:
        for index, number, at, is_decisive in result["published"]:
            published.setdefault(f"c{index}", []).append((number, at))
            if wants is None or wants(f"c{index} {READY if is_decisive else 'line'} {number}"):
                asking.setdefault(f"c{index}", []).append((number, at))
            if is_decisive:
                decisive[f"c{index}"] = at
        fired.update({f"c{index}": at for index, at in result["fired"].items()})
    by_channel: dict[str, list[tuple[float, int]]] = {}
    for channel, number, at in starts:
        by_channel.setdefault(channel, []).append((at, number))
    superseded = 0
    for channel, decisions in by_channel.items():
        lines = published.get(channel, [])
        for at, number in decisions:
            superseded += any(k > number and p <= at - GRACE_S for k, p in lines)
    ends = sorted(t for t in fired.values() if t is not None)
    never = sum(1 for t in fired.values() if t is None)
    share = n // PROCESSES

    def process_of(channel: str) -> int:
        return min(PROCESSES - 1, int(channel[1:]) // share)

    own_ends: dict[int, list[float]] = {}
    own_never: dict[int, int] = {}
    for channel, at in fired.items():
        if at is None:
            own_never[process_of(channel)] = own_never.get(process_of(channel), 0) + 1
        else:
            own_ends.setdefault(process_of(channel), []).append(at)
    for values in own_ends.values():
        values.sort()
    waits, ratios, own_ratios = [], [], []
    uncovered = 0
    waited: dict[str, list[tuple[float, float]]] = {}  # channel → (line published, first start covering it)
    for channel, lines in asking.items():
        decisions = sorted(by_channel.get(channel, []))
        for number, at in lines:
            start = next((t for t, k in decisions if k >= number and t >= at), None)
            if start is None:
                uncovered += 1
                continue
            waited.setdefault(channel, []).append((at, start))
            wait = start - at
            still_waiting = len(ends) - bisect.bisect_right(ends, at) + never
            waits.append(wait)
            ratios.append(wait / max(seconds_per_start, still_waiting * seconds_per_start))
            process = process_of(channel)
            mine = own_ends.get(process, [])
            own_waiting = len(mine) - bisect.bisect_right(mine, at) + own_never.get(process, 0)
            # the process's share of the ceiling is 1 / PROCESSES of it: its seconds per start
            own_ratios.append(wait / max(seconds_per_start, own_waiting * seconds_per_start * PROCESSES))
    fair = fair_waits(waited, process_of, seconds_per_start)
    latencies = [
        (fired[c] - decisive[c]) * factor
        for c in decisive
        if fired.get(c) is not None and fired[c] >= decisive[c]
    ]
    billed = after["decisions_billed"] - before["decisions_billed"]
    refused = after.get("decision_starts_refused", 0) - before.get("decision_starts_refused", 0)
    figures: dict[str, Any] = {
        "n": n,
        "processes": PROCESSES,
        "factor": factor,
        "decide_when": decide_when,
        "decision_mode": "on_request",
        "startup_s": max(startups) * factor,
        "decisive_lines": len(decisive),
        "lines_published": sum(len(v) for v in published.values()),
        "fired": len(latencies),
        "not_fired": sum(1 for c in decisive if fired.get(c) is None),
        "latency": summary_ms(latencies),
        "decisions_billed": billed,
        "billed_per_decisive": billed / max(1, len(decisive)),
        "decisions_on_superseded_states": superseded,
        "rate_limited_429s_heard": sum(r["rate_limited_heard"] for r in results),
        "rate_limited_429s_refused": refused,
        "longest_wait_for_start_s": max(waits, default=0.0) * factor,
        "longest_queue_wait_s": max(r["longest_queue_wait_s"] for r in results) * factor,
        "lines_never_decided": uncovered,
        "fair_share_ratio_max": fair["process"],
        "fair_share_bound_holds": fair["process"] <= 2.0,
        "fleet_fair_share_ratio_max": fair["fleet"],
        "longest_fair_wait_s": fair["longest_fair_wait_s"] * factor,
        "fair_share_ratio_max_not_fired_count": max(own_ratios, default=0.0),
        "fleet_fair_share_ratio_max_not_fired_count": max(ratios, default=0.0),
    }
    if decide_when:
        figures["targets"] = {"p50_ms": 2000, "p99_ms": 15000, "billed_per_decisive": 1.1, "superseded": 0}
    return figures


def fair_waits(
    waited: Mapping[str, list[tuple[float, float]]],
    process_of: Callable[[str], int],
    seconds_per_start: float,
) -> dict[str, float]:
    """The largest wait ÷ fair wait, per process and over the fleet (see the module docstring).

    A channel competes while one of its lines waits for a start; a group's share of the ceiling
    (a process: 1/PROCESSES of it; the fleet: all of it) is dealt evenly over the channels of the
    group competing at each moment. A line's fair wait is the time from its publication until
    that share adds up to one start (at least one start's time).
    """

    def fair_clock(channels: list[str], per_start: float) -> tuple[list[float], list[float]]:
        # (time, starts' worth of fair share a competing channel has had since the beginning)
        changes = []
        for channel in channels:
            spans = sorted(waited.get(channel, []))
            merged: list[list[float]] = []
            for begin, end in spans:
                if merged and begin <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([begin, end])
            changes += [(begin, 1) for begin, _ in merged] + [(end, -1) for _, end in merged]
        times, shares, competing, share, last = [], [], 0, 0.0, None
        for at, change in sorted(changes):
            if last is not None:
                share += (at - last) / (max(1, competing) * per_start)
            times.append(at)
            shares.append(share)
            competing, last = competing + change, at
        return times, shares

    def fair_wait(clock: tuple[list[float], list[float]], at: float, per_start: float) -> float:
        times, shares = clock
        i = bisect.bisect_right(times, at) - 1
        if i < 0 or i + 1 >= len(times):
            return per_start
        had = shares[i] + (shares[i + 1] - shares[i]) * (at - times[i]) / max(1e-12, times[i + 1] - times[i])
        j = bisect.bisect_left(shares, had + 1.0)
        if j >= len(shares):  # past the last wait: nobody competes, a start every per_start
            return times[-1] - at + (had + 1.0 - shares[-1]) * per_start
        slope = (shares[j] - shares[j - 1]) / max(1e-12, times[j] - times[j - 1])
        return max(per_start, times[j - 1] + (had + 1.0 - shares[j - 1]) / max(1e-12, slope) - at)

    groups: dict[int, list[str]] = {}
    for channel in waited:
        groups.setdefault(process_of(channel), []).append(channel)
    own_per_start = seconds_per_start * PROCESSES
    clocks = {process: fair_clock(channels, own_per_start) for process, channels in groups.items()}
    fleet = fair_clock(list(waited), seconds_per_start)
    worst = {"process": 0.0, "fleet": 0.0, "longest_fair_wait_s": 0.0}
    for channel, spans in waited.items():
        for at, start in spans:
            own = fair_wait(clocks[process_of(channel)], at, own_per_start)
            worst["process"] = max(worst["process"], (start - at) / own)
            worst["fleet"] = max(worst["fleet"], (start - at) / fair_wait(fleet, at, seconds_per_start))
            worst["longest_fair_wait_s"] = max(worst["longest_fair_wait_s"], own)
    return worst


async def run(options: Options) -> dict[str, Any]:
    """Run the scenario: without a filter, and with ``decide_when`` matching the decisive line."""
    n = QUICK_N if options.quick else N
    runs = {"no_filter": await measure(n, options.seed)}
    runs["decide_when"] = await measure(n, options.seed, decide_when=f"{READY}")
    return {"runs": runs, "fair_share_bound": 2.0, "grace_s": GRACE_S}


def main() -> None:
    """``python -m benchmarks.fleet``: run the scenario (or, with ``--child``, one triggerer)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--decide-when", default=None, help="the triggers' decide_when")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_triggerer(json.loads(args.child)))), flush=True)
        return
    n = args.n or (QUICK_N if args.quick else N)
    print(json.dumps(asyncio.run(measure(n, args.seed, decide_when=args.decide_when)), indent=2))


if __name__ == "__main__":
    main()
