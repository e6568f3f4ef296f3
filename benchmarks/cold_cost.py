"""CPU of one cold change: the provider's trigger beside websockets alone, and the emulator's share.

A change is *cold* when its trigger is dormant: the trigger opens a stream (TCP, the upgrade,
``hello``), replays its state in ``start``, takes the decision and, quiet again, gives the stream
back after ``lease_after``. In the crowd (scenario 1's N = 1,000 at 66 changes/s) every change is
cold, so this cost times the change rate is the CPU behind which the crowd's slowest changes
queue. Three figures, in one process and an emulator process of its own (``--only cold``):

* **provider** — changes to dormant ``SystemZeroDecisionTrigger`` s run by Airflow's
  ``TriggerRunner`` (a progress line: not decisive, so the trigger stays), one at a time: the
  process's CPU from the change until the trigger is dormant again, less the harness's own
  polling (each poll's cost is measured alone and subtracted);
* **the hook's stream alone** — ``SystemZeroHook.stream()`` without a trigger: entered about a
  new state, its first decision taken, closed (the stream's share of the provider's figure);
  its exchanges are as far apart as the trigger's changes (:data:`LEASE_AFTER`), as are
  websockets', so each finds the process idle, as a crowd's changes do;
* **websockets alone** — the same exchange with websockets' client and nothing else: connect with
  the same upgrade, read ``hello``, send a ``start`` the provider's core built beforehand, read up
  to the decision, close. What any Python client on ``websockets`` pays per cold change here;
* **emulator** — the stand-in gateway's CPU per change, in both (its own counter).

CPU time moves 10–15 % between runs on a virtual machine; :mod:`benchmarks.instructions` counts
each client's instructions per cold change with valgrind, which does not, and the scenario adds
that count when valgrind is installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.common import Options
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.fixtures import CONN_ID, REQUEST, Feed, decision_trigger
from benchmarks.runner import Triggerer, dormant, rebuild

__all__ = ["measure", "run"]

#: As scenario 1: the account's decision buckets do not pace the changes.
LIMITS = {"account_decision_burst": 100_000, "account_decision_ceiling_per_minute": 10_000_000}

#: Dormant triggers the changes are spread over.
TRIGGERS = 20
#: The harness checks whether the trigger is dormant again this often (seconds).
POLL = 0.005
LEASE_AFTER = 0.02


def _dormant(trigger: Any) -> bool:
    # the trigger's public progress: it gave its stream back and awaits its source
    return dormant(trigger)


async def _poll_until(condition: Any, within: float = 30.0) -> int:
    """Poll ``condition`` every :data:`POLL` s; how many polls it took."""
    deadline = time.monotonic() + within
    polls = 0
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("a cold change did not end within 30 s")
        await asyncio.sleep(POLL)
        polls += 1
    return polls


async def _poll_cost(count: int = 400, seconds: float = POLL) -> float:
    """CPU seconds of one poll of the harness (a sleep of ``seconds``) with nothing else to do."""
    cpu = time.process_time()
    for _ in range(count):
        await asyncio.sleep(seconds)
    return (time.process_time() - cpu) / count


def _spaced(exchange: Callable[[int], Awaitable[int]], gap: float) -> Callable[[int], Awaitable[int]]:
    """``exchange``, then ``gap`` seconds of nothing: as far apart as the trigger's changes are
    (its stream is given back :data:`LEASE_AFTER` after the decision). A process idle between
    changes finds its caches cold, and a crowd's changes come that way: back to back, the same
    exchange costs a third to half less CPU on this kind of machine, which would flatter the
    clients compared with the trigger."""
    if gap <= 0:
        return exchange

    async def spaced(index: int) -> int:
        returned = await exchange(index)
        await asyncio.sleep(gap)
        return returned

    return spaced


class Meter:
    """Marks the measured window (the scenario's own meter does nothing: it reads CPU time; the
    instruction count, :mod:`benchmarks.instructions`, switches callgrind on and off here)."""

    def start(self) -> None:
        """The measured exchanges begin."""

    def stop(self) -> None:
        """They ended."""


async def _counted(
    emulator: Any, exchange: Callable[[int], Awaitable[int]], count: int, meter: Meter | None = None
) -> dict[str, Any]:
    """Run ``exchange`` for :data:`TRIGGERS` indices unmeasured (every lazy import and cache in
    place), then ``count`` more measured: this process's CPU seconds (``cpu_s``), what the
    measured exchanges returned, summed (``returned``), and per exchange the emulator's CPU and
    the streams it opened. ``meter`` hears when the measured exchanges begin and end."""
    meter = meter or Meter()
    for index in range(TRIGGERS):
        await exchange(index)
    before = await emulator.stats()
    meter.start()
    cpu, returned = time.process_time(), 0
    for index in range(TRIGGERS, TRIGGERS + count):
        returned += await exchange(index)
    cpu = time.process_time() - cpu
    meter.stop()
    after = await emulator.stats()
    return {
        "cpu_s": cpu,
        "returned": returned,
        "emulator_cpu_ms": (after["cpu_seconds"] - before["cpu_seconds"]) / count * 1000,
        "streams_opened": after["streams_total"] - before["streams_total"],
    }


def _per_change(counted: dict[str, Any], cpu_s: float, count: int) -> dict[str, Any]:
    """The figures of one client: ``cpu_s`` of client CPU over ``count`` changes, and the emulator's."""
    return {
        "cpu_ms": cpu_s / count * 1000,
        "emulator_cpu_ms": counted["emulator_cpu_ms"],
        "streams_opened": counted["streams_opened"],
    }


