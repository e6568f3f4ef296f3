"""Scenario — the account's decision ceiling, spent fully.

**One process.** N (12, 100, 1,000) decision triggers (``SystemZeroDecisionTrigger`` with its
defaults: ``on_change``, no ``decide_when``; ``lease_after`` 0.5 s), each rebuilt from
``serialize()`` and run by Airflow's ``TriggerRunner.run_trigger``, in one triggerer process on one
API key, against the emulator in a process of its own at the published account limits
(``account_decision_burst`` 5, ``account_decision_ceiling`` 60 a minute). Each trigger tails a file
of its own, and every file gains an initial line, a "still working" line 2 s later and "Job is
ready." 3 s after that. Twelve triggers run in real time (the reproduction, as a user runs it);
100 and 1,000 run :data:`FACTOR` times faster, as the fleet scenario does: every limit that binds
is scaled (the ceiling, the per-connection event and message rates, the lines' times,
``lease_after``, ``max_staleness`` and the reconnect backoff), the burst (a count) is not, and
every figure is in real-limit units (measured durations × the factor).

Figures: 429s per accepted start (the gateway's refusals ÷ the decisions it billed); streams the
gateway closed with 1013; the last trigger's decisive line → its ``TriggerEvent``, against the
*ideal schedule* the published budget allows for the same lines (:func:`ideal`): the bucket
starting full at the first line, a start the moment a token is there for the trigger whose newest
undecided line has waited longest, deciding its newest line, answered at once.

**Processes sharing the account.** P (2, 4) triggerer processes, separate OS processes, each with
:data:`BUSY_SENSORS` triggers whose files gain a line about every :data:`BUSY_LINE_S` seconds
(real-limit): every process always has more lines to decide than its share of the ceiling. Over
:data:`BUSY_WINDOW_S` seconds (real-limit, 20 × faster), after :data:`BUSY_WARMUP_S`: each process's
accepted starts ÷ its fair share of them (the account's accepted starts ÷ P), the worst process's
figure; 429s per accepted start; how much of the ceiling the account used; 1013 closes.

``python -m benchmarks.ceiling [--quick] [--only one|shared] [--out FILE]`` runs it alone and prints
the JSON (or writes it: a run against earlier code is the 'before' of the report,
:data:`BEFORE`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import Options, json_line, jsonl, play, spawn_child
from benchmarks.fleet import BURST, CEILING_PER_MINUTE, FACTOR, limits

__all__ = ["decide", "ideal", "run"]

#: The one-process runs: (sensors, time factor).
ONE_PROCESS = ((12, 1.0), (100, FACTOR), (1000, FACTOR))
QUICK_ONE_PROCESS = ((12, 1.0),)
#: The lines of each file in the one-process runs: (seconds after the first, text).
STEPS = ((0.0, "starting the job"), (2.0, "still working"), (5.0, "Job is ready."))
#: The trigger's ``lease_after`` in the reproduction (real seconds).
LEASE_AFTER_S = 0.5
#: Processes sharing the account, and what each runs.
SHARED, QUICK_SHARED = (2, 4), (2,)
BUSY_SENSORS = 60
#: Mean seconds (real-limit) between two lines of one file in the shared runs.
BUSY_LINE_S = 10.0
#: Seconds (real-limit) measured in the shared runs, after a warm-up.
BUSY_WINDOW_S, QUICK_BUSY_WINDOW_S = 1800.0, 400.0
BUSY_WARMUP_S = 100.0
#: The decider's marker of a decisive line.
READY = "Job is ready."
DECIDER = "python:benchmarks.ceiling:decide"
#: Where the decider records the starts it sees (set for the emulator process).
RECORDS_ENV = "SZ_CEILING_RECORDS"
#: A run of this scenario against earlier code: the report's 'before'.
BEFORE = Path(__file__).resolve().parent / "results" / "before-ceiling.json"
#: The targets of each figure.
TARGETS = {
    "rate_limited_per_accepted_one": 0.02,
    "last_vs_ideal": 1.2,
    "closes_1013": 0,
    "worst_fair_share": 0.85,
    "rate_limited_per_accepted_shared": 0.15,
}


def decide(request: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The scenario's decider: ``ready`` when the state's last line is the decisive one; records
    ``[channel, wall time]`` of every start it sees (the channel is the state's first word).

    :param request: the decide body.
    :param now: the backend's clock (unused).
    """
    state = str(request.get("state"))
    path = os.environ.get(RECORDS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps([state.split(" ", 1)[0], time.time()]) + "\n")
    last = state.rstrip("\n").rsplit("\n", 1)[-1]
    return {"ready": {"decision": last.endswith(READY), "probability": 0.97, "confidence": 0.94}}


