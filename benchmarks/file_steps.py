"""Where a file change's time goes in the crowd of file-tailing triggers (a diagnostic).

``python -m benchmarks.file_steps --n 1000`` runs the density harness's crowd (N triggers tailing
N files on notifications, every file changing twice over 30 s, 66 changes/s at N = 1,000) with
each step of the decisive change stamped, per file, from the moment the write returned:

* ``notified`` — the file watcher called the source back about the file (the callback the source
  gave :meth:`~airflow_provider_systemzero.sources.file_watch.FileWatcher.subscribe`);
* ``handed`` — the source's ``read()`` returned the new text to the trigger's driver.

What comes after ``handed`` (the dormant trigger opening its stream, the decision, the event) is
the stream's part, the same for every source kind; the crowd's end-to-end figure is in
``latency.crowds``. The stamps wrap two public methods (the watcher's ``subscribe``, the source's
``read``), so this run is a profile, not the published figure; the watcher's own counters
(``FileWatcher.stats()``) say how many notifications each wake handed on. It also records the
process's generation-2 collections (start and length): under load a full collection of the
crowd's objects is the longest pause.
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

STEPS = ("notified", "handed")


async def measure(n: int, options: Options) -> dict[str, Any]:
    """Run the file crowd with the decisive change of each file stamped; the steps' summaries."""
    from airflow_provider_systemzero.sources import file as file_source
    from airflow_provider_systemzero.sources import file_watch

    written: dict[str, float] = {}
    stamps: dict[str, dict[str, float]] = {}
    watchers: list[file_watch.FileWatcher] = []

    def stamp(path: str, step: str) -> None:
        if path in written:
            stamps.setdefault(path, {}).setdefault(step, time.perf_counter())

    publish = fixtures.Feed.publish
    subscribe = file_watch.FileWatcher.subscribe
    source_read = file_source.FileSource.read

    def stamped_publish(self: fixtures.Feed, channel: str, state: str) -> float:
        produced = publish(self, channel, state)
        if fixtures.READY in state:
            written[self.path_of(channel)] = produced
        return produced

    def stamped_subscribe(self: file_watch.FileWatcher, path: str, callback: Any) -> Any:
        if self not in watchers:
            watchers.append(self)

        def notified(mask: int) -> None:
            stamp(path, "notified")
            callback(mask)

        return subscribe(self, path, notified)

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
    file_watch.FileWatcher.subscribe = stamped_subscribe  # type: ignore[method-assign]
    file_source.FileSource.read = stamped_source_read  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    try:
        crowd = await density.measure(n, options, "file")
    finally:
        gc.callbacks.remove(on_gc)
        fixtures.Feed.publish = publish  # type: ignore[method-assign]
        file_watch.FileWatcher.subscribe = subscribe  # type: ignore[method-assign]
        file_source.FileSource.read = source_read  # type: ignore[method-assign]
    first_write = min(written.values(), default=0.0)
    steps = {
        step: summary_ms([s[step] - written[path] for path, s in stamps.items() if step in s])
        for step in STEPS
    }
    counters = [watcher.stats() for watcher in watchers]
    events, wakes = sum(c["events_read"] for c in counters), sum(c["wakes"] for c in counters)
    return {
        "n": n,
        "write_to": steps,
        "end_to_end": crowd["latency"],
        "watching": crowd["watching"],
        "notifications": {"events_read": events, "wakes": wakes},
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