def _new_trigger(feed: Feed, tag: str, index: int) -> tuple[str, Any]:
    from airflow_provider_systemzero.identity import task_namespace

    channel = f"cold-cost-{tag}-{index}"
    namespace = task_namespace("bench_cold_cost", "wait", tag, index)
    return channel, rebuild(decision_trigger(namespace, feed.start(channel), lease_after=LEASE_AFTER))


async def _provider(emulator: Any, count: int, meter: Meter | None = None) -> dict[str, Any]:
    feed = Feed("push")
    triggerer = Triggerer()
    tag = f"{time.monotonic_ns():x}"
    try:
        pairs = [_new_trigger(feed, tag, i) for i in range(TRIGGERS)]
        for _, trigger in pairs:
            triggerer.start(trigger)
        for _, trigger in pairs:
            await _poll_until(lambda t=trigger: _dormant(t))

        async def change(index: int) -> int:
            channel, trigger = pairs[index % TRIGGERS]
            feed.publish(channel, f"waiting\nprogress {index}\n")
            polls = await _poll_until(lambda: not _dormant(trigger))
            return polls + await _poll_until(lambda: _dormant(trigger))

        per_poll = await _poll_cost()
        counted = await _counted(emulator, change, count, meter)  # every trigger changes once first
        polls_s = counted["returned"] * per_poll
        return {
            **_per_change(counted, max(0.0, counted["cpu_s"] - polls_s), count),
            "harness_polls_ms": polls_s / count * 1000,
            "harness_polls": counted["returned"],
        }
    finally:
        await triggerer.finish()
        feed.close()


async def _stream_alone(
    emulator: Any, settings: Any, count: int, meter: Meter | None = None, gap: float = 0.0
) -> dict[str, Any]:
    """The hook's :class:`~airflow_provider_systemzero.stream.DecisionStream` without a trigger:
    open it about a new state, take its first decision, close it (``gap`` seconds apart; the CPU
    of that much idling, measured alone, is taken out)."""
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook
    from airflow_provider_systemzero.identity import task_namespace

    hook = SystemZeroHook(systemzero_conn_id=CONN_ID)
    namespace = task_namespace("bench_cold_cost", "stream", f"{time.monotonic_ns():x}", 0)

    async def exchange(index: int) -> int:
        stream = hook.stream(
            REQUEST,
            state=f"waiting\nprogress {index}\n",
            key_namespace=namespace,
            identity=namespace,
            settings=settings,
        )
        async with stream:
            async for _ in stream.decisions():
                break
        return 0

    idle = await _poll_cost(100, gap) if gap > 0 else 0.0
    counted = await _counted(emulator, _spaced(exchange, gap), count, meter)
    return _per_change(counted, max(0.0, counted["cpu_s"] - idle * count), count)


