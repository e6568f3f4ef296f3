"""Scenario 3 — billed decisions: the trigger against a poking sensor, and what restarts add.

Two logs grow for 10 minutes of simulated time until a ``READY`` line (time runs
:data:`SCALE` times faster; the trigger's ``lease_after`` is scaled the same way, so it gives
its stream back between lines as it would in real time):

* **busy** — a line every 10 s, ``READY`` at 10:00 (61 distinct states);
* **quiet** — three lines at 2:10, 4:50 and 7:50, ``READY`` at 10:00 (5 distinct states).

The trigger (``decision_mode="on_change"``, the sensor's default) runs through Airflow's
``TriggerRunner.run_trigger`` on a push source that replays the log. The poke baseline calls the
hook's sync ``decide()`` at each poke, with the state as of that moment, the way
``SystemZeroDecisionSensor.poke`` does (per-state idempotency keys from the task's namespace:
*keyed*), and the way a sensor without idempotency keys would (*naive*: every poke a new key).
Pokes come at ``poke_interval / 2, 3·poke_interval / 2, …`` (the mean phase) until one sees
``READY``. Billing is read from the emulator's ledger per key namespace.

Decision filters, on the busy log (the trigger otherwise as above; ``debounce_ms`` is given in
simulated time and scaled like ``lease_after``): ``decide_when`` matching the ``READY`` line, with and
without the initial decision, and ``debounce_ms`` alone, shorter and longer than the gap between
lines. Each row reports what was billed and how long after the ``READY`` line the event fired
(simulated seconds; the run without a filter is the reference). Target: ``decide_when`` bills at most
1/20 of the 30 s poke's decisions.

Restarts, each in the busy log half way (5:00) right after that state's decision: a **triggerer
restart** (the trigger task is cancelled, as at a triggerer shutdown, and a trigger rebuilt from
``serialize()`` takes over), an **emulator restart** (goodbye ``shutdown``, close 1012, the client
reconnects and replays), and **two triggerers** running the same trigger at once (HA). The
simulated clock stands still during a restart, so the run sees the same states as the one
without. "Added" is billed decisions minus those of the uninterrupted run.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.common import Options
from benchmarks.emulator_host import EmulatorProcess
from benchmarks.fixtures import CONDITION, CONN_ID, READY, REQUEST, decision_trigger, publish, source_spec
from benchmarks.runner import Triggerer, rebuild

__all__ = ["run"]

LIMITS = {"account_decision_burst": 100_000, "account_decision_ceiling_per_minute": 10_000_000}
#: Simulated seconds per real second.
SCALE = 40.0
#: The trigger's default ``lease_after`` in simulated seconds.
LEASE_AFTER_SIMULATED = 5.0
POKE_INTERVALS = (30.0, 60.0)
#: ``(label, case, trigger kwargs)`` of the decision-filter rows (``debounce_ms`` in simulated ms).
FILTERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("when", "decide_when = ^READY$", {"decide_when": f"^{READY}$"}),
    (
        "when-no-initial",
        "decide_when = ^READY$, decide_initial = False",
        {"decide_when": f"^{READY}$", "decide_initial": False},
    ),
    ("debounce-5s", "debounce_ms = 5 s (lines 10 s apart)", {"debounce_ms": 5_000}),
    ("debounce-30s", "debounce_ms = 30 s (lines 10 s apart)", {"debounce_ms": 30_000}),
)
#: The ``decide_when`` target: billed at most this share of the 30 s poke's decisions.
DECIDE_WHEN_SHARE = 1 / 20


def _log(kind: str, minutes: float) -> list[tuple[float, str]]:
    """``(simulated second, full state)`` of a log: the initial state first, ``READY`` last."""
    end = minutes * 60
    if kind == "busy":
        times = [10.0 * k for k in range(1, int(end // 10))]
    else:
        times = [t * minutes / 10 for t in (130.0, 290.0, 470.0)]
    states = [(0.0, "starting\n")]
    text = "starting\n"
    for index, at in enumerate(times, start=1):
        text += f"step {index} done at {at:.0f} s\n"
        states.append((at, text))
    states.append((end, text + f"{READY}\n"))
    return states


def _state_at(log: list[tuple[float, str]], at: float) -> str:
    current = log[0][1]
    for moment, state in log:
        if moment <= at:
            current = state
    return current


def _decided(trigger: Any, state: str, since: float = -math.inf) -> bool:
    """Whether the trigger's newest current decision is about ``state`` (and, with ``since``, came
    after that loop time, or the trigger holds no stream: nothing is owed), from its public
    progress."""
    progress = trigger.progress
    if not progress.running or progress.decided_state != state:
        return False
    return progress.decided_at > since or progress.dormant


async def _until(condition: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("billing scenario: condition not met in time")
        await asyncio.sleep(0.002)


async def _trigger_run(
    triggerer: Triggerer,
    log: list[tuple[float, str]],
    namespace: str,
    *,
    copies: int = 1,
    restart: Callable[[list[Any], list[int], str], Awaitable[None]] | None = None,
    knobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Replay ``log`` in scaled time to ``copies`` identical triggers; returns what they saw.

    :param knobs: decision-filter kwargs of the trigger (``debounce_ms`` in simulated time).
    """

    channel = f"billing-{namespace}"
    publish(channel, log[0][1])
    original = decision_trigger(
        namespace,
        source_spec(channel),
        lease_after=LEASE_AFTER_SIMULATED / SCALE,
        **_scaled(knobs or {}),
    )
    triggers = [rebuild(original) for _ in range(copies)]
    ids = [triggerer.start(t) for t in triggers]
    loop = asyncio.get_running_loop()
    start = loop.time()
    paused = 0.0
    restarted = False
    current = log[0][1]
    restart_at = log[-1][0] / 2  # half way through, right after that state's decision
    for moment, state in log[1:]:
        if restart is not None and not restarted and moment > restart_at:
            await _until(lambda settled=current: all(_decided(t, settled) for t in triggers))
            began = loop.time()
            await restart(triggers, ids, current)
            paused += loop.time() - began
            restarted = True
        delay = start + paused + moment / SCALE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        published = publish(channel, state)
        current = state
    async with asyncio.timeout(60):
        await asyncio.gather(*(triggerer.task(i) for i in ids))
    payloads = [triggerer.payload(i) or {} for i in ids]
    if any(p.get("status") != "success" for p in payloads):
        raise RuntimeError(f"billing run {namespace}: {payloads}")
    fired = triggerer.fired_at(ids[0])
    return {
        "states": len(log),
        "events": len(payloads),
        # the READY line (published last) → the event, in simulated seconds
        "decided_after_s": None if fired is None else (fired - published) * SCALE,
    }


