"""The reproduction of the ceiling's refusals, as a user runs it: a dozen decision triggers with
their defaults (on_change, no ``decide_when``) on a dozen files in one process, each file gaining
an initial line, a "still working" line and "Job is ready." — time twice as fast, with the
account's ceiling twice as high (advertised in ``hello``, as the emulator does when the limits
are not the published ones). One process alone on its account: no start is refused, no stream is
closed with 1013, and every trigger fires on its decisive line."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from airflow_provider_systemzero.emulator.server import Emulator
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.protocol.limits import Limits
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionTrigger
from tests.helpers import TRIGGER_CONN_ID, running_trigger, trigger_kwargs

SENSORS = 12
#: Time runs this much faster: the ceiling, the lines' times and lease_after are scaled.
FACTOR = 2
#: Each file's lines: (seconds after the first, real time; text).
STEPS = ((0.0, "starting the job"), (2.0, "still working"), (5.0, "Job is ready."))
RULES = {
    "rules": [{"question": "ready", "pattern": r"Job is ready\.\n$", "answer": True, "probability": 0.95}],
    "default": {"answer": False, "probability": 0.2, "confidence": 0.8},
}


async def test_a_dozen_sensors_in_one_process_are_never_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    limits = Limits(account_decision_burst=5, account_decision_ceiling_per_minute=60 * FACTOR)
    async with Emulator(api_keys={"demo": 16}, decider=f"rules:{rules}", limits=limits) as emu:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{TRIGGER_CONN_ID.upper()}",
            json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": "demo"}),
        )
        paths = [tmp_path / f"job{i}.log" for i in range(SENSORS)]
        for path in paths:
            path.write_text("")
        triggers = [
            SystemZeroDecisionTrigger(
                **trigger_kwargs(
                    key_namespace=task_namespace("d", "wait", "r", i),
                    source={"type": "file", "path": str(path)},
                    lease_after=0.5 / FACTOR,
                )
            )
            for i, path in enumerate(paths)
        ]
        async with contextlib.AsyncExitStack() as stack:
            events = [await stack.enter_async_context(running_trigger(t)) for t in triggers]
            start = asyncio.get_running_loop().time()
            for at, text in STEPS:
                await asyncio.sleep(max(0.0, start + at / FACTOR - asyncio.get_running_loop().time()))
                for path in paths:
                    with path.open("a") as handle:
                        handle.write(f"{text}\n")
            payloads = [(await asyncio.wait_for(e, 60)).payload for e in events]
        assert all(p["status"] == "success" for p in payloads), payloads
        stats = emu.stats
        assert stats.decision_starts_refused == 0, f"{stats.decision_starts_refused} starts refused"
        assert stats.closes_by_code.get(1013, 0) == 0
        assert stats.decisions_billed >= SENSORS