def _start_frames(settings: Any, hello: str, count: int) -> list[str]:
    """``start`` frames for ``count`` new states, each built by the provider's core as a stream would."""
    from airflow_provider_systemzero.identity import task_namespace
    from airflow_provider_systemzero.protocol.client import ClientSession
    from airflow_provider_systemzero.stream.request import build_request

    namespace = task_namespace("bench_cold_cost", "alone", f"{time.monotonic_ns():x}", 0)
    request = build_request(REQUEST, settings, identity=namespace)
    frames = []
    for index in range(count):
        session = ClientSession(  # keyed, as a trigger's states are
            request=request,
            state=f"waiting\nprogress {index}\n",
            decision_mode="on_change",
            key_namespace=namespace,
        )
        now = time.monotonic()
        session.connection_opened(now)
        session.receive_text(hello, now)
        frames.append(session.data_to_send(now)[0])
    return frames


async def _websockets_alone(
    emulator: Any, settings: Any, count: int, meter: Meter | None = None, gap: float = 0.0
) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    from airflow_provider_systemzero.protocol.messages import PROTOCOL
    from airflow_provider_systemzero.protocol.upgrade import request_headers

    options: dict[str, Any] = {
        "additional_headers": request_headers(settings.api_key),
        "subprotocols": [PROTOCOL],
        "compression": None,
        "origin": None,
        "proxy": None,
    }
    async with connect(settings.url, **options) as ws:
        hello = str(await ws.recv())
    frames = _start_frames(settings, hello, count + TRIGGERS)

    async def exchange(index: int) -> int:
        async with connect(settings.url, **options) as ws:
            await ws.recv()  # hello
            await ws.send(frames[index])
            while json.loads(await ws.recv()).get("type") not in ("decision", "error"):
                pass
        return 0

    idle = await _poll_cost(100, gap) if gap > 0 else 0.0
    counted = await _counted(emulator, _spaced(exchange, gap), count, meter)
    return _per_change(counted, max(0.0, counted["cpu_s"] - idle * count), count)


#: The clients, by the name their results carry.
CLIENTS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "provider": lambda emulator, settings, count, meter=None: _provider(emulator, count, meter),
    "stream_alone": _stream_alone,
    "websockets_alone": _websockets_alone,
}


async def measure(emulator: Any, count: int) -> dict[str, Any]:
    """Client and emulator CPU per cold change: through the provider's trigger, the hook's stream
    alone, and websockets alone.

    :param emulator: the running :class:`~benchmarks.emulator_host.EmulatorProcess` (the
        connection's environment variable already set).
    :param count: cold changes measured each way.
    """
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

    settings = await SystemZeroHook(systemzero_conn_id=CONN_ID).aget_settings()
    provider = await _provider(emulator, count)
    # as far apart as the trigger's changes: each exchange finds the process idle, as in a crowd
    stream = await _stream_alone(emulator, settings, count, gap=LEASE_AFTER)
    alone = await _websockets_alone(emulator, settings, count, gap=LEASE_AFTER)
    return {
        "n": count,
        "lease_after_s": LEASE_AFTER,
        "provider": provider,
        "stream_alone": stream,
        "websockets_alone": alone,
        "provider_vs_websockets": provider["cpu_ms"] / alone["cpu_ms"] if alone["cpu_ms"] else None,
        "spaced": True,  # the clients' exchanges are LEASE_AFTER apart, as the trigger's changes
    }


async def run(options: Options) -> dict[str, Any]:
    """Run the measurement against an emulator process of its own and return its results; with
    valgrind installed (and not in the smoke run), each client's instructions per cold change too
    (:mod:`benchmarks.instructions`)."""
    from benchmarks import instructions

    async with EmulatorProcess(limits=LIMITS, max_concurrent=16) as emulator:
        os.environ.update(emulator.connection_env())
        result = await measure(emulator, 60 if options.quick else 300)
    if not options.quick and instructions.available():
        result["instructions"] = await instructions.count()
    return result