def _scaled(knobs: dict[str, Any]) -> dict[str, Any]:
    """The trigger kwargs of ``knobs`` with ``debounce_ms`` turned from simulated into real time."""
    if "debounce_ms" in knobs:
        return {**knobs, "debounce_ms": max(1, round(knobs["debounce_ms"] / SCALE))}
    return knobs


def _pokes(log: list[tuple[float, str]], interval: float, namespace: str, *, keyed: bool) -> dict[str, Any]:
    """A poking sensor in simulated time: one sync ``decide()`` per poke until ``READY``."""
    from airflow_provider_systemzero.decisions.conditions import DecisionCondition
    from airflow_provider_systemzero.hooks.systemzero import SystemZeroHook

    condition = DecisionCondition.from_dict(CONDITION)
    hook = SystemZeroHook(systemzero_conn_id=CONN_ID)
    namespaces = []
    at = interval / 2
    while True:
        space = namespace if keyed else f"{namespace}-{len(namespaces)}"
        namespaces.append(space)
        decision = hook.decide(REQUEST, state=_state_at(log, at), key_namespace=space, identity=namespace)
        if condition.evaluate(decision).met:
            return {
                "pokes": len(namespaces),
                "detected_after_s": at - log[-1][0],
                "namespaces": sorted(set(namespaces)),
            }
        at += interval


