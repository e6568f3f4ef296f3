"""Scenario — many asset watches of one source: one shared stream (Airflow 3.3) against one each.

N ``SystemZeroDecisionEventTrigger`` s watch one push source with the same connection, model and
questions, each with a condition of its own (the same answer at different confidence bars, all met
by a ``READY`` line), through Airflow's ``TriggerRunner.run_trigger`` (:class:`benchmarks.runner.Triggerer`)
against the emulator in a process of its own. The source then changes ``rounds`` times to a state
that meets no condition and back to one that meets all of them, a change every
:data:`CHANGE_GAP_S` at most (the rate one stream may send at); every watch fires once per round.

Each N runs twice: **shared** (the watches' ``shared_stream_key``, one stream for the group, as
Airflow 3.3's triggerer runs them) and **alone** (the same watches with sharing off, one stream
each, as Airflow 3.1 and 3.2 run them; a process holds ``max_streams_per_process`` = 4 streams, so
the others wait for a slot). Reported: the streams opened, the decisions billed per change, and the
latency from a change that meets the conditions to the event of the *last* watch (p50 and max).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from benchmarks.common import Options, summary_ms
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.fixtures import CONN_ID, READY, REQUEST, forget, publish, source_spec
from benchmarks.report_format import fmt_ms, fmt_num, md_table
from benchmarks.runner import Triggerer

__all__ = ["run", "section", "watch_group"]

SIZES = (10, 50)
QUICK_SIZES = (10,)
ROUNDS = 10
QUICK_ROUNDS = 2
LIMITS = {"account_decision_burst": 100_000, "account_decision_ceiling_per_minute": 10_000_000}
#: Seconds between two changes of the source: a stream sends at most ``max_events_per_second`` (5)
#: changes a second once its burst is spent, and a source that changes faster is paced by the
#: protocol, not measured here.
CHANGE_GAP_S = 0.25
#: Seconds a step may take before the run fails (a change decided and every event fired).
STEP_BOUND_S = 60.0


class _TimedEvents(deque):  # type: ignore[type-arg]
    """``TriggerRunner.events`` that counts the events and wakes a waiter when a count is reached."""

    def __init__(self) -> None:
        super().__init__()
        self.last_at = 0.0
        self._target = 0
        self._reached = asyncio.Event()

    def expect(self, count: int) -> asyncio.Event:
        """An event set once ``count`` events arrived in all."""
        self._target = count
        self._reached = asyncio.Event()
        if len(self) >= count:
            self._reached.set()
        return self._reached

    def append(self, entry: Any) -> None:
        super().append(entry)
        self.last_at = time.perf_counter()
        if len(self) >= self._target:
            self._reached.set()


@contextlib.contextmanager
def _sharing(on: bool) -> Iterator[None]:
    """The watches share their stream (``on``), or each runs alone as on Airflow 3.1 and 3.2."""
    from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger

    if on:
        yield
        return
    own = SystemZeroDecisionEventTrigger.shared_stream_key
    SystemZeroDecisionEventTrigger.shared_stream_key = lambda self: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        SystemZeroDecisionEventTrigger.shared_stream_key = own  # type: ignore[method-assign]


def watch_group(channel: str, n: int) -> list[Any]:
    """N asset watches of ``channel``, each with its own confidence bar, rebuilt from their
    serialized kwargs as the triggerer does."""
    from airflow_provider_systemzero.decisions.conditions import DecisionCondition
    from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger

    watches = []
    for index in range(n):
        condition = DecisionCondition("ready", True, min_confidence=0.5 + 0.4 * index / max(1, n - 1))
        trigger = SystemZeroDecisionEventTrigger(
            systemzero_conn_id=CONN_ID,
            request=REQUEST,
            condition=condition.to_dict(),
            state="",
            watch_id=f"{channel}-{index}",
            source=source_spec(channel),
            lease_after=60.0,
        )
        watches.append(SystemZeroDecisionEventTrigger(**trigger.serialize()[1]))
    return watches


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds (bounded)."""
    deadline = time.monotonic() + STEP_BOUND_S
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {STEP_BOUND_S:.0f} s for {what}")
        await asyncio.sleep(0.01)


