"""Small helpers shared by the scenarios: percentiles, the machine description, options."""

from __future__ import annotations

import gc
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
from typing import Any

__all__ = ["Options", "machine", "per_call_us", "percentile", "summary_ms"]


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