def ideal(
    lines: Mapping[str, Sequence[tuple[float, bool]]], burst: int, per_second: float
) -> dict[str, float]:
    """The ideal schedule of the published budget for these lines: when each channel's decisive
    line is decided.

    A bucket of ``burst`` starts refilled at ``per_second`` starts full at the first line; a start
    goes the moment a token is there, for the channel whose newest undecided line has waited
    longest (ties: the one whose first undecided line came first), and decides that newest line
    at once.

    :param lines: per channel, ``(time, decisive)`` of each line in order.
    :returns: per channel, the time its decisive line was decided.
    """
    if not any(lines.values()):
        return {}
    origin = min(at for seq in lines.values() for at, _ in seq)  # relative times: no float stall
    arrivals = sorted(
        (at - origin, channel, decisive) for channel, seq in lines.items() for at, decisive in seq
    )
    now, tokens = 0.0, float(burst)
    waiting: dict[str, tuple[float, float, bool]] = {}  # channel → (newest at, first at, newest decisive)
    decided: dict[str, float] = {}
    i = 0
    while i < len(arrivals) or waiting:
        while i < len(arrivals) and arrivals[i][0] <= now:
            at, channel, decisive = arrivals[i]
            first = waiting[channel][1] if channel in waiting else at
            waiting[channel] = (at, first, decisive)
            i += 1
        while waiting and tokens >= 1:
            channel = min(waiting, key=lambda c: (waiting[c][0], waiting[c][1]))
            _, _, decisive = waiting.pop(channel)
            tokens -= 1
            if decisive:
                decided.setdefault(channel, now + origin)
        line_at = arrivals[i][0] if i < len(arrivals) else math.inf
        token_at = now + (1 - tokens) / per_second if waiting else math.inf
        if token_at <= line_at:  # the next token comes first: exactly one
            now, tokens = token_at, 1.0
        else:
            tokens = min(float(burst), tokens + (line_at - now) * per_second)
            now = line_at
    return decided


# ------------------------------------------------------------------------------------ a triggerer


async def _triggerer(config: dict[str, Any]) -> dict[str, Any]:
    """One triggerer process: start its triggers, then play its files' lines and report."""
    from airflow_provider_systemzero.decisions.source_watch import DEFAULT_MAX_STALENESS
    from airflow_provider_systemzero.identity import task_namespace
    from airflow_provider_systemzero.stream.starts import running_starts
    from benchmarks.fixtures import decision_trigger
    from benchmarks.runner import Triggerer, rebuild

    os.environ.update(config["env"])
    factor, first, count = config["factor"], config["first"], config["count"]
    directory = tempfile.mkdtemp(prefix="sz-ceiling-")
    triggerer = Triggerer()
    ids: dict[int, int] = {}
    paths: dict[int, str] = {}
    try:
        for index in range(first, first + count):
            paths[index] = path = os.path.join(directory, f"c{index}.log")
            _write(path, config["first_line"].format(index=index), "w")
            trigger = rebuild(
                decision_trigger(
                    task_namespace("bench_ceiling", "wait", config["tag"], index),
                    {"type": "file", "path": path},
                    state="",
                    lease_after=LEASE_AFTER_S / factor,
                    max_staleness=DEFAULT_MAX_STALENESS / factor,
                )
            )
            await asyncio.sleep(0)
            ids[index] = triggerer.start(trigger)
        print(json.dumps({"ready": True}), flush=True)
        go = json.loads(await asyncio.to_thread(sys.stdin.readline))["go"]
        written: dict[int, list[tuple[float, bool]]] = {index: [] for index in ids}
        for at, index, text in _plan(config, first, count):
            delay = go + at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            _write(paths[index], f"c{index} {text}\n", "a")
            written[index].append((time.time(), text == READY))
        await asyncio.wait([triggerer.task(t) for t in ids.values()], timeout=config["tail_s"])
        offset = time.time() - time.perf_counter()
        fired, failed = {}, []
        for index, trigger_id in ids.items():
            at = triggerer.fired_at(trigger_id)
            payload = triggerer.payload(trigger_id) or {}
            fired[index] = (at + offset) if at is not None and payload.get("status") == "success" else None
            if at is not None and payload.get("status") != "success":
                failed.append(f"{payload.get('status')}: {payload.get('message')}")
        queues = [starts.queue for starts in running_starts()]
        return {
            "written": written,
            "fired": fired,
            "rate_limited_heard": sum(q.rate_limited for q in queues),
            "failed": failed,
        }
    finally:
        await triggerer.finish()
        shutil.rmtree(directory, ignore_errors=True)


