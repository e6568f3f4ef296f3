"""Scenario 4 — ingest: a log written at 10,000 lines/s for 30 s, tailed by a decision trigger.

A writer thread appends ``%08d\\n`` lines (9 bytes) to a file at 10,000 lines/s; the trigger
tails it with the ``file`` source (``poll_interval`` 0.1 s, so the source offers up to ten new
states a second). The gateway allows ``max_events_per_second`` 5 with ``event_burst`` 10 (the
public document's limits, unchanged): the client paces its mutations under that bucket and
coalesces everything the log gained meanwhile into the next ``append_text``.

300,000 lines of 9 bytes are 2.7 MB of state, 3.0 MB once JSON escapes each newline — inside
``max_decide_body_bytes`` (3,665,920). (At 10 bytes a line the body would reach 3.3 MB; at
12 bytes it would pass the limit and the source would fail with ``decide_body_too_large``.)

After the last line a ``READY`` line makes the trigger fire. Reported: mutations the gateway
accepted per second (mean and the busiest one-second window, sampled in the emulator),
rejections (``event_rate_limited`` and any other), whether the gateway's last accepted state is
byte-identical to the file, how long the trigger took to catch up after the writer stopped,
and the trigger process's CPU and longest event-loop stall. The account's decision buckets
are raised: every accepted mutation schedules a decision (on_change), about 4.5 a second,
which the default 60-a-minute ceiling would refuse.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import Options
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.fixtures import READY, decision_trigger
from benchmarks.runner import StallWatchdog, Triggerer, rebuild

__all__ = ["run"]

LIMITS = {"account_decision_burst": 100_000, "account_decision_ceiling_per_minute": 10_000_000}
LINES_PER_SECOND = 10_000
LINE = "{:08d}\n"
#: The log's first line, there before the trigger starts.
HEADER = "job started\n"
POLL_INTERVAL = 0.1


def _write(path: Path, seconds: float, done: threading.Event) -> int:
    """Append ``LINES_PER_SECOND`` lines a second for ``seconds``, then ``READY``; returns lines written."""
    written = 0
    total = int(LINES_PER_SECOND * seconds)
    started = time.perf_counter()
    with path.open("a", encoding="utf-8") as handle:
        while written < total:
            due = min(total, int((time.perf_counter() - started) * LINES_PER_SECOND))
            if due > written:
                handle.write("".join(LINE.format(i) for i in range(written, due)))
                handle.flush()
                written = due
            time.sleep(0.005)
        handle.write(f"{READY}\n")
        handle.flush()
    done.set()
    return written


def _window_peak(samples: list[list[float]], window: float = 1.0) -> int:
    """The most events accepted within any ``window`` seconds, from ``[t, events, rejections]`` samples."""
    peak = 0
    start = 0
    for end in range(len(samples)):
        while samples[end][0] - samples[start][0] > window:
            start += 1
        peak = max(peak, int(samples[end][1] - samples[start][1]))
    return peak


def _rate_after(samples: list[list[float]], skip: float) -> float:
    """Events per second once the first ``skip`` seconds (the bucket's initial burst) are over."""
    later = [s for s in samples if s[0] >= skip]
    if len(later) < 2 or later[-1][0] == later[0][0]:
        return float("nan")
    return (later[-1][1] - later[0][1]) / (later[-1][0] - later[0][0])


def _read_and_remove(path: Path) -> bytes:
    data = path.read_bytes()
    path.unlink()
    path.parent.rmdir()
    return data


async def _started(emulator: EmulatorProcess) -> None:
    """Wait until the gateway accepted the trigger's ``start``."""
    async with asyncio.timeout(30):
        accepted = 0
        while accepted < 1:
            await asyncio.sleep(0.01)
            accepted = (await emulator.stats())["events_accepted"]


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 4 and return its results."""
    from airflow_provider_systemzero.identity import task_namespace
    from airflow_provider_systemzero.stream.request import derive_prompt_cache_key

    seconds = 5.0 if options.quick else 30.0
    workdir = Path(tempfile.mkdtemp(prefix="systemzero-bench-ingest-"))
    path = workdir / "job.log"
    # a first line: a file with no content yet is not a state (nothing is sent until it has some),
    # and the trigger's start must be accepted before the writer begins
    path.write_text(HEADER)
    namespace = task_namespace("bench_ingest", "tail", uuid.uuid4().hex[:8], -1)
    async with EmulatorProcess(limits=LIMITS) as emulator:
        os.environ.update(emulator.connection_env())
        triggerer = Triggerer()
        trigger = rebuild(
            decision_trigger(namespace, {"type": "file", "path": str(path), "poll_interval": POLL_INTERVAL})
        )
        trigger_id = triggerer.start(trigger)
        await _started(emulator)
        watchdog = StallWatchdog(0.01)
        watchdog.start()
        await emulator.call("sample", interval=0.02)
        cpu, emulator_cpu = time.process_time(), (await emulator.stats())["cpu_seconds"]
        done = threading.Event()
        started = time.perf_counter()
        writer = asyncio.ensure_future(asyncio.to_thread(_write, path, seconds, done))
        lines = await writer
        writer_done = time.perf_counter()
        async with asyncio.timeout(120):
            await triggerer.task(trigger_id)
        fired = triggerer.fired_at(trigger_id) or time.perf_counter()
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        samples = await emulator.call("samples")
        await watchdog.stop()
        stats = await emulator.stats()
        emulator_cpu = stats["cpu_seconds"] - emulator_cpu
        final = await emulator.call("state", key=derive_prompt_cache_key(None, namespace))
    payload = triggerer.payload(trigger_id) or {}
    data = _read_and_remove(path)
    source_sha = hashlib.sha256(data).hexdigest()
    events = stats["events_accepted"]
    window = samples[-1][0] - samples[0][0] if len(samples) > 1 else elapsed
    return {
        "seconds": seconds,
        "lines": lines,
        "line_bytes": len(LINE.format(0)),
        "lines_per_s": lines / seconds,
        "state_bytes": len(data),
        "decide_body_bytes_limit": 3_665_920,
        "poll_interval_s": POLL_INTERVAL,
        "limit_events_per_s": 5,
        "limit_event_burst": 10,
        "events_accepted": events,
        "events_per_s_mean": (samples[-1][1] - samples[0][1]) / window
        if len(samples) > 1
        else events / elapsed,
        "events_per_s_after_burst": _rate_after(samples, 3.0),
        "events_peak_1s": _window_peak(samples),
        "bucket_peak_1s": 10 + 5,
        "lines_per_event": lines / max(1, events),
        "rejections": stats["rejections"],
        "protocol_refusals": stats["protocol_refusals"],
        "decisions_billed": stats["decisions_billed"],
        "decide_failures": stats["decide_failures"],
        "byte_identical": final is not None and final["sha256"] == source_sha and final["bytes"] == len(data),
        "gateway_state_bytes": final["bytes"] if final else None,
        "catch_up_s": fired - writer_done,
        "event_status": payload.get("status"),
        "trigger_cpu_pct": cpu / elapsed * 100,
        "emulator_cpu_pct": emulator_cpu / elapsed * 100,
        "stalls": watchdog.report(),
        "met": stats["rejections"] == 0 and final is not None and final["sha256"] == source_sha,
    }
