"""What Airflow's trigger runner keeps per waiting trigger, whatever the trigger: the control of scenario 6.

``python -m benchmarks.runner_share --n 2000`` runs N minimal triggers (``run()`` awaits a bare
future) through Airflow's ``TriggerRunner.run_trigger`` (:class:`benchmarks.runner.Triggerer`),
with ``gc.freeze()`` after start-up as in :mod:`benchmarks.density`, and prints one JSON line: RSS
and objects tracked by the collector per trigger, and the CPU time one full collection gains per
1,000 of them. Subtracted from scenario 6's figures, it leaves the provider's and the source's share.
The minimal trigger itself (its object, its ``run()`` generator with the loop's weak reference to it,
and the future it awaits) counts 6 of the tracked objects.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from benchmarks.density import _full_collection_ms, freeze_after_start_up
from benchmarks.runner import Triggerer, rss_kb

__all__ = ["MinimalTrigger", "measure"]


class MinimalTrigger(BaseTrigger):
    """A trigger that waits on a future nothing completes (it is cancelled at the end)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Class path and kwargs."""
        return (f"{__name__}.MinimalTrigger", {"index": self.index})

    async def run(self) -> Any:
        """Wait forever."""
        await asyncio.get_running_loop().create_future()
        yield TriggerEvent({})


async def measure(n: int) -> dict[str, Any]:
    """RSS, tracked objects and full-collection CPU time per minimal waiting trigger.

    :param n: how many triggers wait at once.
    """
    triggerer = Triggerer()
    triggerer.start(MinimalTrigger(-1))  # the first trigger loads what every trigger loads once
    await asyncio.sleep(0.5)
    freeze_after_start_up()
    gc.collect()
    base_rss, base_tracked, base_gc_ms = rss_kb(), len(gc.get_objects()), _full_collection_ms()
    before = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    for index in range(n):
        triggerer.start(MinimalTrigger(index))
        await asyncio.sleep(0)
    await asyncio.sleep(0.5)
    gc.collect()
    grown = collections.Counter(type(o).__qualname__ for o in gc.get_objects()) - before
    result = {
        "n": n,
        "gc_freeze": True,
        "rss_per_trigger_kb": (rss_kb() - base_rss) / n,
        "gc_tracked_per_trigger": (len(gc.get_objects()) - base_tracked) / n,
        "full_gc_ms_added_per_1000": (_full_collection_ms() - base_gc_ms) * 1000 / n,
        "gc_tracked_types_per_trigger": {name: count / n for name, count in grown.most_common(12)},
    }
    await triggerer.finish()
    return result


def main() -> None:
    """Measure N minimal triggers and print the result as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runner_share")
    parser.add_argument("--n", type=int, default=2000)
    print(json.dumps(asyncio.run(measure(parser.parse_args().n))))


if __name__ == "__main__":
    main()