async def _one(n: int, rounds: int, shared: bool) -> dict[str, Any]:
    """One run: N watches of one source, shared or alone, through ``rounds`` met/unmet changes."""
    channel = f"watchers-{uuid.uuid4().hex[:8]}"
    publish(channel, "waiting\n")
    async with EmulatorProcess(limits=LIMITS, max_concurrent=2 * n + 8) as emulator:
        os.environ.update(emulator.connection_env())
        triggerer = Triggerer()
        events = _TimedEvents()
        triggerer.runner.events = events
        billed: list[int] = []  # the decisions billed once each state was decided for every watch

        async def decided(state: str) -> None:
            """Wait until every watch judged a decision about ``state`` (a watch alone may have had a
            decision superseded, so the bill alone does not tell): the group's, or each its own."""

            async def judged() -> bool:
                if shared:
                    return (await emulator.stats())["decisions_billed"] >= len(billed) + 1
                return all(watch.progress.decided_state == state for watch in watches)

            await _until(judged, f"the decisions about {state!r}")
            billed.append((await emulator.stats())["decisions_billed"])

        try:
            with _sharing(shared):
                watches = watch_group(channel, n)
                for watch in watches:
                    triggerer.start(watch)
                    await asyncio.sleep(0)
                await decided("waiting\n")
            latencies = []
            for step in range(rounds):
                await asyncio.sleep(CHANGE_GAP_S)
                publish(channel, f"step {step}\n")
                await decided(f"step {step}\n")
                reached = events.expect((step + 1) * n)
                await asyncio.sleep(CHANGE_GAP_S)
                met = f"step {step}\n{READY}\n"
                changed = publish(channel, met)
                await asyncio.wait_for(reached.wait(), STEP_BOUND_S)
                latencies.append(events.last_at - changed)
                await decided(met)
            stats = await emulator.stats()
        finally:
            await triggerer.finish()
            forget(channel)
    if stats["streams_total"] > 1 and shared:
        raise RuntimeError(f"{n} watches meant to share a stream opened {stats['streams_total']}")
    return {
        "n": n,
        "shared": shared,
        "rounds": rounds,
        "events": len(events),
        "streams_opened": stats["streams_total"],
        "max_streams_open": stats["max_streams_open"],
        "billed_per_change": (billed[-1] - billed[0]) / (2 * rounds),
        "last_event_latency": summary_ms(latencies),
    }


async def run(options: Options) -> dict[str, Any]:
    """Run the scenario: each N shared and alone."""
    from airflow_provider_systemzero.compat import has_shared_streams

    if not has_shared_streams():
        return {"skipped": "this Airflow has no shared streams (3.3+)", "runs": []}
    rounds = QUICK_ROUNDS if options.quick else ROUNDS
    runs = []
    for n in QUICK_SIZES if options.quick else SIZES:
        for shared in (True, False):
            runs.append(await _one(n, rounds, shared))
    return {"runs": runs}


def section(result: dict[str, Any]) -> list[str]:
    """The results page's table: a row per N and mode.

    :param result: :func:`run`'s result.
    """
    head = [
        "### Many asset watches of one source: one shared stream against one each",
        "",
        "N asset watches of one push source (same connection, model and questions; each its own "
        "confidence bar) through Airflow's trigger runner; the source changes to a state that meets "
        "no condition and back to one that meets all, and every watch fires once per round. "
        "*Shared*: Airflow 3.3's shared stream; *alone*: one stream per watch, as on 3.1 and 3.2 (a "
        "process holds 4 streams at once). Latency: from the change to the last watch's event.",
        "",
    ]
    if result.get("skipped"):
        return [*head, f"Not measured: {result['skipped']}.", ""]
    rows = [
        [
            r["n"],
            "shared" if r["shared"] else "alone",
            r["streams_opened"],
            r["max_streams_open"],
            fmt_num(r["billed_per_change"]),
            fmt_ms(r["last_event_latency"]["p50_ms"]),
            fmt_ms(r["last_event_latency"]["max_ms"]),
            r["rounds"],
        ]
        for r in result["runs"]
    ]
    header = [
        "N",
        "streams",
        "streams opened",
        "most open at once",
        "decisions billed per change",
        "change → last event p50",
        "max",
        "rounds",
    ]
    return [*head, *md_table(header, rows)]


def main() -> None:
    """``python -m benchmarks.watchers [--quick]``: run the scenario and print its result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.watchers")
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(asyncio.run(run(Options(quick=parser.parse_args().quick)))))


if __name__ == "__main__":
    main()