async def _billed(emulator: EmulatorProcess, namespaces: list[str]) -> dict[str, int]:
    ledger = await emulator.call("ledger", namespaces=namespaces)
    return {
        field: sum(entry[field] for entry in ledger.values())
        for field in ("billed", "replayed", "distinct_billed", "billed_twice")
    }


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 3 and return its results."""
    minutes = 2.0 if options.quick else 10.0
    logs = {"busy": _log("busy", minutes), "quiet": _log("quiet", minutes)}
    tag = uuid.uuid4().hex[:8]

    def ns(label: str) -> str:
        return f"bench-billing-{tag}-{label}"

    async with EmulatorProcess(limits=LIMITS, max_concurrent=64) as emulator:
        os.environ.update(emulator.connection_env())
        triggerer = Triggerer()
        #: the streams the emulator restart closed (0: the trigger was dormant then, holding none)
        restarted = {"streams": 0}

        async def triggerer_restart(triggers: list[Any], ids: list[int], state: str) -> None:
            await triggerer.cancel(ids[0])
            triggers[0] = rebuild(triggers[0])
            ids[0] = triggerer.start(triggers[0])
            await _until(lambda: _decided(triggers[0], state))

        async def emulator_restart(triggers: list[Any], ids: list[int], state: str) -> None:
            # every open stream gets goodbye and close 1012, reconnects and replays; then the
            # trigger's decision is about the state again (a dormant trigger lost nothing)
            began = asyncio.get_running_loop().time()
            before = (await emulator.stats())["closes_by_code"].get("1012", 0)
            await emulator.call("restart", retry_after_ms=200)
            restarted["streams"] = (await emulator.stats())["closes_by_code"].get("1012", 0) - before
            await _until(lambda: _decided(triggers[0], state, since=began))

        started = time.perf_counter()
        # everything but the emulator restart shares the emulator at once (namespaces keep them apart)
        outcomes = await asyncio.gather(
            _trigger_run(triggerer, logs["busy"], ns("busy")),
            _trigger_run(triggerer, logs["quiet"], ns("quiet")),
            _trigger_run(triggerer, logs["busy"], ns("busy-triggerer-restart"), restart=triggerer_restart),
            _trigger_run(triggerer, logs["busy"], ns("busy-ha"), copies=2),
        )
        # the filters run on their own, so they do not load the runs above (a loaded on_change run
        # coalesces changes and bills less, which would show as restarts "adding" decisions)
        filtered = await asyncio.gather(
            *(_trigger_run(triggerer, logs["busy"], ns(label), knobs=knobs) for label, _, knobs in FILTERS)
        )
        decided_after = {"busy": outcomes[0]["decided_after_s"]}
        decided_after.update(
            {
                label: outcome["decided_after_s"]
                for (label, _, _), outcome in zip(FILTERS, filtered, strict=True)
            }
        )
        # an emulator restart reaches every open stream: this one runs alone
        await _trigger_run(triggerer, logs["busy"], ns("busy-emulator-restart"), restart=emulator_restart)
        wall = time.perf_counter() - started

        trigger_rows = []
        for label, log_kind, case in (
            ("busy", "busy", "uninterrupted"),
            ("quiet", "quiet", "uninterrupted"),
            ("busy-triggerer-restart", "busy", "triggerer restart half way"),
            ("busy-emulator-restart", "busy", "emulator restart half way"),
            ("busy-ha", "busy", "two triggerers at once (HA)"),
        ):
            row = {
                "log": log_kind,
                "case": case,
                "distinct_states": len(logs[log_kind]),
                **await _billed(emulator, [ns(label)]),
            }
            trigger_rows.append(row)
        reference = {r["log"]: r["billed"] for r in trigger_rows if r["case"] == "uninterrupted"}
        for row in trigger_rows:
            row["added"] = row["billed"] - reference[row["log"]]

        poke_rows = []
        for log_kind, log in logs.items():
            for interval in POKE_INTERVALS:
                for keyed in (True, False):
                    label = f"poke-{log_kind}-{interval:.0f}-{'keyed' if keyed else 'naive'}"
                    outcome = await asyncio.to_thread(_pokes, log, interval, ns(label), keyed=keyed)
                    billing = await _billed(emulator, [ns(label)] if keyed else outcome["namespaces"])
                    poke_rows.append(
                        {
                            "log": log_kind,
                            "poke_interval_s": interval,
                            "keyed": keyed,
                            "pokes": outcome["pokes"],
                            "detected_after_s": outcome["detected_after_s"],
                            **billing,
                        }
                    )
        filter_rows = [
            {
                "log": "busy",
                "case": "no filter (on_change)",
                "knobs": {},
                "billed": reference["busy"],
                "decided_after_s": decided_after["busy"],
            }
        ]
        for label, case, knobs in FILTERS:
            billing = await _billed(emulator, [ns(label)])
            filter_rows.append(
                {
                    "log": "busy",
                    "case": case,
                    "knobs": knobs,
                    "billed": billing["billed"],
                    "decided_after_s": decided_after[label],
                }
            )
        poke_30 = next(
            r["billed"]
            for r in poke_rows
            if r["log"] == "busy" and r["poke_interval_s"] == 30.0 and r["keyed"]
        )
        # the target: decide_when on the decisive line, the initial decision turned off (the log
        # starts with nothing decisive); the row with the initial decision is reported beside it
        best_when = min(r["billed"] for r in filter_rows if "decide_when" in r["knobs"])
        with_initial = next(r["billed"] for r in filter_rows if r["knobs"] == FILTERS[0][2])
        stats = await emulator.stats()
    return {
        "filters": filter_rows,
        "decide_when_target": {
            "billed": best_when,
            "billed_with_initial": with_initial,
            "poke_30s_billed": poke_30,
            "share": DECIDE_WHEN_SHARE,
            "met": best_when <= poke_30 * DECIDE_WHEN_SHARE,
        },
        "simulated_minutes": minutes,
        "scale": SCALE,
        "lease_after_simulated_s": LEASE_AFTER_SIMULATED,
        "trigger": trigger_rows,
        "poke": poke_rows,
        "restart_added": {
            row["case"]: row["added"] for row in trigger_rows if row["case"] != "uninterrupted"
        },
        "met": all(row["added"] == 0 and row["billed_twice"] == 0 for row in trigger_rows),
        "emulator_restart_closed_streams": restarted["streams"],
        "wall_s": wall,
        "decide_failures": stats["decide_failures"],
    }
