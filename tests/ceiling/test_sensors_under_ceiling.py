"""The ceiling's refusals as a user meets them: a dozen decision triggers with their defaults
(on_change, no ``decide_when``, ``lease_after`` 0.5 s) on a dozen files in one process, each file
gaining an initial line, a "still working" line 2 s later and "Job is ready." 3 s after that, in
real time, against a gateway at the published account limits (5 starts at once, 60 a minute; its
``hello`` does not advertise them, as the public document's example does not). One process alone
on its account: no start is refused, no stream is closed with 1013, and every trigger fires on its
decisive line (the budget allows all twelve within about 11 s of the first line; the bound below
only keeps a failing run from hanging)."""

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
#: Seconds after the first line by which every trigger must have fired (the budget allows about
#: 11 s; refused starts left the last ones firing 50 s and more after their decisive line).
BOUND = 45.0
#: Each file's lines: (seconds after the first; text).
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
    async with Emulator(api_keys={"demo": 16}, decider=f"rules:{rules}") as emu:
        assert emu.limits == Limits(), "the published limits"
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
                    lease_after=0.5,
                )
            )
            for i, path in enumerate(paths)
        ]
        async with contextlib.AsyncExitStack() as stack:
            events = [await stack.enter_async_context(running_trigger(t)) for t in triggers]
            start = asyncio.get_running_loop().time()
            for at, text in STEPS:
                await asyncio.sleep(max(0.0, start + at - asyncio.get_running_loop().time()))
                for path in paths:
                    with path.open("a") as handle:
                        handle.write(f"{text}\n")
            _, pending = await asyncio.wait(events, timeout=BOUND)
            assert not pending, (
                f"{len(pending)} of {SENSORS} triggers fired no event within {BOUND:.0f} s of the last "
                f"line (the published budget allows all within about 11 s): {emu.stats}"
            )
            payloads = [e.result().payload for e in events]
        assert all(p["status"] == "success" for p in payloads), payloads
        stats = emu.stats
        assert stats.decision_starts_refused == 0, f"{stats.decision_starts_refused} starts refused"
        assert stats.closes_by_code.get(1013, 0) == 0
        assert stats.decisions_billed >= SENSORS