def _write(path: str, text: str, mode: str) -> None:
    """Write a file as a job writes its log (the time the write returned is the line's time)."""
    with open(path, mode, encoding="utf-8") as handle:
        handle.write(text)


def _plan(config: dict[str, Any], first: int, count: int) -> list[tuple[float, int, str]]:
    """``(benchmark second, file index, line)`` of this process's files, in time order."""
    factor = config["factor"]
    if config["kind"] == "steps":
        return sorted(
            (at / factor, index, text) for at, text in STEPS for index in range(first, first + count)
        )
    plan = []
    for index in range(first, first + count):
        rng = random.Random(config["seed"] * 100_003 + index)
        at, number = rng.uniform(0, BUSY_LINE_S), 1
        while at < config["window_s"]:
            plan.append((at / factor, index, f"line {number}"))
            at, number = at + rng.expovariate(1 / BUSY_LINE_S), number + 1
    return sorted(plan)


# ------------------------------------------------------------------------------------ the runs


async def measure(
    kind: str, processes: int, sensors: int, factor: float, *, seed: int, window_s: float = 0.0
) -> dict[str, Any]:
    """One run: ``processes`` triggerer processes of ``sensors`` triggers each.

    :param kind: ``steps`` (the three lines of the one-process runs) or ``busy`` (lines all along).
    :param window_s: ``busy``: the seconds (real-limit) of lines.
    """
    from benchmarks.emulator_host import EmulatorProcess

    handle, records = tempfile.mkstemp(prefix="sz-ceiling-", suffix=".jsonl")
    os.close(handle)
    os.environ[RECORDS_ENV] = records
    per_second = CEILING_PER_MINUTE * factor / 60
    if kind == "steps":
        tail_s = 60 + 3 * sensors / per_second  # a trigger not fired by then counts as never
        first_line = ""
    else:
        tail_s = 0.0
        first_line = "c{index} line 0\n"
    try:
        async with EmulatorProcess(
            limits=limits(factor), max_concurrent=8 * processes + 8, decider=DECIDER
        ) as emulator:
            env = {
                **emulator.connection_env(),
                # the reconnect backoff (0.5 s doubling up to 30 s) runs as much faster as the limits
                "AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE": str(0.5 / factor),
                "AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_CAP": str(30.0 / factor),
            }
            config = {
                "env": env,
                "factor": factor,
                "kind": kind,
                "seed": seed,
                "tag": uuid.uuid4().hex[:8],
                "tail_s": tail_s,
                "window_s": window_s,
                "first_line": first_line,
                "count": sensors,
            }
            procs = [
                await spawn_child("benchmarks.ceiling", {**config, "first": k * sensors})
                for k in range(processes)
            ]
            for proc in procs:
                await json_line(proc)
            if kind == "busy":  # every trigger had its first decision: the account is busy from here
                await _settle(records, processes * sensors)
            played = await play(procs, emulator, records)
    finally:
        os.unlink(records)
    common = _common(played.before, played.after, played.results, processes, sensors, factor)
    if kind == "steps":
        return {**common, **_steps(played.results, factor)}
    return {**common, **_shared(played.records, played.go, processes, sensors, factor, window_s)}


async def _settle(records: str, count: int) -> None:
    """Wait (bounded) until the emulator decided ``count`` opening states."""
    deadline = time.monotonic() + 600
    while len(jsonl(records)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(jsonl(records))} of {count} triggers had a decision in 600 s")
        await asyncio.sleep(0.2)


