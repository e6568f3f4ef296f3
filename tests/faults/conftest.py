"""Fixtures of the fault matrix: a spied emulator per case, the connection as an environment
variable, and the reconnect backoff shrunk through its configuration (server delays still apply)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from airflow_provider_systemzero.stream import default_capacity
from tests.helpers import fault_sources as sources
from tests.helpers.faults import (
    CONN_ID,
    KEY,
    LIMITS,
    Harness,
    HarnessFactory,
    ReadyDecider,
    SpiedEmulator,
    spying,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The document's process-wide cap, a small backoff, and fresh sources for every case."""
    default_capacity().set_limit(4)
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_BASE", "0.02")
    monkeypatch.setenv("AIRFLOW__SYSTEMZERO__RECONNECT_BACKOFF_CAP", "0.1")
    sources.STATES.clear()
    yield
    sources.STATES.clear()
    leaked = default_capacity().in_use
    default_capacity().set_limit(4)
    assert leaked == 0, f"{leaked} stream slot(s) of the process-wide cap were never given back"


@pytest.fixture
async def make_harness(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[HarnessFactory]:
    """``await make_harness(limits=..., **emulator_kwargs)``: a started, spied emulator with the
    connection pointing at it (stopped after the case)."""
    started: list[SpiedEmulator] = []
    with spying(monkeypatch) as streams:

        async def make(**kwargs: Any) -> Harness:
            kwargs.setdefault("limits", LIMITS)
            kwargs.setdefault("api_keys", {KEY: 8})
            kwargs.setdefault("decider", ReadyDecider())
            emu = SpiedEmulator(**kwargs)
            await emu.start()
            started.append(emu)
            monkeypatch.setenv(
                f"AIRFLOW_CONN_{CONN_ID.upper()}",
                json.dumps({"conn_type": "systemzero", "host": emu.origin, "password": KEY}),
            )
            return Harness(emu, streams)

        yield make
        for emu in started:
            await emu.stop(retry_after_ms=0)
