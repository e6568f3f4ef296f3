"""Where a file change's time goes in the crowd of file-tailing triggers (a diagnostic).

``python -m benchmarks.file_steps --n 1000`` runs the density harness's crowd (N triggers tailing
N files on notifications, every file changing twice over 30 s, 66 changes/s at N = 1,000) with
each step of the decisive change stamped, per file, from the moment the write returned:

* ``notified`` — the watcher's reader callback handed the source its notification;
* ``read`` — the source read the new bytes (on the event loop, or in a thread for a large read);
* ``handed`` — the source's ``read()`` returned the text to the trigger's driver.

What comes after ``handed`` (the dormant trigger opening its stream, the decision, the event) is
the stream's part, the same for every source kind; the crowd's end-to-end figure is in
``latency.crowds``. The stamps are wrappers around the source's methods, so this run is a
profile, not the published figure. It also records the process's generation-2 collections
(start and length): under load a full collection of the crowd's objects is the longest pause.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from typing import Any

from benchmarks import density, fixtures
from benchmarks.common import Options, summary_ms

__all__ = ["measure"]

STEPS = ("notified", "read", "handed")


async def measure(n: int, options: Options) -> dict[str, Any]:
    """Run the file crowd with the decisive change of each file stamped; the steps' summaries."""
    from airflow_provider_systemzero.sources import file as file_source
    from airflow_provider_systemzero.sources import file_watch

    written: dict[str, float] = {}
    stamps: dict[str, dict[str, float]] = {}
    batches: list[int] = []

    def stamp(path: str, step: str) -> None:
        if path in written:
            stamps.setdefault(path, {}).setdefault(step, time.perf_counter())

    publish = fixtures.Feed.publish
    on_readable = file_watch.FileWatcher._on_readable
    on_event = file_source.FileSource._on_event
    read = file_source.FileSource._read
    source_read = file_source.FileSource.read

    def stamped_publish(self: fixtures.Feed, channel: str, state: str) -> float:
        produced = publish(self, channel, state)
        if fixtures.READY in state:
            written[self._path(channel)] = produced
        return produced

    def stamped_on_readable(self: file_watch.FileWatcher) -> None:
        before = self.events_read
        on_readable(self)
        batches.append(self.events_read - before)

    def stamped_on_event(self: file_source.FileSource, mask: int) -> None:
        stamp(self.path, "notified")
        on_event(self, mask)

    def stamped_read(self: file_source.FileSource, replaced: bool, limit: int | None = None) -> bool | None:
        done = read(self, replaced, limit)
        if fixtures.READY in self._text:
            stamp(self.path, "read")
        return done

    async def stamped_source_read(self: file_source.FileSource) -> str:
        value = await source_read(self)
        if fixtures.READY in value:
            stamp(self.path, "handed")
        return value

    collections: list[tuple[float, float]] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started.append(time.perf_counter())
            elif started:
                collections.append((started[-1], time.perf_counter() - started[-1]))

    fixtures.Feed.publish = stamped_publish  # type: ignore[method-assign]
    file_watch.FileWatcher._on_readable = stamped_on_readable  # type: ignore[method-assign]
    file_source.FileSource._on_event = stamped_on_event  # type: ignore[method-assign]
    file_source.FileSource._read = stamped_read  # type: ignore[method-assign]
    file_source.FileSource.read = stamped_source_read  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    try:
        crowd = await density.measure(n, options, "file")
    finally:
        gc.callbacks.remove(on_gc)
        fixtures.Feed.publish = publish  # type: ignore[method-assign]
        file_watch.FileWatcher._on_readable = on_readable  # type: ignore[method-assign]
        file_source.FileSource._on_event = on_event  # type: ignore[method-assign]
        file_source.FileSource._read = read  # type: ignore[method-assign]
        file_source.FileSource.read = source_read  # type: ignore[method-assign]
    first_write = min(written.values(), default=0.0)
    steps = {
        step: summary_ms([s[step] - written[path] for path, s in stamps.items() if step in s])
        for step in STEPS
    }
    ordered = sorted(batches)
    return {
        "n": n,
        "write_to": steps,
        "end_to_end": crowd["latency"],
        "watching": crowd["watching"],
        "events_per_read": {
            "reads": len(ordered),
            "p50": ordered[len(ordered) // 2] if ordered else 0,
            "max": ordered[-1] if ordered else 0,
        },
        "gen2_collections_ms": [
            round(length * 1000, 1) for at, length in collections if at >= first_write - 1.0
        ],
        "change_phase_cpu_pct": crowd["change_phase_cpu_pct"],
        "longest_stall_ms": crowd["longest_stall_ms"],
    }


def main() -> None:
    """Measure one N and print the result as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.file_steps")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.n, Options(quick=args.quick, seed=args.seed)))))


if __name__ == "__main__":
    main()