def _common(
    before: dict[str, Any],
    after: dict[str, Any],
    results: list[dict[str, Any]],
    processes: int,
    sensors: int,
    factor: float,
) -> dict[str, Any]:
    billed = after["decisions_billed"] - before["decisions_billed"]
    refused = after.get("decision_starts_refused", 0) - before.get("decision_starts_refused", 0)
    closes = {int(k): v - int(before["closes_by_code"].get(k, 0)) for k, v in after["closes_by_code"].items()}
    return {
        "processes": processes,
        "sensors_per_process": sensors,
        "factor": factor,
        "accepted_starts": billed,
        "rate_limited_429s": refused,
        "rate_limited_per_accepted": refused / max(1, billed),
        "rate_limited_heard": sum(r["rate_limited_heard"] for r in results),
        "closes_1013": closes.get(1013, 0),
        "triggers_failed": sum(len(r["failed"]) for r in results),
        "failures": sorted({message for r in results for message in r["failed"]})[:3],
    }


def _steps(results: list[dict[str, Any]], factor: float) -> dict[str, Any]:
    written = {f"c{i}": lines for r in results for i, lines in r["written"].items()}
    fired = {f"c{i}": at for r in results for i, at in r["fired"].items()}
    ready = {c: next(at for at, decisive in lines if decisive) for c, lines in written.items()}
    best = ideal(written, BURST, CEILING_PER_MINUTE * factor / 60)
    waits = {c: fired[c] - ready[c] for c in ready if fired.get(c) is not None}
    ideal_waits = {c: best[c] - ready[c] for c in ready if c in best}
    last_ideal = max(ideal_waits.values(), default=math.nan) * factor
    # a trigger that never fired (within the run's tail) has no last line → event: none is given
    last = max(waits.values()) * factor if waits and len(waits) == len(ready) else None
    return {
        "fired": len(waits),
        "not_fired": len(ready) - len(waits),
        "last_decisive_to_event_s": last,
        "ideal_last_decisive_to_event_s": last_ideal,
        "last_vs_ideal": None if last is None else last / last_ideal,
        "decisive_to_event_p50_s": sorted(waits.values())[len(waits) // 2] * factor if waits else math.nan,
    }


def _shared(
    starts: list[tuple[str, float]], go: float, processes: int, sensors: int, factor: float, window_s: float
) -> dict[str, Any]:
    begin, end = go + BUSY_WARMUP_S / factor, go + window_s / factor
    counts = [0] * processes
    for channel, at in starts:
        if begin <= at < end and channel.startswith("c"):
            counts[min(processes - 1, int(channel[1:]) // sensors)] += 1
    total = sum(counts)
    shares = [
        c / (total / processes) if total else 0.0 for c in counts
    ]  # no start at all: none had its share
    per_second = CEILING_PER_MINUTE * factor / 60
    ceiling = (end - begin) * per_second
    return {
        "window_s": window_s - BUSY_WARMUP_S,
        "starts_per_process": counts,
        "fair_shares": shares,
        "worst_fair_share": min(shares, default=0.0),
        "worst_ceiling_share": min(counts, default=0) / (ceiling / processes),
        "ceiling_used": total / ceiling,
    }


async def run(options: Options, only: str | None = None) -> dict[str, Any]:
    """Run the scenario (the one-process runs, then the shared ones)."""
    runs: dict[str, Any] = {}
    if only in (None, "one"):
        for sensors, factor in QUICK_ONE_PROCESS if options.quick else ONE_PROCESS:
            runs[f"one_{sensors}"] = await measure("steps", 1, sensors, factor, seed=options.seed)
    if only in (None, "shared"):
        window = QUICK_BUSY_WINDOW_S if options.quick else BUSY_WINDOW_S
        for processes in QUICK_SHARED if options.quick else SHARED:
            runs[f"shared_{processes}"] = await measure(
                "busy", processes, BUSY_SENSORS, FACTOR, seed=options.seed, window_s=window
            )
    result: dict[str, Any] = {"runs": runs, "targets": TARGETS}
    if BEFORE.exists():
        before = json.loads(BEFORE.read_text(encoding="utf-8"))
        result["before"] = before.get("runs", {})
        result["before_commit"] = before.get("commit")
    return result


def main() -> None:
    """``python -m benchmarks.ceiling``: run the scenario (or, with ``--child``, one triggerer)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceiling")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["one", "shared"], default=None)
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (with the commit)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_triggerer(json.loads(args.child)))), flush=True)
        return
    result = asyncio.run(run(Options(quick=args.quick, seed=args.seed), args.only))
    if args.out is None:
        print(json.dumps(result, indent=2))
        return
    from benchmarks.common import machine

    result = {"commit": machine().get("commit"), **result}
    result.pop("before", None)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
