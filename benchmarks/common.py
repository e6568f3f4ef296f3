"""Small helpers shared by the scenarios: percentiles, the machine description, options, and the
triggerer processes of the multi-process scenarios (``python -m <scenario> --child CONFIG``)."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, NamedTuple

__all__ = [
    "Options",
    "json_line",
    "jsonl",
    "machine",
    "per_call_us",
    "percentile",
    "play",
    "spawn_child",
    "summary_ms",
]


@dataclass(frozen=True)
class Options:
    """What every scenario is told.

    :param quick: the smoke run (about a minute): fewer samples, shorter windows.
    :param seed: the random seed of source change times.
    :param sources: the sources the latency scenario measures (``push``, ``file``; empty: all), to
        run one source's cases alone while working on it.
    """

    quick: bool = False
    seed: int = 20260601
    sources: tuple[str, ...] = ()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by linear interpolation; ``nan`` for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary_ms(seconds: Sequence[float]) -> dict[str, Any]:
    """``n``, p50, p95, p99, max and mean of durations given in seconds, in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms, default=math.nan),
        "mean_ms": sum(ms) / len(ms) if ms else math.nan,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return math.nan


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def _commit() -> str:
    if os.environ.get("BENCH_COMMIT"):  # the provider under test is another tree (a 'before' run)
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def machine() -> dict[str, Any]:
    """Where the benchmarks ran: CPU, cores, RAM, OS, Python and the versions that matter."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": _ram_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "python_implementation": sys.implementation.name,
        "airflow": _version("apache-airflow"),
        "websockets": _version("websockets"),
        "provider": _version("airflow-provider-systemzero"),
        "commit": _commit(),
    }


def per_call_us(
    function: Callable[[], Any], *, repeats: int, number: int, clock: Callable[[], int] = time.perf_counter_ns
) -> float:
    """Median over ``repeats`` of the mean time of ``number`` calls, in microseconds, with the
    collector off (``clock``: wall time by default; ``time.thread_time_ns`` for CPU time)."""
    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            started = clock()
            for _ in range(number):
                function()
            samples.append((clock() - started) / number / 1000)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(samples)


async def spawn_child(module: str, config: dict[str, Any]) -> asyncio.subprocess.Process:
    """``python -m <module> --child <config as JSON>``: a triggerer process of a scenario, which
    takes its orders on stdin and answers one JSON object a line on stdout.

    :param module: the scenario's module (``benchmarks.fleet`` …).
    :param config: what the child runs.
    """
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        "--child",
        json.dumps(config),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=2**26,
    )


async def json_line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """The child's next JSON line (other output skipped).

    :raises RuntimeError: the child exited first.
    """
    assert proc.stdout is not None
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a benchmark triggerer exited with status {await proc.wait()}")
        if line.startswith(b"{"):
            return json.loads(line)


def jsonl(path: str) -> list[Any]:
    """The JSON values of a file, one a line (what a decider recorded so far)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Played(NamedTuple):
    """What :func:`play` saw: when the children began, the emulator's stats before and after,
    the children's reports, and the decider's records from the beginning on."""

    go: float
    before: dict[str, Any]
    after: dict[str, Any]
    results: list[dict[str, Any]]
    records: list[Any]


async def play(procs: Sequence[asyncio.subprocess.Process], emulator: Any, records: str) -> Played:
    """Tell every child (each ready) to begin one second from now — ``{"go": wall time}`` — then
    wait for their reports and their exit.

    :param emulator: the :class:`~benchmarks.emulator_host.EmulatorProcess` they use.
    :param records: the file the emulator's decider records its starts in.
    """
    before = await emulator.stats()
    skip = len(jsonl(records))
    go = time.time() + 1.0
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps({"go": go}) + "\n").encode())
        await proc.stdin.drain()
    results = [await json_line(p) for p in procs]
    for proc in procs:
        await proc.wait()
    return Played(go, before, await emulator.stats(), results, jsonl(records)[skip:])
